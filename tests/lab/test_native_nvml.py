"""The lab's native pieces, exercised the way the fleet tooling meets them.

lab/native/nvml.c is built into tmp dirs and loaded by the *real* pynvml (nvidia-ml-py) in a subprocess
(LD_LIBRARY_PATH=<build dir>, GPULAB_STATE_DIR=<state dir>); lab/hostfiles/nvidia-smi runs against the same
library; the uname preload is checked with LD_PRELOAD.  Every test runs in a child process so a hanging or
crashing library can never take pytest down with it.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NVIDIA_SMI = REPO / "lab" / "hostfiles" / "nvidia-smi"
LIB_VERSION = "535.183.01"
UPGRADED_VERSION = "535.216.01"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build lab/native")
needs_pynvml = pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py (pynvml) is not installed"
)


def _load_build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lab_native_build", REPO / "lab" / "native" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build_module()


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Both driver versions the lab packages, built once for this module."""
    return {
        version: build.build_native(tmp_path_factory.mktemp(f"native-{version}"), version)
        for version in (LIB_VERSION, UPGRADED_VERSION)
    }


@pytest.fixture
def lib_dir(libs: dict[str, dict[str, Path]]) -> Path:
    return libs[LIB_VERSION]["nvml"].parent


class State:
    """A GPULAB_STATE_DIR: the loaded module's version plus the hw/gpus key=value file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "hw").mkdir(parents=True)
        self.module(LIB_VERSION)
        self.hw()

    def module(self, version: str | None) -> None:
        path = self.root / "module"
        if version is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(version + "\n")

    def hw(self, text: str = "gpu_count=2\n") -> None:
        tmp = self.root / "hw" / ".gpus.tmp"
        tmp.write_text(textwrap.dedent(text))
        tmp.replace(self.root / "hw" / "gpus")


@pytest.fixture
def state(tmp_path: Path) -> State:
    return State(tmp_path / "state")


def _env(lib: Path, state: State, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(LD_LIBRARY_PATH=str(lib), GPULAB_STATE_DIR=str(state.root), LC_ALL="C", **extra)
    return env


def run_py(code: str, lib: Path, state: State, timeout: float = 30) -> Any:
    """Run `code` with the real pynvml against the built library; it must print one JSON document."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_env(lib, state),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def smi(lib: Path, state: State, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(NVIDIA_SMI), *args],
        env=_env(lib, state),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


HEALTHY = """\
# two GPUs, every key the lab writes, deliberately off the defaults
gpu_count=2
gpu.0.name=NVIDIA A100 80GB PCIe
gpu.0.uuid=GPU-11111111-2222-3333-4444-555555555555
gpu.0.serial=1321021034001
gpu.0.pci_bus_id=00000001:00:00.0
gpu.0.memory_total=85899345920
gpu.0.memory_used=0
gpu.0.temperature=41
gpu.0.temp_shutdown=90
gpu.0.temp_slowdown=87
gpu.0.temp_mem_max=94
gpu.0.temp_gpu_max=83
gpu.0.clocks_event_reasons=0x0000000000000001
gpu.0.persistence_mode=1
gpu.1.name=NVIDIA A100 80GB PCIe
gpu.1.uuid=GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee
gpu.1.serial=1321021034002
gpu.1.pci_bus_id=00000002:00:00.0
gpu.1.pci_device_id=0x20B510DE
gpu.1.pci_subsystem_id=0x153310DE
gpu.1.memory_total=85899345920
gpu.1.memory_reserved=691011584
gpu.1.memory_used=3221225472
gpu.1.temperature=79
gpu.1.power_mw=251234
gpu.1.power_limit_mw=300000
gpu.1.util_gpu=97
gpu.1.util_memory=61
gpu.1.clock_graphics=1275
gpu.1.clock_sm=1275
gpu.1.clock_mem=1512
gpu.1.max_clock_graphics=1410
gpu.1.max_clock_sm=1410
gpu.1.max_clock_mem=1512
gpu.1.clocks_event_reasons=0x48
gpu.1.ecc_mode=1
gpu.1.ecc_volatile_corrected=7
gpu.1.ecc_volatile_uncorrected=2
gpu.1.ecc_aggregate_corrected=11
gpu.1.ecc_aggregate_uncorrected=3
gpu.1.retired_sbe=2
gpu.1.retired_dbe=1
gpu.1.retired_pending=1
gpu.1.remapped_correctable=5
gpu.1.remapped_uncorrectable=1
gpu.1.remap_pending=1
gpu.1.remap_failure=0
gpu.1.persistence_mode=0
gpu.1.pstate=2
gpu.1.procs=4242:2147483648:python3 train.py --lr 3e-4;4343:1073741824:/opt/conda/bin/python
"""


