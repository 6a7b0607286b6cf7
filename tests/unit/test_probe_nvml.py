"""The real probe and the real pynvml against NVML: this controller's (no GPU: library_not_found) and the lab's
file-driven libnvidia-ml.so.1 (lab/native), one state per test: healthy, driver not loaded, version mismatch,
lost GPU, NVML hang."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

try:  # shared helper; importable as a package module or (pytest prepend mode) by file name
    from tests.unit.test_probe_host import run_probe
except ImportError:  # pragma: no cover
    from test_probe_host import run_probe  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
DRIVER = "535.183.01"

needs_gcc = pytest.mark.skipif(
    shutil.which(os.environ.get("CC") or "gcc") is None, reason="no C compiler for lab/native"
)


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build_py = REPO / "lab" / "native" / "build.py"
    if not build_py.exists():
        pytest.skip("lab/native/build.py not present")
    sys.path.insert(0, str(build_py.parent))
    try:
        from build import build_native  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("native")
    build_native(out, DRIVER)
    return out


def _state(tmp_path: Path, module: str | None, gpus: str = "") -> Path:
    state = tmp_path / "state"
    (state / "hw").mkdir(parents=True)
    if module is not None:
        (state / "module").write_text(module + "\n")
    (state / "hw" / "gpus").write_text(gpus)
    return state


def _probe(lib: Path, state: Path, *args: str, timeout: float = 60) -> dict[str, Any]:
    env = {"LD_LIBRARY_PATH": str(lib), "GPULAB_STATE_DIR": str(state)}
    return run_probe("--root", str(state / "noroot"), *args, env=env, timeout=timeout)


def test_no_gpu_on_this_controller_is_library_not_found() -> None:
    if any(Path(d, "libnvidia-ml.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")):
        pytest.skip("this machine has a real libnvidia-ml")
    doc = run_probe("--root", "/nonexistent")
    nvml = doc["nvml"]
    assert nvml["ok"] is False
    assert nvml["error_class"] == "library_not_found"
    assert nvml["error_code"] == 12
    assert nvml["child_reaped"] is True
    assert doc["errors"] == []


@needs_gcc
def test_healthy_two_gpus(nvml_lib: Path, tmp_path: Path) -> None:
    gpus = (
        "gpu_count=2\n"
        "gpu.0.temperature=86\ngpu.0.clocks_event_reasons=0x48\ngpu.0.util_gpu=97\n"
        "gpu.1.procs=4242:1073741824:python3\ngpu.1.persistence_mode=0\ngpu.1.remap_pending=1\n"
        "gpu.1.remapped_uncorrectable=3\ngpu.1.ecc_volatile_uncorrected=2\n"
    )
    doc = _probe(nvml_lib, _state(tmp_path, DRIVER, gpus))
    nvml = doc["nvml"]
    assert nvml["ok"] is True and nvml["error_class"] == "none"
    assert nvml["driver_version"] == DRIVER and nvml["cuda_driver_version"] == 12020
    assert nvml["device_count"] == 2
    g0, g1 = nvml["gpus"]
    assert g0["temperature_c"] == 86
    assert g0["temperature_thresholds_c"] == {"shutdown": 92, "slowdown": 89, "gpu_max": 85, "mem_max": 95}
    assert g0["clocks_event_reasons"] == {"mask": 0x48, "active": ["hw_slowdown", "hw_thermal_slowdown"]}
    assert g0["utilization"] == {"gpu": 97, "memory": 0}
    assert g0["memory"]["total"] == 85899345920
    assert g0["pci_bus_id"] == "00000001:00:00.0" and g0["name"] == "NVIDIA A100 80GB PCIe"
    assert g0["power_w"] == 43.1 and g0["power_limit_w"] == 300.0
    assert (
        g1["processes"] == [{"pid": 4242, "used_memory": 1073741824, "name": None}] or g1["processes"][0]["pid"] == 4242
    )
    assert g1["persistence_mode"] is False
    assert g1["remapped_rows"] == {"correctable": 0, "uncorrectable": 3, "pending": True, "failure": False}
    assert g1["ecc"]["volatile"]["uncorrected"] == 2
    assert g0["field_errors"] == {}


@needs_gcc
def test_not_supported_fields_are_null(nvml_lib: Path, tmp_path: Path) -> None:
    gpus = "gpu.0.ecc_mode=0\ngpu.0.page_retirement_supported=0\n"
    gpu = _probe(nvml_lib, _state(tmp_path, DRIVER, gpus))["nvml"]["gpus"][0]
    assert gpu["retired_pages"] is None
    assert gpu["ecc"]["volatile"] == {"corrected": None, "uncorrected": None}
    assert gpu["field_errors"] == {}


@needs_gcc
def test_driver_not_loaded(nvml_lib: Path, tmp_path: Path) -> None:
    nvml = _probe(nvml_lib, _state(tmp_path, None))["nvml"]
    assert (nvml["ok"], nvml["error_class"], nvml["error_code"]) == (False, "driver_not_loaded", 9)
    assert nvml["error"] == "Driver Not Loaded"


@needs_gcc
def test_version_mismatch(nvml_lib: Path, tmp_path: Path) -> None:
    nvml = _probe(nvml_lib, _state(tmp_path, "535.161.07"))["nvml"]
    assert (nvml["ok"], nvml["error_class"], nvml["error_code"]) == (False, "version_mismatch", 18)


@needs_gcc
def test_lost_gpu_others_still_reported(nvml_lib: Path, tmp_path: Path) -> None:
    nvml = _probe(nvml_lib, _state(tmp_path, DRIVER, "gpu_count=4\ngpu.2.lost=1\n"))["nvml"]
    assert nvml["ok"] is False and nvml["error_class"] == "gpu_lost"
    assert [(g["index"], g["ok"], g["error_class"]) for g in nvml["gpus"]] == [
        (0, True, "none"),
        (1, True, "none"),
        (2, False, "gpu_lost"),
        (3, True, "none"),
    ]
    assert nvml["gpus"][3]["temperature_c"] == 33


@needs_gcc
def test_no_devices(nvml_lib: Path, tmp_path: Path) -> None:
    nvml = _probe(nvml_lib, _state(tmp_path, DRIVER, "gpu_count=0\n"))["nvml"]
    assert (nvml["ok"], nvml["error_class"], nvml["device_count"]) == (False, "no_devices", 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


@needs_gcc
def test_hang_is_killed_and_reaped(nvml_lib: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    doc = _probe(nvml_lib, _state(tmp_path, DRIVER, "hang=1\n"), "--nvml-timeout", "2", timeout=30)
    elapsed = time.monotonic() - started
    nvml = doc["nvml"]
    assert nvml["ok"] is False and nvml["error_class"] == "timeout"
    assert elapsed < 2 + 2, elapsed
    assert nvml["child_reaped"] is True
    assert not _alive(nvml["child_pid"])
    assert doc["packages"] is not None and doc["errors"] == []


@needs_gcc
def test_hang_with_the_controller_pynvml_in_process(nvml_lib: Path, tmp_path: Path) -> None:
    """collect() called in-process (the Ansible wrapper's way) also returns, and leaves no child behind."""
    state = _state(tmp_path, DRIVER, "hang=1\n")
    code = (
        "import json,sys; sys.path.insert(0, 'remediation/hostside'); import gpuprobe;"
        "d = gpuprobe.collect({'nvml_timeout': 1, 'root': '/nonexistent'}); print(json.dumps(d['nvml']))"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib), "GPULAB_STATE_DIR": str(state)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=20, check=True
    )
    import json

    nvml = json.loads(proc.stdout)
    assert nvml["error_class"] == "timeout" and not _alive(nvml["child_pid"])
