"""NVML, in a forked child that is SIGKILLed and reaped when it outlives its timeout."""

import contextlib
import json
import os
import select
import time

from .common import REAP_GRACE_S, _kill_group, _proc_comm

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: F401 - type comments

ERROR_CLASSES = (
    "none",
    "driver_not_loaded",
    "version_mismatch",
    "no_devices",
    "library_not_found",
    "gpu_lost",
    "handle_unknown_error",
    "timeout",
    "other",
)


class _SourceLoader(object):
    """Serves one module from its source text, in memory: a finder and loader by protocol (find_spec,
    create_module, exec_module), as importlib.abc would define them."""

    def __init__(self, name, source):
        self.name, self.source = name, source

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        if fullname != self.name:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin="<%s from the controller>" % fullname)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__file__ = "<%s from the controller>" % module.__name__
        # The controller's own pynvml.py (the gpu_facts action plugin sent it), as the SSH bundle runs its copy.
        exec(compile(self.source, module.__name__ + ".py", "exec", dont_inherit=True), module.__dict__)  # noqa: S102


def serve_pynvml(packed):
    # type: (Optional[str]) -> bool
    """Where the host has no ``pynvml`` of its own, make ``import pynvml`` load the controller's copy
    (``packed``: its text, zlib-compressed and base64-encoded, as :func:`remediation.hostside.pynvml_packed`
    packs it) from memory; nothing is written on the host. Returns whether the copy is now what ``import pynvml``
    loads (False when the host has its own, which wins, or nothing was sent)."""
    import binascii
    import importlib.util
    import sys
    import zlib

    if not packed or importlib.util.find_spec("pynvml") is not None:
        return False
    source = zlib.decompress(binascii.a2b_base64(packed)).decode("utf-8")
    sys.meta_path.append(_SourceLoader("pynvml", source))
    return True


# NVML return codes (nvml.h); duplicated so the parent never imports pynvml.
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_DRIVER_NOT_LOADED = 9
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
_NVML_ERROR_UNKNOWN = 999

_CODE_TO_CLASS = {
    _NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
    _NVML_ERROR_LIB_RM_VERSION_MISMATCH: "version_mismatch",
    _NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
    _NVML_ERROR_GPU_IS_LOST: "gpu_lost",
}


CLOCK_EVENT_REASONS = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clock_setting"),
)


def _nvml_error_class(code):
    # type: (Optional[int]) -> str
    if code is None:
        return "other"
    return _CODE_TO_CLASS.get(code, "other")


def _as_str(value):
    # type: (Any) -> Any
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


class _GpuLost(Exception):
    pass