@needs_pynvml
def test_healthy_state_reads_back_through_real_pynvml(lib_dir: Path, state: State) -> None:
    state.hw(HEALTHY)
    out = run_py(
        """
        import json, pynvml as n
        n.nvmlInit()
        r = {"driver": n.nvmlSystemGetDriverVersion(), "nvml": n.nvmlSystemGetNVMLVersion(),
             "cuda": n.nvmlSystemGetCudaDriverVersion(), "cuda2": n.nvmlSystemGetCudaDriverVersion_v2(),
             "count": n.nvmlDeviceGetCount(), "gpus": []}
        T = n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, \\
            n.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, n.NVML_TEMPERATURE_THRESHOLD_GPU_MAX
        for i in range(r["count"]):
            h = n.nvmlDeviceGetHandleByIndex(i)
            pci = n.nvmlDeviceGetPciInfo(h)
            m1 = n.nvmlDeviceGetMemoryInfo(h)
            m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            g = {
                "index": n.nvmlDeviceGetIndex(h), "minor": n.nvmlDeviceGetMinorNumber(h),
                "name": n.nvmlDeviceGetName(h), "uuid": n.nvmlDeviceGetUUID(h), "serial": n.nvmlDeviceGetSerial(h),
                "busId": pci.busId, "busIdLegacy": pci.busIdLegacy, "domain": pci.domain,
                "pciDeviceId": pci.pciDeviceId, "pciSubSystemId": pci.pciSubSystemId,
                "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(h))),
                "by_bus": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(pci.busId)),
                "mem_v1": [m1.total, m1.used, m1.free],
                "mem_v2": [m2.total, m2.reserved, m2.used, m2.free],
                "temp": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                "thresholds": [n.nvmlDeviceGetTemperatureThreshold(h, t) for t in T],
                "power": n.nvmlDeviceGetPowerUsage(h), "limit": n.nvmlDeviceGetEnforcedPowerLimit(h),
                "mgmt_limit": n.nvmlDeviceGetPowerManagementLimit(h),
                "util": [n.nvmlDeviceGetUtilizationRates(h).gpu, n.nvmlDeviceGetUtilizationRates(h).memory],
                "clocks": [n.nvmlDeviceGetClockInfo(h, c) for c in (n.NVML_CLOCK_GRAPHICS, n.NVML_CLOCK_SM,
                                                                    n.NVML_CLOCK_MEM)],
                "max_clocks": [n.nvmlDeviceGetMaxClockInfo(h, c) for c in (n.NVML_CLOCK_GRAPHICS,
                                                                       n.NVML_CLOCK_SM, n.NVML_CLOCK_MEM)],
                "events": n.nvmlDeviceGetCurrentClocksEventReasons(h),
                "throttle": n.nvmlDeviceGetCurrentClocksThrottleReasons(h),
                "ecc_mode": n.nvmlDeviceGetEccMode(h),
                "ecc": [n.nvmlDeviceGetTotalEccErrors(h, e, c)
                        for e in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
                        for c in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC)],
                "retired_sbe": len(n.nvmlDeviceGetRetiredPages(h, 0)),
                "retired_dbe_v2": n.nvmlDeviceGetRetiredPages_v2(h, 1),
                "retired_pending": n.nvmlDeviceGetRetiredPagesPendingStatus(h),
                "remapped": list(n.nvmlDeviceGetRemappedRows(h)),
                "persistence": n.nvmlDeviceGetPersistenceMode(h),
                "pstate": n.nvmlDeviceGetPerformanceState(h),
                "procs": [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                          for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
                "procs_v2": [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses_v2(h)],
                "proc_names": [n.nvmlSystemGetProcessName(p.pid) for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
                "graphics": len(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
            }
            try:
                n.nvmlDeviceGetFanSpeed(h)
                g["fan"] = "supported?"
            except n.NVMLError_NotSupported:
                g["fan"] = "NotSupported"
            r["gpus"].append(g)
        n.nvmlShutdown()
        print(json.dumps(r))
        """,
        lib_dir,
        state,
    )
    assert out["driver"] == LIB_VERSION
    assert out["nvml"] == "12." + LIB_VERSION
    assert out["cuda"] == out["cuda2"] == 12020
    assert out["count"] == 2
    g0, g1 = out["gpus"]

    assert [g0["index"], g0["minor"], g1["index"], g1["minor"]] == [0, 0, 1, 1]
    assert g0["name"] == g1["name"] == "NVIDIA A100 80GB PCIe"
    assert g0["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert g1["uuid"] == "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert [g0["serial"], g1["serial"]] == ["1321021034001", "1321021034002"]
    assert [g0["busId"], g0["busIdLegacy"], g0["domain"]] == ["00000001:00:00.0", "0001:00:00.0", 1]
    assert g1["busId"] == "00000002:00:00.0"
    assert [g1["pciDeviceId"], g1["pciSubSystemId"]] == [0x20B510DE, 0x153310DE]
    assert [g0["by_uuid"], g0["by_bus"], g1["by_uuid"], g1["by_bus"]] == [0, 0, 1, 1]

    # v2: used excludes the reservation; v1: used includes it (the real driver's two meanings)
    total, reserved, used = 85899345920, 691011584, 3221225472
    assert g1["mem_v2"] == [total, reserved, used, total - reserved - used]
    assert g1["mem_v1"] == [total, used + reserved, total - reserved - used]
    assert g0["mem_v2"][2] == 0

    assert [g0["temp"], g1["temp"]] == [41, 79]
    assert g0["thresholds"] == [90, 87, 94, 83]
    assert g1["thresholds"] == [92, 89, 95, 85]  # defaults
    assert [g1["power"], g1["limit"], g1["mgmt_limit"]] == [251234, 300000, 300000]
    assert g1["util"] == [97, 61]
    assert g1["clocks"] == [1275, 1275, 1512]
    assert g1["max_clocks"] == [1410, 1410, 1512]
    assert [g0["events"], g1["events"], g1["throttle"]] == [0x1, 0x48, 0x48]

    assert g1["ecc_mode"] == [1, 1]
    assert g1["ecc"] == [7, 11, 2, 3]
    assert g0["ecc"] == [0, 0, 0, 0]
    assert g1["retired_sbe"] == 2
    assert len(g1["retired_dbe_v2"]) == 1 and set(g1["retired_dbe_v2"][0]) == {"address", "timestamp"}
    assert [g0["retired_pending"], g1["retired_pending"]] == [0, 1]
    assert g1["remapped"] == [5, 1, 1, 0]
    assert g0["remapped"] == [0, 0, 0, 0]

    assert [g0["persistence"], g1["persistence"]] == [1, 0]
    assert [g0["pstate"], g1["pstate"]] == [0, 2]
    assert g0["procs"] == [] and g0["graphics"] == 0
    not_mig = 0xFFFFFFFF
    assert g1["procs"] == [[4242, 2147483648, not_mig, not_mig], [4343, 1073741824, not_mig, not_mig]]
    assert g1["procs_v2"] == [[4242, 2147483648], [4343, 1073741824]]
    assert g1["proc_names"] == ["python3 train.py --lr 3e-4", "/opt/conda/bin/python"]
    assert g1["graphics"] == 0
    assert g0["fan"] == g1["fan"] == "NotSupported"


def test_buffer_and_argument_semantics_match_nvml(lib_dir: Path, state: State) -> None:
    """What pynvml never exercises: short buffers, short arrays, bad versions, calls before init."""
    state.hw("gpu_count=1\ngpu.0.procs=10:1:a;11:2:b;12:3:c\ngpu.0.retired_sbe=3\n")
    out = run_py(
        """
        import ctypes, json
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        r = {}
        h = ctypes.c_void_p()
        cnt = ctypes.c_uint()
        r["count_before_init"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(cnt))
        r["shutdown_before_init"] = lib.nvmlShutdown()
        r["init"] = lib.nvmlInit_v2()
        r["init_again"] = lib.nvmlInitWithFlags(0)
        r["bad_index"] = lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(h))
        r["handle"] = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
        name = ctypes.create_string_buffer(96)
        needed = len("NVIDIA A100 80GB PCIe") + 1
        r["name_short"] = lib.nvmlDeviceGetName(h, name, needed - 1)
        r["name_exact"] = lib.nvmlDeviceGetName(h, name, needed)
        r["name"] = name.value.decode()
        r["name_null"] = lib.nvmlDeviceGetName(h, None, 96)
        r["bogus_handle"] = lib.nvmlDeviceGetName(ctypes.c_void_p(0x1234), name, 96)
        r["unknown_uuid"] = lib.nvmlDeviceGetHandleByUUID(b"GPU-nope", ctypes.byref(ctypes.c_void_p()))
        r["unknown_bus"] = lib.nvmlDeviceGetHandleByPciBusId_v2(b"0000:AF:00.0", ctypes.byref(ctypes.c_void_p()))

        class P(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                        ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
        n = ctypes.c_uint(0)
        r["procs_query"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), None), n.value]
        n.value = 1
        arr = (P * 8)()
        r["procs_short"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), arr), n.value]
        n.value = 8
        r["procs_ok"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), arr), n.value,
                         [arr[i].pid for i in range(n.value)], arr[3].pid]
        n.value = 5
        r["procs_null_array"] = lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), None)

        class P1(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong)]
        arr1 = (P1 * 3)()
        n.value = 3
        r["procs_v1"] = [lib.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(n), arr1),
                         [(p.pid, p.used) for p in arr1]]
        n.value = 0
        r["graphics_empty"] = [lib.nvmlDeviceGetGraphicsRunningProcesses_v3(h, ctypes.byref(n), None), n.value]

        pages = (ctypes.c_ulonglong * 8)()
        n.value = 2
        r["pages_short"] = [lib.nvmlDeviceGetRetiredPages(h, 0, ctypes.byref(n), pages), n.value]
        r["pages_bad_cause"] = lib.nvmlDeviceGetRetiredPages(h, 7, ctypes.byref(n), pages)

        class M2(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                        ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
        m = M2(version=0x01000028)
        r["mem_v2_bad_version"] = lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m))
        t = ctypes.c_uint()
        r["temp_bad_sensor"] = lib.nvmlDeviceGetTemperature(h, 5, ctypes.byref(t))
        r["threshold_acoustic"] = lib.nvmlDeviceGetTemperatureThreshold(h, 4, ctypes.byref(t))
        r["threshold_out_of_range"] = lib.nvmlDeviceGetTemperatureThreshold(h, 99, ctypes.byref(t))
        r["clock_bad_type"] = lib.nvmlDeviceGetClockInfo(h, 9, ctypes.byref(t))
        v = ctypes.create_string_buffer(80)
        r["driver_short"] = lib.nvmlSystemGetDriverVersion(v, 5)
        lib.nvmlErrorString.restype = ctypes.c_char_p
        r["strings"] = {c: lib.nvmlErrorString(c).decode() for c in (9, 15, 18)}
        r["shutdowns"] = [lib.nvmlShutdown(), lib.nvmlShutdown(), lib.nvmlShutdown()]
        r["after_shutdown"] = lib.nvmlDeviceGetName(h, name, 96)
        print(json.dumps(r))
        """,
        lib_dir,
        state,
    )
    assert out["count_before_init"] == 1  # NVML_ERROR_UNINITIALIZED
    assert out["shutdown_before_init"] == 1
    assert out["init"] == out["init_again"] == 0
    assert out["bad_index"] == 2  # NVML_ERROR_INVALID_ARGUMENT
    assert out["handle"] == 0
    assert out["name_short"] == 7  # NVML_ERROR_INSUFFICIENT_SIZE
    assert out["name_exact"] == 0 and out["name"] == "NVIDIA A100 80GB PCIe"
    assert out["name_null"] == 2
    assert out["bogus_handle"] == 2
    assert out["unknown_uuid"] == out["unknown_bus"] == 6  # NVML_ERROR_NOT_FOUND
    assert out["procs_query"] == [7, 3]
    assert out["procs_short"] == [7, 3]
    assert out["procs_ok"] == [0, 3, [10, 11, 12], 0]  # nothing written past the 3 entries
    assert out["procs_null_array"] == 2
    assert out["procs_v1"] == [0, [[10, 1], [11, 2], [12, 3]]]  # 16-byte v1 records, packed as NVML packs them
    assert out["graphics_empty"] == [0, 0]
    assert out["pages_short"] == [7, 3]
    assert out["pages_bad_cause"] == 2
    assert out["mem_v2_bad_version"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert out["temp_bad_sensor"] == 2
    assert out["threshold_acoustic"] == 3  # NOT_SUPPORTED on a datacenter board
    assert out["threshold_out_of_range"] == 2
    assert out["clock_bad_type"] == 2
    assert out["driver_short"] == 7
    assert out["strings"] == {"9": "Driver Not Loaded", "15": "GPU is lost", "18": "Driver/library version mismatch"}
    assert out["shutdowns"] == [0, 0, 1]  # refcounted: two inits, two shutdowns, then UNINITIALIZED
    assert out["after_shutdown"] == 1


INIT_ERROR = """
    import json, pynvml as n
    try:
        n.nvmlInit()
        print(json.dumps({"ok": True, "count": n.nvmlDeviceGetCount()}))
    except n.NVMLError as e:
        print(json.dumps({"ok": False, "class": type(e).__name__, "value": e.value}))
"""


@needs_pynvml
def test_missing_module_is_driver_not_loaded(lib_dir: Path, state: State) -> None:
    state.module(None)
    assert run_py(INIT_ERROR, lib_dir, state) == {"ok": False, "class": "NVMLError_DriverNotLoaded", "value": 9}


@needs_pynvml
def test_module_version_differs_from_library_is_lib_rm_version_mismatch(
    libs: dict[str, dict[str, Path]], state: State
) -> None:
    # userspace upgraded to 535.216.01, the 535.183.01 module still loaded: the no-reboot failure
    upgraded = libs[UPGRADED_VERSION]["nvml"].parent
    assert run_py(INIT_ERROR, upgraded, state) == {
        "ok": False,
        "class": "NVMLError_LibRmVersionMismatch",
        "value": 18,
    }
    # after the "reboot" the module matches and the same library initialises
    state.module(UPGRADED_VERSION)
    assert run_py(INIT_ERROR, upgraded, state) == {"ok": True, "count": 2}


@needs_pynvml
def test_state_is_reread_on_every_init(lib_dir: Path, state: State) -> None:
    out = run_py(
        f"""
        import json, os, pynvml as n
        r = []
        n.nvmlInit(); r.append(n.nvmlDeviceGetCount()); n.nvmlShutdown()
        os.unlink({str(state.root / "module")!r})
        try:
            n.nvmlInit(); r.append("init ok")
        except n.NVMLError_DriverNotLoaded:
            r.append("DriverNotLoaded")
        print(json.dumps(r))
        """,
        lib_dir,
        state,
    )
    assert out == [2, "DriverNotLoaded"]


@needs_pynvml
def test_lost_gpu_fails_only_for_its_index_and_existing_handles(lib_dir: Path, state: State) -> None:
    state.hw("gpu_count=3\ngpu.1.lost=1\n")
    out = run_py(
        f"""
        import json, os, pynvml as n
        n.nvmlInit()
        r = {{"count": n.nvmlDeviceGetCount(), "by_index": []}}
        for i in range(r["count"]):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                r["by_index"].append(n.nvmlDeviceGetName(h))
            except n.NVMLError as e:
                r["by_index"].append(type(e).__name__)
        # GPU 2 falls off the bus while we hold a handle to it
        h2 = n.nvmlDeviceGetHandleByIndex(2)
        tmp = {str(state.root / "hw" / "new")!r}
        with open(tmp, "w") as f:
            f.write("gpu_count=3\\ngpu.1.lost=1\\ngpu.2.lost=1\\n")
        os.replace(tmp, {str(state.root / "hw" / "gpus")!r})
        try:
            n.nvmlDeviceGetTemperature(h2, 0); r["held_handle"] = "ok"
        except n.NVMLError as e:
            r["held_handle"] = type(e).__name__
        r["gpu0_still"] = n.nvmlDeviceGetTemperature(n.nvmlDeviceGetHandleByIndex(0), 0)
        print(json.dumps(r))
        """,
        lib_dir,
        state,
    )
    assert out["count"] == 3  # a lost GPU is still enumerated
    assert out["by_index"] == ["NVIDIA A100 80GB PCIe", "NVMLError_GpuIsLost", "NVIDIA A100 80GB PCIe"]
    assert out["held_handle"] == "NVMLError_GpuIsLost"
    assert out["gpu0_still"] == 33


@needs_pynvml
def test_zero_gpus_initialises_with_count_zero(lib_dir: Path, state: State) -> None:
    state.hw("gpu_count=0\n")
    assert run_py(INIT_ERROR, lib_dir, state) == {"ok": True, "count": 0}


@needs_pynvml
def test_garbage_in_state_file_is_tolerated(lib_dir: Path, state: State) -> None:
    state.hw(
        "this line has no equals sign\n"
        "=orphan value\n"
        "gpu_count=999\n"
        "gpu.0.temperature=hot\n"
        "gpu.0.power_mw=-5\n"
        "gpu.99.name=out of range\n"
        "gpu.x.name=not an index\n"
        "gpu.1.procs=;;notanumber:alsonot:;7\n"
        "gpu.2.clocks_event_reasons=0x\n"
        "some.unknown.key=1\n"
        "gpu.3.name=" + "N" * 500 + "\n"
    )
    out = run_py(
        """
        import json, pynvml as n
        n.nvmlInit()
        h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
        print(json.dumps({"count": n.nvmlDeviceGetCount(), "temp": n.nvmlDeviceGetTemperature(h[0], 0),
                          "power": n.nvmlDeviceGetPowerUsage(h[0]),
                          "procs": [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h[1])],
                          "events": n.nvmlDeviceGetCurrentClocksEventReasons(h[2]),
                          "long_name": len(n.nvmlDeviceGetName(h[3]))}))
        """,
        lib_dir,
        state,
    )
    assert out["count"] == 16  # clamped to the library's maximum
    assert out["temp"] == 0 and out["power"] == 0 and out["events"] == 0
    assert out["procs"] == [[0, 0], [7, 0]]
    assert out["long_name"] == 95  # truncated into the 96-byte NVML name buffer, never overflowed


def _assert_hangs(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        assert proc.poll() is None, "returned although NVML should hang"
    finally:
        proc.kill()
        stdout, _ = proc.communicate(timeout=10)
    assert "returned" not in stdout
    assert stdout.strip() == ""


@needs_pynvml
def test_hang_blocks_nvml_init(lib_dir: Path, state: State) -> None:
    state.hw("hang=1\ngpu_count=2\n")
    code = "import pynvml as n\nn.nvmlInit()\nprint('returned', flush=True)\n"
    _assert_hangs([sys.executable, "-c", code], _env(lib_dir, state))


# ---- nvidia-smi ----------------------------------------------------------------------------------
DRIVER_MSG = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def test_nvidia_smi_driver_not_loaded(lib_dir: Path, state: State) -> None:
    state.module(None)
    proc = smi(lib_dir, state)
    assert (proc.returncode, proc.stdout) == (9, DRIVER_MSG)


def test_nvidia_smi_version_mismatch_names_the_library_version(libs: dict[str, dict[str, Path]], state: State) -> None:
    proc = smi(libs[UPGRADED_VERSION]["nvml"].parent, state)
    assert proc.returncode == 18
    assert proc.stdout == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.216\n"


def test_nvidia_smi_library_missing(tmp_path: Path, state: State) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a system libnvidia-ml is installed; cannot simulate its absence")
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = smi(empty, state)
    assert proc.returncode == 12
    assert proc.stdout == (
        "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
        "Display Driver is properly installed and present in your system.\n"
        "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n"
    )


def test_nvidia_smi_no_devices(lib_dir: Path, state: State) -> None:
    state.hw("gpu_count=0\n")
    for args in ((), ("-L",), ("--query-gpu=name", "--format=csv")):
        proc = smi(lib_dir, state, *args)
        assert (proc.returncode, proc.stdout) == (6, "No devices were found\n"), args


def test_nvidia_smi_lost_gpu(lib_dir: Path, state: State) -> None:
    state.hw("gpu_count=2\ngpu.1.pci_bus_id=00000002:00:00.0\ngpu.1.lost=1\n")
    # nvidia-smi 535 writes "GPU" and the bus id with no space, and two spaces after "lost."
    lost = (
        "Unable to determine the device handle for GPU0002:00:00.0: GPU is lost.  Reboot the system to recover this GPU"
    )
    proc = smi(lib_dir, state)
    assert (proc.returncode, proc.stdout) == (15, lost + "\n")
    proc = smi(lib_dir, state, "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert proc.returncode == 15
    assert proc.stdout.splitlines() == ["0, 00000001:00:00.0", lost]


def test_nvidia_smi_hangs_when_nvml_hangs(lib_dir: Path, state: State) -> None:
    state.hw("hang=1\n")
    _assert_hangs([sys.executable, str(NVIDIA_SMI), "-L"], _env(lib_dir, state))


def test_nvidia_smi_list_and_query(lib_dir: Path, state: State) -> None:
    state.hw(HEALTHY)
    proc = smi(lib_dir, state, "-L")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        "GPU 0: NVIDIA A100 80GB PCIe (UUID: GPU-11111111-2222-3333-4444-555555555555)",
        "GPU 1: NVIDIA A100 80GB PCIe (UUID: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)",
    ]

    fields = (
        "index,name,uuid,pci.bus_id,driver_version,temperature.gpu,utilization.gpu,utilization.memory,"
        "memory.total,memory.used,memory.free,power.draw,power.limit,clocks.sm,clocks.mem,"
        "clocks_throttle_reasons.active,clocks_event_reasons.active,persistence_mode,"
        "ecc.errors.uncorrected.volatile.total,pstate,fan.speed"
    )
    proc = smi(lib_dir, state, f"--query-gpu={fields}", "--format=csv")
    assert proc.returncode == 0, proc.stdout
    header, row0, row1 = proc.stdout.splitlines()
    assert header == (
        "index, name, uuid, pci.bus_id, driver_version, temperature.gpu, utilization.gpu [%], "
        "utilization.memory [%], memory.total [MiB], memory.used [MiB], memory.free [MiB], power.draw [W], "
        "power.limit [W], clocks.current.sm [MHz], clocks.current.memory [MHz], clocks_throttle_reasons.active, "
        "clocks_event_reasons.active, persistence_mode, ecc.errors.uncorrected.volatile.total, pstate, fan.speed [%]"
    )
    assert row1 == (
        "1, NVIDIA A100 80GB PCIe, GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, 00000002:00:00.0, 535.183.01, 79, "
        "97 %, 61 %, 81920 MiB, 3072 MiB, 78189 MiB, 251.23 W, 300.00 W, 1275 MHz, 1512 MHz, "
        "0x0000000000000048, 0x0000000000000048, Disabled, 2, P2, [N/A]"
    )
    assert row0.startswith("0, NVIDIA A100 80GB PCIe, GPU-11111111-2222-3333-4444-555555555555, 00000001:00:00.0, ")

    proc = smi(lib_dir, state, "--query-gpu=memory.used,power.draw,temperature.gpu", "--format=csv,noheader,nounits")
    assert proc.stdout.splitlines() == ["0, 43.12, 41", "3072, 251.23, 79"]

    proc = smi(lib_dir, state, "--query-gpu", "name", "--format=csv,noheader", "-i", "1")
    assert proc.stdout == "NVIDIA A100 80GB PCIe\n"

    proc = smi(lib_dir, state, "--query-compute-apps=pid,process_name,used_memory", "--format=csv")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        "pid, process_name, used_gpu_memory [MiB]",
        "4242, python3 train.py --lr 3e-4, 2048 MiB",
        "4343, /opt/conda/bin/python, 1024 MiB",
    ]


def test_nvidia_smi_summary_table(lib_dir: Path, state: State) -> None:
    state.hw(HEALTHY)
    proc = smi(lib_dir, state)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert "| NVIDIA-SMI 535.183.01             Driver Version: 535.183.01   CUDA Version: 12.2     |" in lines
    assert all(len(line) == 89 for line in lines[1:]), [line for line in lines[1:] if len(line) != 89]
    gpu1 = lines.index(next(line for line in lines if line.startswith("|   1  NVIDIA A100 80GB PCIe")))
    assert lines[gpu1].endswith("Off  | 00000002:00:00.0 Off |                    2 |")
    assert lines[gpu1 + 1] == (
        "| N/A   79C    P2             251W / 300W |   3072MiB / 81920MiB |     97%      Default |"
    )
    procs = [line for line in lines if "   C   " in line]
    assert len(procs) == 2
    assert "4242" in procs[0] and "python3 train.py --lr 3e-4" in procs[0] and procs[0].endswith("2048MiB |")


@pytest.mark.parametrize(
    "args",
    [("--bogus",), ("-q", "--xml-format"), ("--query-gpu=name",), ("--query-gpu=name", "--format=json")],
)
def test_nvidia_smi_rejects_bad_arguments(lib_dir: Path, state: State, args: tuple[str, ...]) -> None:
    proc = smi(lib_dir, state, *args)
    assert proc.returncode == 2
    assert proc.stdout == "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def test_nvidia_smi_unknown_query_field(lib_dir: Path, state: State) -> None:
    proc = smi(lib_dir, state, "--query-gpu=name,warp.speed", "--format=csv")
    assert proc.returncode == 2
    assert proc.stdout == 'Field "warp.speed" is not a valid field to query.\n'


def test_nvidia_smi_loop_repeats_rows_not_header(lib_dir: Path, state: State) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(NVIDIA_SMI), "--query-gpu=index", "--format=csv", "-l", "1"],
        env=_env(lib_dir, state),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2.5)
    finally:
        proc.terminate()
        stdout, _ = proc.communicate(timeout=10)
    lines = stdout.splitlines()
    assert lines[0] == "index"
    assert lines.count("index") == 1
    assert lines.count("0") >= 2 and lines.count("1") >= 2


# ---- uname preload -------------------------------------------------------------------------------
def _preload_env(libs: dict[str, dict[str, Path]], state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=str(libs[LIB_VERSION]["uname_preload"]), GPULAB_STATE_DIR=str(state_dir))
    return env


UNAME_PY = "import os, platform; print(os.uname().release); print(platform.release()); print(os.uname().version)"


def test_uname_preload_reports_the_simulated_kernel(libs: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    (tmp_path / "kernel").write_text("6.5.0-45-generic\n")
    env = _preload_env(libs, tmp_path)
    assert subprocess.run(["uname", "-r"], env=env, capture_output=True, text=True, check=True).stdout == (
        "6.5.0-45-generic\n"
    )
    version = subprocess.run(["uname", "-v"], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("#45~22.04.1-Ubuntu SMP PREEMPT_DYNAMIC ")
    assert len(version) == 64  # cut where the kernel cuts UTS_VERSION
    out = subprocess.run([sys.executable, "-c", UNAME_PY], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[:2] == ["6.5.0-45-generic", "6.5.0-45-generic"]

    # an explicit version line wins
    (tmp_path / "kernel").write_text("5.15.0-113-generic\n#123-Ubuntu SMP Mon Jun 10 08:16:17 UTC 2024\n")
    out = subprocess.run([sys.executable, "-c", UNAME_PY], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "5.15.0-113-generic",
        "5.15.0-113-generic",
        "#123-Ubuntu SMP Mon Jun 10 08:16:17 UTC 2024",
    ]


def test_uname_preload_passes_through_without_state(libs: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    real = os.uname()
    env = _preload_env(libs, tmp_path)  # no kernel file
    out = subprocess.run([sys.executable, "-c", UNAME_PY], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [real.release, real.release, real.version]
    (tmp_path / "kernel").write_text("\n")  # empty: passthrough, not an empty release
    out = subprocess.run(["uname", "-r"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == real.release


# ---- build ---------------------------------------------------------------------------------------
def test_build_names_the_missing_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "gcc-that-does-not-exist")
    with pytest.raises(build.NativeBuildError, match="gcc-that-does-not-exist"):
        build.build_native(tmp_path, LIB_VERSION)
    assert not list(tmp_path.iterdir())


def test_build_rejects_a_malformed_driver_version(tmp_path: Path) -> None:
    with pytest.raises(build.NativeBuildError, match="driver version"):
        build.build_native(tmp_path, '535"; rm -rf /')


def test_built_library_has_the_nvml_soname_and_only_libc(libs: dict[str, dict[str, Path]]) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    dyn = subprocess.run(
        ["readelf", "-d", str(libs[LIB_VERSION]["nvml"])], capture_output=True, text=True, check=True
    ).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
    assert needed == ["libc.so.6"]
    assert "Library soname: [libnvidia-ml.so.1]" in dyn