def _collect_nvml_in_child():
    # type: () -> Dict[str, Any]
    """Everything NVML; runs in the child process.  Never raises."""
    result = {
        "ok": False,
        "error_class": "other",
        "error": None,
        "error_code": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "device_count": None,
        "gpus": [],
    }  # type: Dict[str, Any]
    try:
        import pynvml  # imported in the child only: the parent never loads libnvidia-ml
    except Exception as exc:  # pragma: no cover - exercised by the bundle tests
        result["error"] = "python module pynvml is not importable: %s" % exc
        return result
    NVMLError = pynvml.NVMLError

    try:
        pynvml.nvmlInit()
    except NVMLError as exc:
        code = getattr(exc, "value", None)
        result["error_code"] = code
        result["error"] = str(exc)
        result["error_class"] = _nvml_error_class(code)
        return result
    except Exception as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
        return result

    try:
        for key, fn in (
            ("driver_version", pynvml.nvmlSystemGetDriverVersion),
            ("nvml_version", pynvml.nvmlSystemGetNVMLVersion),
            ("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion),
        ):
            try:
                result[key] = _as_str(fn())
            except NVMLError:
                result[key] = None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except NVMLError as exc:
            code = getattr(exc, "value", None)
            result["error_code"] = code
            result["error"] = str(exc)
            result["error_class"] = _nvml_error_class(code)
            return result
        result["device_count"] = count
        gpus = [_collect_gpu(pynvml, index) for index in range(count)]
        result["gpus"] = gpus
        if count == 0:
            result["error_class"] = "no_devices"
            result["error"] = "No devices were found"
            return result
        bad = [g for g in gpus if not g.get("ok")]
        if bad:
            first = bad[0]
            result["error_class"] = first.get("error_class") or "other"
            result["error"] = "GPU %s: %s" % (first.get("index"), first.get("error"))
            result["error_code"] = first.get("error_code")
            return result
        result["ok"] = True
        result["error_class"] = "none"
        return result
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _collect_gpu(pynvml, index):
    # type: (Any, int) -> Dict[str, Any]
    NVMLError = pynvml.NVMLError
    gpu = {"index": index, "ok": True, "error_class": "none", "error": None, "error_code": None}  # type: Dict[str, Any]
    field_errors = {}  # type: Dict[str, str]

    def lost(exc):
        # type: (Any) -> Dict[str, Any]
        code = getattr(exc, "value", None)
        gpu.update({"ok": False, "error_class": "gpu_lost", "error": str(exc), "error_code": code})
        return gpu

    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except NVMLError as exc:
        code = getattr(exc, "value", None)
        if code == _NVML_ERROR_GPU_IS_LOST:
            return lost(exc)
        error_class = "handle_unknown_error" if code == _NVML_ERROR_UNKNOWN else _nvml_error_class(code)
        gpu.update({"ok": False, "error_class": error_class, "error": str(exc), "error_code": code})
        return gpu

    def field(name, fn, *args):
        # type: (str, Callable[..., Any], Any) -> Any
        try:
            return fn(*args)
        except NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == _NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(exc) from exc
            if code != _NVML_ERROR_NOT_SUPPORTED:
                field_errors[name] = str(exc)
            return None

    try:
        gpu["name"] = _as_str(field("name", pynvml.nvmlDeviceGetName, handle))
        gpu["uuid"] = _as_str(field("uuid", pynvml.nvmlDeviceGetUUID, handle))
        pci = field("pci_bus_id", pynvml.nvmlDeviceGetPciInfo, handle)
        gpu["pci_bus_id"] = _as_str(getattr(pci, "busId", None)) if pci is not None else None
        gpu["serial"] = _as_str(field("serial", pynvml.nvmlDeviceGetSerial, handle))

        mem = field("memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
        gpu["memory"] = (
            {"total": int(mem.total), "used": int(mem.used), "free": int(mem.free)} if mem is not None else None
        )
        gpu["temperature_c"] = field(
            "temperature_c", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
        )
        thresholds = {}
        for key, const in (
            ("shutdown", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
            ("slowdown", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
            ("gpu_max", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
            ("mem_max", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
        ):
            thresholds[key] = field(
                "temperature_thresholds_c." + key,
                pynvml.nvmlDeviceGetTemperatureThreshold,
                handle,
                getattr(pynvml, const),
            )
        gpu["temperature_thresholds_c"] = thresholds

        power = field("power_w", pynvml.nvmlDeviceGetPowerUsage, handle)
        gpu["power_w"] = round(power / 1000.0, 1) if power is not None else None
        limit = field("power_limit_w", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        gpu["power_limit_w"] = round(limit / 1000.0, 1) if limit is not None else None

        util = field("utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
        gpu["utilization"] = {"gpu": int(util.gpu), "memory": int(util.memory)} if util is not None else None

        clocks = {}
        max_clocks = {}
        for key, const in (("graphics", "NVML_CLOCK_GRAPHICS"), ("sm", "NVML_CLOCK_SM"), ("memory", "NVML_CLOCK_MEM")):
            clocks[key] = field("clocks_mhz." + key, pynvml.nvmlDeviceGetClockInfo, handle, getattr(pynvml, const))
            max_clocks[key] = field(
                "max_clocks_mhz." + key, pynvml.nvmlDeviceGetMaxClockInfo, handle, getattr(pynvml, const)
            )
        gpu["clocks_mhz"] = clocks
        gpu["max_clocks_mhz"] = max_clocks

        gpu["clocks_event_reasons"] = _clock_event_reasons(pynvml, handle, field)
        gpu["ecc"] = _ecc(pynvml, handle, field)
        gpu["retired_pages"] = _retired_pages(pynvml, handle, field)

        remap = field("remapped_rows", pynvml.nvmlDeviceGetRemappedRows, handle)
        gpu["remapped_rows"] = (
            {
                "correctable": int(remap[0]),
                "uncorrectable": int(remap[1]),
                "pending": bool(remap[2]),
                "failure": bool(remap[3]),
            }
            if remap is not None
            else None
        )
        persistence = field("persistence_mode", pynvml.nvmlDeviceGetPersistenceMode, handle)
        gpu["persistence_mode"] = bool(persistence) if persistence is not None else None
        gpu["pstate"] = field("pstate", pynvml.nvmlDeviceGetPerformanceState, handle)
        gpu["processes"] = _processes(pynvml, handle, field)
    except _GpuLost as exc:
        lost(exc.args[0])
    gpu["field_errors"] = field_errors
    return gpu


def _clock_event_reasons(pynvml, handle, field):
    # type: (Any, Any, Callable[..., Any]) -> Optional[Dict[str, Any]]
    getter = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    mask = None
    if getter is not None:
        try:
            mask = getter(handle)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) == _NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(exc) from exc
            mask = None
    if mask is None:  # older drivers: the deprecated name of the same call
        mask = field("clocks_event_reasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    if mask is None:
        return None
    return {"mask": int(mask), "active": [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]}


def _ecc(pynvml, handle, field):
    # type: (Any, Any, Callable[..., Any]) -> Optional[Dict[str, Any]]
    mode = field("ecc.mode", pynvml.nvmlDeviceGetEccMode, handle)
    counters = {}
    for scope, counter in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC")):
        values = {}
        for key, kind in (
            ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ):
            values[key] = field(
                "ecc.%s.%s" % (scope, key),
                pynvml.nvmlDeviceGetTotalEccErrors,
                handle,
                getattr(pynvml, kind),
                getattr(pynvml, counter),
            )
        counters[scope] = values
    if mode is None and all(v is None for scope in counters.values() for v in scope.values()):
        return None
    return {
        "mode": bool(mode[0]) if mode is not None else None,
        "mode_pending": bool(mode[1]) if mode is not None else None,
        "volatile": counters["volatile"],
        "aggregate": counters["aggregate"],
    }


def _retired_pages(pynvml, handle, field):
    # type: (Any, Any, Callable[..., Any]) -> Optional[Dict[str, Any]]
    single = field(
        "retired_pages.single_bit",
        pynvml.nvmlDeviceGetRetiredPages,
        handle,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    double = field(
        "retired_pages.double_bit",
        pynvml.nvmlDeviceGetRetiredPages,
        handle,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    pending = field("retired_pages.pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if single is None and double is None and pending is None:
        return None
    return {
        "single_bit": len(single) if single is not None else None,
        "double_bit": len(double) if double is not None else None,
        "pending": bool(pending) if pending is not None else None,
    }


def _processes(pynvml, handle, field):
    # type: (Any, Any, Callable[..., Any]) -> Optional[List[Dict[str, Any]]]
    procs = None
    for name in (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ):
        getter = getattr(pynvml, name, None)
        if getter is None:
            continue
        try:
            procs = getter(handle)
            break
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == _NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(exc) from exc
            if code == _NVML_ERROR_FUNCTION_NOT_FOUND:
                continue
            return field("processes", getter, handle)  # records the error (or None for NOT_SUPPORTED)
        except Exception:  # noqa: S112 - pynvml's version-mismatch wrapper raises a non-NVMLError: try the next
            continue
    if procs is None:
        return None
    out = []
    for proc in procs:
        pid = int(proc.pid)
        used = getattr(proc, "usedGpuMemory", None)
        out.append({"pid": pid, "used_memory": int(used) if used is not None else None, "name": _proc_comm(pid)})
    return out


def collect_nvml(timeout):
    # type: (float) -> Dict[str, Any]
    """Fork a child that talks to NVML; SIGKILL and reap it when it outlives ``timeout``."""
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read_fd)
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # nothing the NVML library prints may reach the JSON on stdout
            try:
                payload = _collect_nvml_in_child()
            except BaseException as exc:  # the child must always answer
                payload = {"ok": False, "error_class": "other", "error": "probe child crashed: %r" % (exc,)}
            data = json.dumps(payload).encode("utf-8")
            view = memoryview(data)
            while view:
                written = os.write(write_fd, view)
                view = view[written:]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    # parent
    os.close(write_fd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    chunks = []  # type: List[bytes]
    timed_out = False
    deadline = started + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)

    reaped, status = _reap(pid, kill=timed_out)
    elapsed_ms = int((time.monotonic() - started) * 1000)
    meta = {"child_pid": pid, "child_reaped": reaped, "elapsed_ms": elapsed_ms}
    if timed_out:
        result = _empty_nvml("timeout", "NVML did not answer within %.1f s; probe child killed" % timeout)
        result.update(meta)
        return result
    try:
        result = json.loads(b"".join(chunks).decode("utf-8"))
    except ValueError:
        result = _empty_nvml("other", "probe child exited (status %s) without a result" % (status,))
    result.update(meta)
    return result


def _reap(pid, kill):
    # type: (int, bool) -> Tuple[bool, Optional[int]]
    if kill:
        _kill_group(pid)
    grace_end = time.monotonic() + (REAP_GRACE_S if kill else max(REAP_GRACE_S, 5.0))
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True, None
        if done:
            return True, status
        if time.monotonic() >= grace_end:
            if not kill:  # the child sent its answer but lingers: kill it too
                _kill_group(pid)
                kill = True
                grace_end = time.monotonic() + REAP_GRACE_S
                continue
            # In uninterruptible sleep inside the driver: it dies when the call returns.  Report it.
            return False, None
        time.sleep(0.02)


def _empty_nvml(error_class, error):
    # type: (str, str) -> Dict[str, Any]
    return {
        "ok": False,
        "error_class": error_class,
        "error": error,
        "error_code": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "device_count": None,
        "gpus": [],
    }
