#!/usr/bin/env python3
"""GPU host probe: collect the facts the controller's checks need, print ONE JSON document.

Runs ON the GPU host with the Python standard library (Python >= 3.8) plus ``pynvml`` (PyPI
``nvidia-ml-py``), which the controller's bundle supplies when the host lacks it.  The file is
self-contained on purpose: it travels over one SSH round trip and is also imported by an Ansible
module wrapper through :func:`collect`.

Contract:
- stdout carries exactly one JSON document (schema ``gpufleet.facts/1``, see docs/facts-schema.md);
  with ``--json-out PATH`` and/or ``--prom-out PATH`` (the timer's mode) stdout stays empty and the document
  and/or a Prometheus textfile computed from it (:func:`render_prometheus`) are written atomically, mode
  0644; a file that cannot be written makes the exit status 1;
- the exit status is 0 whenever that document was written, NVML failures included (failures are data);
- it never hangs: NVML runs in a forked child that is SIGKILLed and reaped after ``--nvml-timeout``,
  and every external command runs with a timeout;
- every section is collected on its own; an exception in one becomes an entry in ``errors``.

Keep this file Python 3.8 compatible: no ``from __future__ import annotations``, no PEP 604/585
annotations, no ``match``.
"""

import argparse
import calendar
import contextlib
import datetime
import errno
import fcntl
import gzip
import json
import lzma
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple  # noqa: F401 - type comments

SCHEMA = "gpufleet.facts/1"
PROBE_VERSION = "1.0.0"

DEFAULT_NVML_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 10.0
DKMS_TIMEOUT_S = 20.0
SIMULATE_TIMEOUT_S = 180.0
KERNEL_LOG_MAX_LINES = 500
KERNEL_LOG_HEAD_LINES = 100  # when capping, keep the first lines since boot and the newest ones
APT_HISTORY_MAX_BYTES = 2 * 1024 * 1024
KERN_LOG_TAIL_BYTES = 8 * 1024 * 1024
MODULE_SCAN_MAX_BYTES = 512 * 1024 * 1024
ZSTD_TIMEOUT_S = 30.0  # decompressing one .ko.zst (an nvidia.ko is ~100 MB; zstd does several hundred MB/s)
MODULE_WALK_MAX_ENTRIES = 50000
MODULE_WALK_MAX_DEPTH = 8
REAP_GRACE_S = 2.0

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

# NVIDIA lines, plus the kernel's own words when it refuses an unsigned module (Secure Boot lockdown: the
# ``Lockdown: systemd-modules-load: ...`` line at boot names no module).
KERNEL_LOG_PATTERN = re.compile(
    r"NVRM|nvidia|Xid|modprobe|fallen off the bus|Lockdown:|Key was rejected by service|Required key not available"
    r"|module verification failed",
    re.IGNORECASE,
)
# Stanzas worth sending: kernel image/headers/modules (versioned or meta) and NVIDIA/CUDA driver packages.
# linux-libc-dev, linux-perf, linux-firmware alone do not qualify.
KERNEL_FAMILY = (
    r"image|headers|modules|generic|virtual|lowlatency|azure|aws|gcp|oracle|kvm|oem|hwe|cloud|signed|"
    r"unsigned|raspi|ibm|nvidia|amd64|arm64"
)
HISTORY_PATTERN = re.compile(r"(?<![\w.+-])linux-(?:%s)|nvidia|cuda-drivers" % KERNEL_FAMILY, re.IGNORECASE)
KERNEL_META_RE = re.compile(r"^linux-(?:%s)" % KERNEL_FAMILY)

# A versioned kernel package: linux-image-6.5.0-45-generic, linux-image-unsigned-6.5.0-45-generic,
# linux-image-6.1.0-18-cloud-amd64 (Debian), linux-image-6.8.0-1015-azure.
KERNEL_IMAGE_RE = re.compile(r"^linux-image-(?:unsigned-)?(?P<release>\d+\.\d+[^\s]*)$")
# Any package whose name carries a kernel ABI version (6.5.0-45, 6.1.0-18, 5.15.0-1064).
VERSIONED_KERNEL_PKG_RE = re.compile(r"-\d+\.\d+(?:\.\d+)?-\d+")
KERNEL_NON_META = frozenset(
    (
        "linux-base",
        "linux-firmware",
        "linux-libc-dev",
        "linux-doc",
        "linux-sound-base",
        "linux-tools-common",
        "linux-cloud-tools-common",
        "linux-source",
        "linux-compiler-gcc-12-x86",
    )
)
KERNEL_NON_META_PREFIXES = ("linux-tools-", "linux-cloud-tools-", "linux-source-", "linux-doc-", "linux-kbuild-")
NVIDIA_PACKAGE_RE = re.compile(r"^(nvidia-|libnvidia-|cuda-drivers)")
# A driver branch as Ubuntu's package names carry it: 535, 535-server, 535-open, 535-server-open.
_BRANCH = r"(?P<branch>\d+(?:-server)?(?:-open)?)"
DRIVER_PACKAGE_RE = re.compile(r"^nvidia-driver(?:-" + _BRANCH + r"|-open|-server|-server-open)?$")
# Without nvidia-driver-<branch> (ubuntu-drivers --gpgpu installs the headless packages): packages that name the
# whole branch, -open included ...
BRANCH_PACKAGE_RE = re.compile(r"^nvidia-(?:headless-no-dkms|headless|dkms|kernel-source)-" + _BRANCH + r"$")
# ... then the userspace, which Ubuntu's -open packages share with the proprietary branch (no -open here).
USERSPACE_PACKAGE_RE = re.compile(
    r"^(?:libnvidia-compute|nvidia-utils|nvidia-kernel-common|libnvidia-gl)-(?P<branch>\d+(?:-server)?)$"
)


# --------------------------------------------------------------------------------------------------
# Options


class Options(object):
    """Probe options.  ``root`` prefixes every host file path (testing against a sample tree)."""

    def __init__(
        self,
        nvml_timeout=DEFAULT_NVML_TIMEOUT_S,  # type: float
        simulate_upgrades=False,  # type: bool
        root="/",  # type: str
        kernel_release=None,  # type: Optional[str]
        skip_nvml=False,  # type: bool
        command_timeout=COMMAND_TIMEOUT_S,  # type: float
    ):
        # type: (...) -> None
        self.nvml_timeout = float(nvml_timeout)
        self.simulate_upgrades = bool(simulate_upgrades)
        self.root = root or "/"
        self.kernel_release = kernel_release
        self.skip_nvml = bool(skip_nvml)
        self.command_timeout = float(command_timeout)

    @classmethod
    def from_mapping(cls, values):
        # type: (Optional[Dict[str, Any]]) -> Options
        values = dict(values or {})
        known = ("nvml_timeout", "simulate_upgrades", "root", "kernel_release", "skip_nvml", "command_timeout")
        unknown = sorted(k for k in values if k not in known)
        if unknown:
            raise ValueError("unknown probe option(s): %s" % ", ".join(unknown))
        return cls(**{k: v for k, v in values.items() if v is not None})

    def path(self, *parts):
        # type: (str) -> str
        joined = os.path.join(*parts)
        if self.root in ("", "/"):
            return joined
        return os.path.join(self.root, joined.lstrip("/"))


# --------------------------------------------------------------------------------------------------
# Small helpers


def _utc_iso(ts):
    # type: (float) -> str
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_text(path, limit=None):
    # type: (str, Optional[int]) -> str
    with open(path, "rb") as handle:
        data = handle.read() if limit is None else handle.read(limit)
    return data.decode("utf-8", "replace")


def _read_text_or_none(path):
    # type: (str) -> Optional[str]
    try:
        return _read_text(path)
    except (IOError, OSError):
        return None


def run_command(argv, timeout):
    # type: (List[str], float) -> Dict[str, Any]
    """Run a command with a timeout; the result is data: {rc, stdout, stderr, error}."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except (IOError, OSError) as exc:
        return {"rc": None, "stdout": "", "stderr": "", "error": "%s: %s" % (argv[0], exc)}
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        return {
            "rc": None,
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
            "error": "%s timed out after %.0f s" % (argv[0], timeout),
        }
    return {
        "rc": proc.returncode,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
        "error": None,
    }


def _kill_group(pid):
    # type: (int) -> None
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _which(name, extra_dirs=("/usr/sbin", "/sbin", "/usr/bin", "/bin")):
    # type: (str, Iterable[str]) -> Optional[str]
    dirs = os.environ.get("PATH", "").split(os.pathsep) + list(extra_dirs)
    for directory in dirs:
        candidate = os.path.join(directory, name)
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def upstream_version(version):
    # type: (Optional[str]) -> Optional[str]
    """Debian version -> upstream part: '535.183.01-0ubuntu0.22.04.1' -> '535.183.01'."""
    if not version:
        return None
    if ":" in version:
        version = version.split(":", 1)[1]
    if "-" in version:
        version = version.rsplit("-", 1)[0]
    return version


# --------------------------------------------------------------------------------------------------
# NVML (in a forked child)


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


def _proc_comm(pid):
    # type: (int) -> Optional[str]
    text = _read_text_or_none("/proc/%d/comm" % pid)
    return text.strip() if text is not None else None


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


# --------------------------------------------------------------------------------------------------
# system


def collect_system(options):
    # type: (Options) -> Dict[str, Any]
    release = options.kernel_release or os.uname().release
    boot_id = _read_text_or_none("/proc/sys/kernel/random/boot_id")
    boot_time = None
    stat = _read_text_or_none("/proc/stat")
    if stat:
        match = re.search(r"^btime\s+(\d+)", stat, re.MULTILINE)
        if match:
            boot_time = _utc_iso(int(match.group(1)))
    os_release = parse_os_release(_read_text_or_none(options.path("/etc/os-release")) or "")
    reboot_required = any(os.path.exists(options.path(p)) for p in ("/run/reboot-required", "/var/run/reboot-required"))
    pkgs = []  # type: List[str]
    for candidate in ("/run/reboot-required.pkgs", "/var/run/reboot-required.pkgs"):
        text = _read_text_or_none(options.path(candidate))
        if text is not None:
            pkgs = [line.strip() for line in text.splitlines() if line.strip()]
            break
    return {
        "kernel": release,
        "kernel_flavour": kernel_flavour(release),
        "boot_id": boot_id.strip() if boot_id else None,
        "boot_time": boot_time,
        "os_release": os_release,
        "reboot_required": reboot_required,
        "reboot_required_pkgs": pkgs,
    }


# A kernel release, uname -r: <version>-<abi>[-<flavour>]. The controller parses releases with this same pattern
# (remediation.core.kernelflavour.parse_release) and takes the flavour with kernel_flavour below.
KERNEL_RELEASE_RE = re.compile(r"^(?P<version>\d+\.\d+(?:\.\d+)?)-(?P<abi>\d+)(?:-(?P<flavour>[a-z][a-z0-9.+-]*))?$")


def kernel_flavour(release):
    # type: (Optional[str]) -> Optional[str]
    """The flavour of a kernel release, as Ubuntu names its meta-packages: ``6.5.0-1025-azure`` -> ``azure``,
    ``6.5.0-45-generic`` -> ``generic``, ``6.1.0-18-cloud-amd64`` -> ``cloud-amd64``; None when there is none."""
    match = KERNEL_RELEASE_RE.match(release or "")
    return match.group("flavour") if match else None


def parse_os_release(text):
    # type: (str) -> Dict[str, Optional[str]]
    values = {}  # type: Dict[str, str]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return {"ID": values.get("ID"), "VERSION_ID": values.get("VERSION_ID"), "PRETTY_NAME": values.get("PRETTY_NAME")}


# --------------------------------------------------------------------------------------------------
# Secure Boot and module signatures

# The EFI global variable GUID (UEFI spec, EFI_GLOBAL_VARIABLE): 4 attribute bytes, then 1 byte, 1 = enabled.
SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# What the kernel appends to a signed module (scripts/sign-file.c, include/linux/module_signature.h).
MODULE_SIGNATURE_MAGIC = b"~Module signature appended~\n"


def parse_secure_boot_efivar(data):
    # type: (bytes) -> Optional[bool]
    """The SecureBoot EFI variable as efivarfs shows it (4 attribute bytes + the value) -> enabled?"""
    if len(data) < 5:
        return None
    value = bytearray(data[4:5])[0]
    if value in (0, 1):
        return value == 1
    return None


_MOKUTIL_RE = re.compile(r"^SecureBoot (enabled|disabled)\s*$", re.MULTILINE)


def parse_mokutil_sb_state(text):
    # type: (str) -> Optional[bool]
    """``mokutil --sb-state`` -> enabled?  (``SecureBoot enabled`` / ``SecureBoot disabled``; "This system doesn't
    support Secure Boot" on a BIOS boot is disabled.)"""
    match = _MOKUTIL_RE.search(text)
    if match:
        return match.group(1) == "enabled"
    if "doesn't support Secure Boot" in text or "EFI variables are not supported" in text:
        return False
    return None


def collect_secure_boot(options):
    # type: (Options) -> Dict[str, Any]
    """Secure Boot state: the EFI variable, else ``mokutil --sb-state``, else a host without EFI (a BIOS boot has no
    Secure Boot), else unknown (``enabled`` null)."""
    errors = []  # type: List[str]
    path = options.path(SECURE_BOOT_EFIVAR)
    try:
        with open(path, "rb") as handle:
            enabled = parse_secure_boot_efivar(handle.read(64))
        if enabled is not None:
            return {"enabled": enabled, "source": "efivars", "error": None}
        errors.append("%s: unexpected content" % SECURE_BOOT_EFIVAR)
    except (IOError, OSError) as exc:
        if exc.errno != errno.ENOENT:
            errors.append("%s: %s" % (SECURE_BOOT_EFIVAR, exc.strerror))
    mokutil = _which("mokutil") if options.root in ("", "/") else None
    if mokutil is not None:
        run = run_command([mokutil, "--sb-state"], options.command_timeout)
        enabled = parse_mokutil_sb_state(run["stdout"] + "\n" + run["stderr"])
        if enabled is not None:
            return {"enabled": enabled, "source": "mokutil", "error": None}
        errors.append(run["error"] or "mokutil --sb-state: %s" % (run["stdout"] + run["stderr"]).strip()[:200])
    if not os.path.isdir(options.path("/sys/firmware/efi")) and os.path.isdir(options.path("/sys/firmware")):
        return {"enabled": False, "source": "no-efi", "error": None}
    return {"enabled": None, "source": None, "error": "; ".join(errors) or "no EFI variable and no mokutil"}


class ZstdUnavailable(Exception):
    """A .ko.zst that cannot be read on this host: no zstd program, or it failed, timed out or overflowed."""


def _zstd_chunks(path, timeout=ZSTD_TIMEOUT_S, max_bytes=MODULE_SCAN_MAX_BYTES):
    # type: (str, float, int) -> Iterable[bytes]
    """The decompressed bytes of a .zst file, in chunks, from the host's own ``zstd -q -d -c -- PATH`` (fixed
    argv, no shell; Ubuntu 24.04 installs zstd): the standard library has no zstd before Python 3.14.  At most
    ``max_bytes`` and ``timeout`` seconds; a consumer that stops early (it found what it wanted) ends the child.
    Raises :class:`ZstdUnavailable` when the program is missing, fails, is too slow or its output too long."""
    zstd = _which("zstd")
    if zstd is None:
        raise ZstdUnavailable("no zstd program on the host to read %s" % path)
    try:
        proc = subprocess.Popen(
            [zstd, "-q", "-d", "-c", "--", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except (IOError, OSError) as exc:
        raise ZstdUnavailable("zstd: %s" % exc) from None
    deadline = time.monotonic() + timeout
    total = 0
    finished = False
    try:
        stdout = proc.stdout
        assert stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZstdUnavailable("zstd -d %s timed out after %.0f s" % (path, timeout)) from None
            ready, _, _ = select.select([stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(stdout.fileno(), 1024 * 1024)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise ZstdUnavailable("%s decompresses to more than %d bytes" % (path, max_bytes))
            yield chunk
        try:
            rc = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise ZstdUnavailable("zstd -d %s timed out after %.0f s" % (path, timeout)) from None
        if rc != 0:
            err = proc.stderr.read(400) if proc.stderr is not None else b""
            raise ZstdUnavailable("zstd -d %s: exit %d %s" % (path, rc, err.decode("utf-8", "replace").strip()))
        finished = True
    finally:
        if not finished:
            _kill_group(proc.pid)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.wait(timeout=REAP_GRACE_S)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _modinfo_field(path, field, timeout=COMMAND_TIMEOUT_S):
    # type: (str, str, float) -> Optional[str]
    """``modinfo -F FIELD PATH`` (kmod; noble's reads .ko.zst): the value, "" when the module has none, None when
    modinfo is missing or cannot read the file."""
    modinfo = _which("modinfo")
    if modinfo is None:
        return None
    run = run_command([modinfo, "-F", field, "--", path], timeout)
    if run["error"] or run["rc"] != 0:
        return None
    return run["stdout"][:4096].strip()


def module_signed(path):
    # type: (str) -> Optional[bool]
    """Does the module file end with the kernel's signature magic?  .ko.gz/.ko.xz are decompressed with the
    standard library, .ko.zst with the host's zstd program (the signature is inside the compressed file); without
    zstd, ``modinfo`` (a signed module has a ``signer``); else None (cannot tell)."""
    size = len(MODULE_SIGNATURE_MAGIC)
    if path.endswith(".zst"):
        try:
            tail = b""
            for chunk in _zstd_chunks(path):
                tail = (tail + chunk)[-size:]
            return tail == MODULE_SIGNATURE_MAGIC
        except ZstdUnavailable:
            signer = _modinfo_field(path, "signer")
            return None if signer is None else bool(signer)
    if path.endswith((".gz", ".xz")):
        opener = gzip.open if path.endswith(".gz") else lzma.open  # type: Callable[..., Any]
        tail = b""
        total = 0
        with opener(path, "rb") as handle:
            while total < MODULE_SCAN_MAX_BYTES:
                chunk = handle.read(1024 * 1024)
                if not chunk:
                    break
                total += len(chunk)
                tail = (tail + chunk)[-size:]
        return tail == MODULE_SIGNATURE_MAGIC
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() < size:
            return False
        handle.seek(-size, os.SEEK_END)
        return handle.read(size) == MODULE_SIGNATURE_MAGIC


def module_source(modules_dir, path):
    # type: (str, Optional[str]) -> Optional[str]
    """Where a kernel's NVIDIA module comes from, by its place under /lib/modules/<release>: ``dkms`` (DKMS installs
    into ``updates/dkms``), ``package`` (the kernel's own tree, ``kernel/...``: a precompiled package such as
    linux-modules-nvidia-535-<release>), ``other``; None without a module."""
    if path is None:
        return None
    rel = os.path.relpath(path, modules_dir).replace(os.sep, "/")
    if rel.startswith("updates/dkms/"):
        return "dkms"
    if rel.startswith("kernel/"):
        return "package"
    return "other"


def would_load(present, signed, source, secure_boot):
    # type: (bool, Optional[bool], Optional[str], Optional[bool]) -> Optional[bool]
    """Would the kernel load this module?  A module signed by its distribution (a precompiled package) loads under
    Secure Boot; without Secure Boot any module loads; with it an unsigned one is refused, and a DKMS module signed
    with DKMS's own key loads only if that key is enrolled, which the probe cannot see.  None where it cannot be
    told (Secure Boot state unknown, a .ko.zst the host cannot decompress, a DKMS-signed module)."""
    if not present:
        return False
    if signed is True and source != "dkms":
        return True
    if secure_boot is False:
        return True
    if secure_boot is None:
        return None
    if signed is False:
        return False
    return None


# --------------------------------------------------------------------------------------------------
# packages


def parse_dpkg_status(text):
    # type: (str) -> List[Dict[str, str]]
    """Parse /var/lib/dpkg/status into one dict per stanza (continuation lines folded away)."""
    entries = []  # type: List[Dict[str, str]]
    current = {}  # type: Dict[str, str]
    last_key = None  # type: Optional[str]
    for line in text.splitlines():
        if not line.strip():
            if current:
                entries.append(current)
            current, last_key = {}, None
            continue
        if line[0] in " \t":
            if last_key is not None and last_key in ("Package", "Status", "Version", "Architecture", "Source"):
                current[last_key] += " " + line.strip()
            continue
        if ":" not in line:
            continue
        key, value = line.split(":", 1)
        last_key = key.strip()
        current[last_key] = value.strip()
    if current:
        entries.append(current)
    return entries


def _is_installed(entry):
    # type: (Dict[str, str]) -> bool
    status = entry.get("Status", "").split()
    # "want flag state": installed or configured-but-broken states still have the files on disk
    return len(status) == 3 and status[2] in ("installed", "half-configured", "triggers-awaited", "triggers-pending")


def _is_meta_kernel(name):
    # type: (str) -> bool
    """linux-generic, linux-image-generic, linux-headers-azure, linux-image-amd64, linux-generic-hwe-22.04:
    kernel packages without a kernel ABI version in the name (they pull the next kernel in)."""
    if not KERNEL_META_RE.match(name) or name in KERNEL_NON_META:
        return False
    if any(name.startswith(p) for p in KERNEL_NON_META_PREFIXES):
        return False
    return VERSIONED_KERNEL_PKG_RE.search(name) is None


def collect_packages(options, secure_boot=None):
    # type: (Options, Optional[bool]) -> Dict[str, Any]
    status_path = options.path("/var/lib/dpkg/status")
    try:
        text = _read_text(status_path)
    except (IOError, OSError) as exc:
        return {
            "source": status_path,
            "available": False,
            "error": str(exc),
            "kernels": [],
            "kernel_meta": {},
            "held": [],
            "nvidia": {},
            "driver_package": None,
            "driver_package_version": None,
            "driver_branch": None,
        }
    entries = parse_dpkg_status(text)
    installed = {}  # type: Dict[str, Dict[str, str]]
    held = []  # type: List[str]
    for entry in entries:
        name = entry.get("Package")
        if not name:
            continue
        status = entry.get("Status", "").split()
        if status and status[0] == "hold":
            held.append(name)
        if _is_installed(entry):
            installed[name] = entry

    kernels = []
    for name in sorted(installed):
        match = KERNEL_IMAGE_RE.match(name)
        if not match:
            continue
        release = match.group("release")
        kernels.append(_kernel_entry(options, release, name, installed, secure_boot))
    kernel_meta = {name: installed[name].get("Version") for name in sorted(installed) if _is_meta_kernel(name)}
    nvidia = {name: installed[name].get("Version") for name in sorted(installed) if NVIDIA_PACKAGE_RE.match(name)}
    driver_package, driver_version, branch = _driver_package(nvidia)
    return {
        "source": status_path,
        "available": True,
        "error": None,
        "kernels": kernels,
        "kernel_meta": kernel_meta,
        "held": sorted(set(held)),
        "nvidia": nvidia,
        "driver_package": driver_package,
        "driver_package_version": driver_version,
        "driver_branch": branch,
    }


def _driver_package(nvidia):
    # type: (Dict[str, Optional[str]]) -> Tuple[Optional[str], Optional[str], Optional[str]]
    """The driver package, its upstream version and the driver branch, whole (``535-server``, ``535-open``: the
    signed module packages and every other name follow from it): ``nvidia-driver-<branch>`` first, else a package
    naming the whole branch (headless, DKMS, kernel source), else the userspace (never ``-open``)."""
    candidates = []
    for name, version in nvidia.items():
        for rank, pattern in ((0, DRIVER_PACKAGE_RE), (2, BRANCH_PACKAGE_RE), (3, USERSPACE_PACKAGE_RE)):
            match = pattern.match(name)
            if match:
                branch = match.group("branch")
                candidates.append((rank if branch or rank else 1, name, version, branch))
                break
    if not candidates:
        return None, None, None
    candidates.sort(key=lambda c: (c[0], c[1]))
    _, name, version, branch = candidates[0]
    upstream = upstream_version(version)
    if branch is None and upstream:
        branch = upstream.split(".")[0]
    return name, upstream, branch


# linux-modules-nvidia-535-6.5.0-1025-azure, linux-modules-nvidia-535-server-open-6.5.0-1025-azure: a release
# starts with a digit, so the branch and the release part unambiguously (the flavour meta-packages do not match).
_SIGNED_PACKAGE_RE = re.compile(r"^linux-modules-nvidia-" + _BRANCH + r"-(?P<release>\d.*)$")


def _kernel_entry(options, release, image_package, installed, secure_boot=None):
    # type: (Options, str, str, Dict[str, Dict[str, str]], Optional[bool]) -> Dict[str, Any]
    modules_dir = options.path("/lib/modules", release)
    module_path = find_nvidia_module(modules_dir)
    version = None
    version_error = None
    signed = None  # type: Optional[bool]
    if module_path is not None:
        try:
            version = module_version(module_path)
        except (IOError, OSError, EOFError, lzma.LZMAError) as exc:
            version_error = str(exc)
        try:
            signed = module_signed(module_path)
        except (IOError, OSError, EOFError, lzma.LZMAError) as exc:
            version_error = version_error or str(exc)
    source = module_source(modules_dir, module_path)
    packages = []  # type: List[str]
    for name in sorted(installed):
        match = _SIGNED_PACKAGE_RE.match(name)
        if match and match.group("release") == release:
            packages.append(name)
    return {
        "release": release,
        "flavour": kernel_flavour(release),
        "signed_module_packages": packages,
        "image_package": image_package,
        "image_version": installed[image_package].get("Version"),
        "headers_installed": ("linux-headers-" + release) in installed,
        "modules_package_installed": ("linux-modules-" + release) in installed,
        "modules_installed": os.path.isdir(modules_dir),
        "nvidia_module": {
            "present": module_path is not None,
            "version": version,
            "path": _unrooted(options, module_path),
            "error": version_error,
            "source": source,
            "signed": signed,
            "would_load": would_load(module_path is not None, signed, source, secure_boot),
        },
        "dkms": _dkms_for_release(options, release),
    }


def _unrooted(options, path):
    # type: (Options, Optional[str]) -> Optional[str]
    if path is None or options.root in ("", "/"):
        return path
    root = options.root.rstrip("/")
    return path[len(root) :] if path.startswith(root) else path


_MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


def find_nvidia_module(modules_dir):
    # type: (str) -> Optional[str]
    """The nvidia.ko for one kernel: DKMS location, distro location, then a bounded walk."""
    if not os.path.isdir(modules_dir):
        return None
    for directory, prefix in (
        (os.path.join(modules_dir, "updates", "dkms"), "nvidia.ko"),
        (os.path.join(modules_dir, "kernel", "drivers", "video"), "nvidia"),
    ):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix) and name.endswith(_MODULE_SUFFIXES) and _is_core_module(name):
                return os.path.join(directory, name)
    seen = 0
    base_depth = modules_dir.rstrip("/").count("/")
    for directory, dirnames, filenames in os.walk(modules_dir):
        dirnames.sort()
        if directory.count("/") - base_depth >= MODULE_WALK_MAX_DEPTH:
            dirnames[:] = []
        seen += len(filenames) + len(dirnames)
        for name in sorted(filenames):
            if name.startswith("nvidia.ko") and name.endswith(_MODULE_SUFFIXES):
                return os.path.join(directory, name)
        if seen > MODULE_WALK_MAX_ENTRIES:
            break
    return None


def _is_core_module(name):
    # type: (str) -> bool
    """nvidia.ko, not nvidia-uvm.ko / nvidia-drm.ko / nvidiafb.ko."""
    stem = name.split(".ko", 1)[0]
    return stem == "nvidia"


_MODINFO_RE = re.compile(rb"(?:^|\x00)version=([0-9][0-9A-Za-z.+~_-]*)\x00")
_MODINFO_TEXT_RE = re.compile(rb"(?m)^version:\s*([0-9][0-9A-Za-z.+~_-]*)\s*$")
_VERSION_TEXT_RE = re.compile(r"^[0-9][0-9A-Za-z.+~_-]{0,63}$")


def _scan_version(chunks):
    # type: (Iterable[bytes]) -> Optional[str]
    tail = b""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        data = tail + chunk
        for regex in (_MODINFO_RE, _MODINFO_TEXT_RE):
            match = regex.search(data)
            if match:
                return match.group(1).decode("ascii", "replace")
        tail = data[-256:]
        if total >= MODULE_SCAN_MAX_BYTES:
            break
    return None


def module_version(path):
    # type: (str) -> Optional[str]
    """The ``version`` of a kernel module file, from its .modinfo strings (``version=535.183.01``)
    or a modinfo-like ``version:`` line; .ko.gz and .ko.xz are decompressed with the standard library,
    .ko.zst with the host's zstd program (else ``modinfo -F version``; None when neither can read it)."""
    if path.endswith(".zst"):
        try:
            chunks = _zstd_chunks(path)
            try:
                return _scan_version(chunks)
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # a version found early ends zstd now
        except ZstdUnavailable:
            version = _modinfo_field(path, "version")
            first = version.splitlines()[0].strip() if version else ""
            return first if _VERSION_TEXT_RE.match(first) else None
    if path.endswith(".gz"):
        opener = gzip.open  # type: Callable[..., Any]
    elif path.endswith(".xz"):
        opener = lzma.open
    else:
        opener = open
    with opener(path, "rb") as handle:
        return _scan_version(iter(lambda: handle.read(1024 * 1024), b""))


def _dkms_for_release(options, release):
    # type: (Options, str) -> List[Dict[str, Any]]
    out = []  # type: List[Dict[str, Any]]
    root = options.path("/var/lib/dkms")
    try:
        modules = sorted(os.listdir(root))
    except OSError:
        return out
    for module in modules:
        if not module.startswith("nvidia"):
            continue
        try:
            versions = sorted(os.listdir(os.path.join(root, module)))
        except OSError:
            continue
        for version in versions:
            release_dir = os.path.join(root, module, version, release)
            if not os.path.isdir(release_dir):
                continue
            built = False
            for arch in sorted(os.listdir(release_dir)):
                module_dir = os.path.join(release_dir, arch, "module")
                try:
                    if any(n.startswith("nvidia") and ".ko" in n for n in os.listdir(module_dir)):
                        built = True
                except OSError:
                    continue
            installed = any(
                os.path.exists(os.path.join(options.path("/lib/modules", release, "updates", "dkms"), "nvidia" + s))
                for s in _MODULE_SUFFIXES
            )
            state = "installed" if built and installed else ("built" if built else "added")
            out.append({"module": module, "version": version, "state": state})
    return out


# --------------------------------------------------------------------------------------------------
# unattended-upgrades (effective apt configuration)

_APT_CONFIG_LINE = re.compile(r'^(?P<key>[^\s"]+?)(?P<list>::)?\s+"(?P<value>.*)";\s*$')


def parse_apt_config_dump(text):
    # type: (str) -> Dict[str, Any]
    """``apt-config dump`` -> {key: str | [str, ...]}.  ``Key:: "v";`` lines append to the list ``Key``;
    a bare ``Key "";`` line only declares the list (apt prints it before the items)."""
    values = {}  # type: Dict[str, Any]
    for raw in text.splitlines():
        line = raw.strip()
        match = _APT_CONFIG_LINE.match(line)
        if not match:
            continue
        key, value = match.group("key"), match.group("value")
        value = value.replace('\\"', '"')
        if match.group("list"):
            existing = values.get(key)
            if not isinstance(existing, list):
                existing = []
                values[key] = existing
            existing.append(value)
        elif key not in values or not isinstance(values[key], list):
            values[key] = value
    return values


def _as_list(value):
    # type: (Any) -> List[str]
    if isinstance(value, list):
        return [v for v in value if v != ""]
    if value in (None, ""):
        return []
    return [value]


def _truthy(value):
    # type: (Any) -> Optional[bool]
    if value is None or isinstance(value, list):
        return None
    return str(value).strip().lower() in ("1", "true", "yes", "on", "enable", "enabled")


def unattended_from_config(config, installed):
    # type: (Dict[str, Any], bool) -> Dict[str, Any]
    periodic = config.get("APT::Periodic::Unattended-Upgrade")
    periodic_enable = config.get("APT::Periodic::Enable")
    enabled = (
        installed
        and periodic is not None
        and not isinstance(periodic, list)
        and str(periodic).strip() not in ("", "0")
        and str(periodic_enable).strip() != "0"
    )
    return {
        "installed": installed,
        "enabled": bool(enabled),
        "periodic_unattended_upgrade": periodic if not isinstance(periodic, list) else None,
        "package_blacklist": _as_list(config.get("Unattended-Upgrade::Package-Blacklist")),
        "package_whitelist": _as_list(config.get("Unattended-Upgrade::Package-Whitelist")),
        "origins_pattern": _as_list(config.get("Unattended-Upgrade::Origins-Pattern")),
        "allowed_origins": _as_list(config.get("Unattended-Upgrade::Allowed-Origins")),
        "automatic_reboot": _truthy(config.get("Unattended-Upgrade::Automatic-Reboot")),
        "automatic_reboot_time": config.get("Unattended-Upgrade::Automatic-Reboot-Time"),
    }


def collect_unattended(options, installed_packages):
    # type: (Options, Dict[str, Any]) -> Dict[str, Any]
    installed = "unattended-upgrades" in installed_packages
    apt_config = _which("apt-config")
    if apt_config is None:
        result = unattended_from_config({}, installed)
        result["error"] = "apt-config not found"
        result["would_upgrade"] = None
        return result
    run = run_command([apt_config, "dump"], options.command_timeout)
    if run["error"] or run["rc"] != 0:
        result = unattended_from_config({}, installed)
        result["error"] = run["error"] or ("apt-config dump exited %s: %s" % (run["rc"], run["stderr"].strip()))
    else:
        result = unattended_from_config(parse_apt_config_dump(run["stdout"]), installed)
        result["error"] = None
    result["would_upgrade"] = simulate_upgrades(options) if options.simulate_upgrades else None
    return result


_UU_WILL_UPGRADE = re.compile(r"Packages that will be upgraded:\s*(.*)$")
_UU_BLACKLISTED = (
    re.compile(r"skipping blacklisted package '?([^\s']+)'?"),
    re.compile(r"Package (\S+) is blacklisted"),
)
_UU_HELD = (re.compile(r"pkg (\S+) is on hold"), re.compile(r"Package (\S+) is marked to be held back"))


def parse_unattended_dry_run(text):
    # type: (str) -> Dict[str, List[str]]
    upgrade, blacklisted, held = [], [], []  # type: List[str], List[str], List[str]
    for line in text.splitlines():
        match = _UU_WILL_UPGRADE.search(line)
        if match:
            upgrade.extend(p for p in match.group(1).split() if p not in upgrade)
            continue
        for regex, target in [(r, blacklisted) for r in _UU_BLACKLISTED] + [(r, held) for r in _UU_HELD]:
            found = regex.search(line)
            if found:
                name = found.group(1).rstrip(".")
                if name not in target:
                    target.append(name)
    return {"upgrade": upgrade, "blacklisted": blacklisted, "held": held}


def simulate_upgrades(options):
    # type: (Options) -> Dict[str, Any]
    binary = _which("unattended-upgrade")
    if binary is None:
        return {
            "ran": False,
            "rc": None,
            "error": "unattended-upgrade not found",
            "upgrade": [],
            "blacklisted": [],
            "held": [],
        }
    run = run_command([binary, "--dry-run", "-d"], SIMULATE_TIMEOUT_S)
    parsed = parse_unattended_dry_run(run["stdout"] + "\n" + run["stderr"])
    result = {"ran": True, "rc": run["rc"], "error": run["error"]}  # type: Dict[str, Any]
    result.update(parsed)
    return result


# --------------------------------------------------------------------------------------------------
# apt history


def split_history_stanzas(text):
    # type: (str) -> List[str]
    """Split history.log text into stanzas: each begins at a ``Start-Date:`` line."""
    stanzas = []  # type: List[str]
    current = []  # type: List[str]
    for line in text.splitlines():
        if line.lstrip().startswith("Start-Date:") and current:
            stanzas.append("\n".join(current).strip("\n"))
            current = []
        if not line.strip() and not current:
            continue
        current.append(line)
    if current:
        stanzas.append("\n".join(current).strip("\n"))
    return [s for s in stanzas if s.strip()]


def select_history_stanzas(text):
    # type: (str) -> List[str]
    return [s for s in split_history_stanzas(text) if HISTORY_PATTERN.search(s)]


def _history_files(directory):
    # type: (str) -> List[str]
    """history.log, history.log.1, history.log.2.gz, ... newest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    ranked = []
    for name in names:
        match = re.match(r"^history\.log(?:\.(\d+))?(\.gz)?$", name)
        if match:
            ranked.append((int(match.group(1) or 0), name))
    return [os.path.join(directory, name) for _, name in sorted(ranked)]


def collect_apt_history(options):
    # type: (Options) -> Dict[str, Any]
    files = _history_files(options.path("/var/log/apt"))
    budget = APT_HISTORY_MAX_BYTES
    used_files = []  # type: List[str]
    chunks = []  # type: List[str]  # newest file first; reversed below
    truncated = False
    errors = []  # type: List[str]
    for path in files:
        if budget <= 0:
            truncated = True
            break
        try:
            if path.endswith(".gz"):
                with gzip.open(path, "rb") as handle:
                    data = handle.read(budget + 1)
            else:
                with open(path, "rb") as handle:
                    handle.seek(0, os.SEEK_END)
                    size = handle.tell()
                    handle.seek(max(0, size - budget - 1))
                    data = handle.read()
        except (IOError, OSError, EOFError) as exc:
            errors.append("%s: %s" % (path, exc))
            continue
        if len(data) > budget:
            truncated = True
            data = data[-budget:]
        budget -= len(data)
        chunks.append(data.decode("utf-8", "replace"))
        used_files.append(_unrooted(options, path) or path)
    stanzas = []  # type: List[str]
    for text in reversed(chunks):  # oldest file first: stanzas come out in chronological order
        stanzas.extend(select_history_stanzas(text))
    return {
        "files": used_files,
        "stanzas": len(stanzas),
        "truncated": truncated,
        "text": "\n\n".join(stanzas) + ("\n" if stanzas else ""),
        "error": "; ".join(errors) if errors else None,
    }


# --------------------------------------------------------------------------------------------------
# kernel log


def filter_kernel_log_lines(lines, cap=KERNEL_LOG_MAX_LINES):
    # type: (Iterable[str], int) -> Tuple[List[str], int]
    """Keep NVIDIA-related lines; cap to ``cap`` lines (first KERNEL_LOG_HEAD_LINES + newest rest).
    Returns (lines, number dropped)."""
    kept = [line.rstrip("\n") for line in lines if KERNEL_LOG_PATTERN.search(line)]
    if len(kept) <= cap:
        return kept, 0
    head = min(KERNEL_LOG_HEAD_LINES, cap)
    tail = cap - head
    dropped = len(kept) - cap
    return kept[:head] + (kept[-tail:] if tail else []), dropped


_BOOT_MARKER = re.compile(r"(?:\]\s*|kernel:\s*)Linux version \d")
_SYSLOG_TS = re.compile(r"^(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+(?P<time>\d\d:\d\d:\d\d)\s")
_ISO_TS = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(?P<tz>Z|[+-]\d\d:?\d\d)?\s")


def _line_time(line, now):
    # type: (str, datetime.datetime) -> Optional[datetime.datetime]
    match = _ISO_TS.match(line)
    if match:
        stamp = datetime.datetime.strptime(match.group("ts"), "%Y-%m-%dT%H:%M:%S")
        tz = match.group("tz")
        if tz and tz != "Z":
            sign = 1 if tz[0] == "+" else -1
            digits = tz[1:].replace(":", "")
            offset = datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            return (stamp - sign * offset).replace(tzinfo=datetime.timezone.utc)
        if tz == "Z":
            return stamp.replace(tzinfo=datetime.timezone.utc)
        return stamp.astimezone(datetime.timezone.utc)
    match = _SYSLOG_TS.match(line)
    if match:
        try:
            stamp = datetime.datetime.strptime(
                "%d %s %s %s" % (now.year, match.group("mon"), match.group("day"), match.group("time")),
                "%Y %b %d %H:%M:%S",
            ).astimezone(datetime.timezone.utc)
        except ValueError:
            return None
        if stamp > now + datetime.timedelta(days=1):
            stamp = stamp.replace(year=stamp.year - 1)
        return stamp
    return None


def kern_log_since_boot(text, boot_time):
    # type: (str, Optional[datetime.datetime]) -> List[str]
    """Lines of kern.log that belong to the current boot: after the last ``Linux version`` boot
    banner when there is one, else those stamped at or after boot_time (unstamped lines kept)."""
    lines = text.splitlines()
    last_marker = None
    for i, line in enumerate(lines):
        if _BOOT_MARKER.search(line):
            last_marker = i
    if last_marker is not None:
        return lines[last_marker:]
    if boot_time is None:
        return lines
    now = datetime.datetime.now(datetime.timezone.utc)
    slack = datetime.timedelta(seconds=60)
    out = []
    for line in lines:
        stamp = _line_time(line, now)
        if stamp is None or stamp >= boot_time - slack:
            out.append(line)
    return out


def collect_kernel_log(options, boot_time_iso):
    # type: (Options, Optional[str]) -> Dict[str, Any]
    dmesg = _which("dmesg")
    dmesg_error = None  # type: Optional[str]
    if dmesg is not None and options.root in ("", "/"):
        run = run_command([dmesg], options.command_timeout)
        if run["error"] is None and run["rc"] == 0:
            lines, dropped = filter_kernel_log_lines(run["stdout"].splitlines())
            return {"source": "dmesg", "lines": lines, "truncated": dropped, "error": None}
        dmesg_error = run["error"] or ("dmesg exited %s: %s" % (run["rc"], run["stderr"].strip()))
    elif dmesg is None:
        dmesg_error = "dmesg not found"
    boot_time = None
    if boot_time_iso:
        boot_time = datetime.datetime.strptime(boot_time_iso, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc
        )
    for candidate in ("/var/log/kern.log", "/var/log/syslog", "/var/log/messages"):
        path = options.path(candidate)
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - KERN_LOG_TAIL_BYTES))
                text = handle.read().decode("utf-8", "replace")
        except (IOError, OSError):
            continue
        lines, dropped = filter_kernel_log_lines(kern_log_since_boot(text, boot_time))
        return {"source": candidate, "lines": lines, "truncated": dropped, "error": dmesg_error}
    return {"source": None, "lines": [], "truncated": 0, "error": dmesg_error or "no kernel log readable"}


# --------------------------------------------------------------------------------------------------
# dkms, dpkg lock


def collect_dkms_status(options):
    # type: (Options) -> Optional[Dict[str, Any]]
    dkms = _which("dkms")
    if dkms is None:
        return None
    run = run_command([dkms, "status"], DKMS_TIMEOUT_S)
    return {"rc": run["rc"], "output": run["stdout"] + run["stderr"], "error": run["error"]}


def _proc_locks_holders(path_stat, proc_locks_text):
    # type: (os.stat_result, str) -> List[int]
    major, minor = os.major(path_stat.st_dev), os.minor(path_stat.st_dev)
    holders = []
    for line in proc_locks_text.splitlines():
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:131075 0 EOF"; blocked waiters carry "->" after the id
        if len(parts) < 6 or parts[1] == "->":
            continue
        try:
            pid = int(parts[4])
            dev_major, dev_minor, inode = parts[5].split(":")
            if int(inode) != path_stat.st_ino:
                continue
            if (int(dev_major, 16), int(dev_minor, 16)) != (major, minor):
                continue
        except ValueError:
            continue
        holders.append(pid)
    return holders


def lock_state(path, proc_locks_path="/proc/locks"):
    # type: (str, str) -> Dict[str, Any]
    """Is ``path`` locked by someone else?  Takes a non-blocking POSIX write lock and drops it at once
    (dpkg and apt use fcntl locks).  Opens O_RDWR, never creates or truncates."""
    state = {"path": path, "exists": False, "held": False, "holder_pid": None, "holder_comm": None, "error": None}  # type: Dict[str, Any]
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return state
        state["exists"] = True
        state["held"] = None
        state["error"] = "%s: %s" % (path, exc.strerror)
        return state
    state["exists"] = True
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                state["held"] = None
                state["error"] = "%s: %s" % (path, exc.strerror)
                return state
            state["held"] = True
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return state
        try:
            holders = _proc_locks_holders(os.fstat(fd), _read_text(proc_locks_path))
        except (IOError, OSError):
            holders = []
        if holders:
            state["holder_pid"] = holders[0]
            state["holder_comm"] = _proc_comm(holders[0])
        return state
    finally:
        os.close(fd)


def collect_dpkg_lock(options):
    # type: (Options) -> Dict[str, Any]
    locks = [lock_state(options.path(p)) for p in ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")]
    held_locks = [lock for lock in locks if lock["held"]]
    unknown = [lock for lock in locks if lock["held"] is None]
    holder = held_locks[0] if held_locks else None
    return {
        "held": True if held_locks else (None if unknown else False),
        "holder_pid": holder["holder_pid"] if holder else None,
        "holder_comm": holder["holder_comm"] if holder else None,
        "locks": [dict(lock, path=_unrooted(options, lock["path"])) for lock in locks],
    }


# --------------------------------------------------------------------------------------------------
# processes that hold the GPU device files open (works when NVML does not)

# /dev/nvidia0.., /dev/nvidiactl, /dev/nvidia-uvm(-tools), /dev/nvidia-modeset, /dev/nvidia-caps/*: every CUDA
# process opens nvidiactl and the device of each GPU it uses, so this finds jobs even while NVML fails
# (driver/library mismatch, NVML hung) and the loaded module still runs them.
_DEVICE_RE = re.compile(r"^/dev/nvidia(?:[0-9]+|ctl|-uvm|-uvm-tools|-modeset|-caps/.*)$")
# Driver services that hold the devices on every healthy GPU host; they are not workloads. Matched on the basename
# of the process's executable (see _executable_name), never on /proc/<pid>/comm alone: comm is cut to 15
# characters ("nvidia-persiste", "nv-fabricmanage"). The controller reads this set from here (one list).
DRIVER_SERVICES = frozenset(
    ("nvidia-persistenced", "nv-fabricmanager", "nv-hostengine", "dcgm-exporter", "nvidia-smi", "nvidia-powerd")
)
DEVICE_USERS_MAX = 256


def collect_device_users(options):
    # type: (Options) -> Optional[Dict[str, Any]]
    """Processes holding an NVIDIA device file open, from /proc/<pid>/fd (this probe and its children excluded).

    None where there is no /proc to read (a probe of an image or a test tree): unknown, not "no users"."""
    proc = options.path("/proc")
    if not os.path.isdir(proc):
        return None
    me = os.getpid()
    users = []  # type: List[Dict[str, Any]]
    unreadable = 0
    for name in sorted(os.listdir(proc), key=lambda n: (len(n), n)):
        if not name.isdigit() or int(name) == me:
            continue
        fd_dir = os.path.join(proc, name, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                unreadable += 1  # not ours to read: counted, never guessed
            continue  # else gone (exited during the scan): nothing held
        devices = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if _DEVICE_RE.match(target):
                devices.add(target)
        if not devices:
            continue
        comm = (_read_text_quiet(os.path.join(proc, name, "comm")) or "").strip()
        if _parent_pid(os.path.join(proc, name, "stat")) == me:
            continue  # the probe's own NVML child
        exe = _executable_name(os.path.join(proc, name))
        users.append(
            {
                "pid": int(name),
                "comm": comm or None,
                "exe": exe,
                "devices": sorted(devices),
                "gpus": sorted(int(d[len("/dev/nvidia") :]) for d in devices if d[len("/dev/nvidia") :].isdigit()),
                "service": _is_driver_service(exe, comm),
            }
        )
        if len(users) >= DEVICE_USERS_MAX:
            break
    return {"users": users, "unreadable": unreadable, "truncated": len(users) >= DEVICE_USERS_MAX}


COMM_MAX = 15  # /proc/<pid>/comm: TASK_COMM_LEN - 1 characters of the executable's name


def _executable_name(pid_dir):
    # type: (str) -> Optional[str]
    """The basename of the process's executable: the ``exe`` link (" (deleted)" stripped: a binary replaced by an
    upgrade while it runs), else argv[0] from ``cmdline``; None when neither is readable (a kernel thread, a
    process of another user without privileges, one that exited)."""
    try:
        target = os.readlink(os.path.join(pid_dir, "exe"))
    except OSError:
        target = ""
    if target.endswith(" (deleted)"):
        target = target[: -len(" (deleted)")]
    if not target:
        raw = _read_text_quiet(os.path.join(pid_dir, "cmdline")) or ""
        target = raw.split("\0", 1)[0]
    name = target.rstrip("/").rsplit("/", 1)[-1]
    return name or None


def _is_driver_service(exe, comm):
    # type: (Optional[str], str) -> bool
    """A driver daemon, by executable; by comm only when the executable is unknown and comm is not cut short (a
    truncated comm could be anything that starts the same way: it is counted as work)."""
    if exe is not None:
        return exe in DRIVER_SERVICES
    return len(comm) < COMM_MAX and comm in DRIVER_SERVICES


def _read_text_quiet(path):
    # type: (str) -> Optional[str]
    try:
        return _read_text(path)
    except (IOError, OSError):
        return None


def _parent_pid(stat_path):
    # type: (str) -> Optional[int]
    text = _read_text_quiet(stat_path)
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------
# assembly


def collect(options=None):
    # type: (Any) -> Dict[str, Any]
    """Collect every section; the returned dict is the facts document.  ``options`` is an
    :class:`Options`, a mapping of its fields (the Ansible module passes its params), or None."""
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        options = Options.from_mapping(options)
    started = time.monotonic()
    errors = []  # type: List[Dict[str, str]]
    doc = {
        "schema": SCHEMA,
        "probe_version": PROBE_VERSION,
        "collected_at": _utc_iso(time.time()),
        "duration_ms": None,
        "hostname": socket.gethostname(),
        "python": "%d.%d.%d" % sys.version_info[:3],
        # Who ran the probe: not 0 means other users' /proc/<pid>/fd were unreadable (no sudo): device users unknown.
        "euid": os.geteuid(),
    }  # type: Dict[str, Any]

    def section(name, fn, *args):
        # type: (str, Callable[..., Any], Any) -> Any
        try:
            return fn(*args)
        except Exception as exc:  # a broken section is data, the rest goes on
            errors.append(
                {"section": name, "error": "%s: %s" % (type(exc).__name__, exc), "trace": traceback.format_exc(limit=3)}
            )
            return None

    # NVML first: the fork happens while this process is still single-threaded and small.
    if options.skip_nvml:
        doc["nvml"] = _empty_nvml("other", "NVML not probed (--skip-nvml)")
    else:
        doc["nvml"] = section("nvml", collect_nvml, options.nvml_timeout)
        if doc["nvml"] is None:
            doc["nvml"] = _empty_nvml("other", "NVML section failed: %s" % errors[-1]["error"])
    doc["system"] = section("system", collect_system, options)
    doc["secure_boot"] = section("secure_boot", collect_secure_boot, options)
    doc["packages"] = section("packages", collect_packages, options, (doc["secure_boot"] or {}).get("enabled"))
    installed = {}  # type: Dict[str, Any]
    with contextlib.suppress(IOError, OSError):
        installed = {
            e["Package"]: e
            for e in parse_dpkg_status(_read_text(options.path("/var/lib/dpkg/status")))
            if _is_installed(e) and "Package" in e
        }
    doc["unattended_upgrades"] = section("unattended_upgrades", collect_unattended, options, installed)
    doc["apt_history"] = section("apt_history", collect_apt_history, options)
    boot_time = (doc.get("system") or {}).get("boot_time")
    doc["kernel_log"] = section("kernel_log", collect_kernel_log, options, boot_time)
    doc["dkms_status"] = section("dkms_status", collect_dkms_status, options)
    doc["dpkg_lock"] = section("dpkg_lock", collect_dpkg_lock, options)
    doc["device_users"] = section("device_users", collect_device_users, options)
    doc["errors"] = errors
    doc["duration_ms"] = int((time.monotonic() - started) * 1000)
    return doc


# --------------------------------------------------------------------------------------------------
# output files: the facts JSON and a Prometheus textfile (node_exporter textfile collector)

# (name, type, help), in the order of the output. The controller's renderer (remediation.report.prometheus) takes
# these definitions from here for the same metrics, and writes its textfiles with render_families too.
PROM_METRICS = (
    ("gpufleet_nvml_ok", "gauge", "1 when NVML initialised and every GPU answered, else 0."),
    ("gpufleet_nvml_error", "gauge", "1 for the NVML error class of a host whose NVML check failed."),
    ("gpufleet_gpu_count", "gauge", "GPUs NVML reports (nvmlDeviceGetCount)."),
    ("gpufleet_gpu_temperature_celsius", "gauge", "GPU core temperature."),
    ("gpufleet_gpu_memory_used_bytes", "gauge", "GPU memory in use (includes the driver's reservation)."),
    ("gpufleet_gpu_memory_total_bytes", "gauge", "GPU memory in total."),
    ("gpufleet_gpu_clocks_event_reasons", "gauge", "Bit mask of active clock event (throttle) reasons."),
    ("gpufleet_gpu_ecc_uncorrected_volatile_total", "counter", "Uncorrected ECC errors since the driver loaded."),
    ("gpufleet_gpu_remap_pending", "gauge", "1 when a row remap (or page retirement) waits for a GPU reset."),
    ("gpufleet_kernel_held", "gauge", "1 when the booted kernel's image package is on hold in dpkg."),
    ("gpufleet_driver_info", "gauge", "NVIDIA driver version (NVML's, else the driver package's); value 1."),
    ("gpufleet_kernel_nvidia_module", "gauge", "1 when that installed kernel has an NVIDIA module, else 0."),
    ("gpufleet_unattended_upgrades_enabled", "gauge", "1 when unattended-upgrades is installed and enabled."),
    ("gpufleet_reboot_required", "gauge", "1 when /run/reboot-required exists."),
    ("gpufleet_probe_timestamp_seconds", "gauge", "Unix time when the probe started collecting."),
    ("gpufleet_probe_duration_seconds", "gauge", "Wall time of the whole collection."),
)


def prom_escape_label(value):
    # type: (Any) -> str
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prom_escape_help(text):
    # type: (str) -> str
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def prom_number(value):
    # type: (Any) -> str
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _iso_to_epoch(text):
    # type: (Any) -> Optional[float]
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return float(calendar.timegm(parsed.timetuple()))


def _prom_samples(doc, host):
    # type: (Dict[str, Any], str) -> Dict[str, List[Tuple[List[Tuple[str, str]], Any]]]
    """Facts document -> {metric name: [(labels, value), ...]}, labels as (name, value) pairs; absent facts give no
    sample."""
    out = dict((name, []) for name, _, _ in PROM_METRICS)  # type: Dict[str, List[Tuple[List[Tuple[str, str]], Any]]]

    def add(name, value, **labels):
        # type: (str, Any, str) -> None
        if value is None:
            return
        merged = {"host": host}
        merged.update(labels)
        out[name].append((list(merged.items()), value))

    nvml = doc.get("nvml") or {}
    ok = bool(nvml.get("ok"))
    add("gpufleet_nvml_ok", ok)
    if not ok:
        add("gpufleet_nvml_error", 1, error_class=str(nvml.get("error_class") or "other"))
    count = nvml.get("device_count")
    if isinstance(count, int) and not isinstance(count, bool):
        add("gpufleet_gpu_count", count)
    for gpu in nvml.get("gpus") or []:
        if not isinstance(gpu, dict) or gpu.get("index") is None:
            continue
        index = str(gpu["index"])
        uuid = gpu.get("uuid") or ""
        add("gpufleet_gpu_temperature_celsius", gpu.get("temperature_c"), gpu=index, uuid=uuid)
        memory = gpu.get("memory") or {}
        add("gpufleet_gpu_memory_used_bytes", memory.get("used"), gpu=index, uuid=uuid)
        add("gpufleet_gpu_memory_total_bytes", memory.get("total"), gpu=index, uuid=uuid)
        add("gpufleet_gpu_clocks_event_reasons", (gpu.get("clocks_event_reasons") or {}).get("mask"), gpu=index)
        ecc_volatile = (gpu.get("ecc") or {}).get("volatile") or {}
        add("gpufleet_gpu_ecc_uncorrected_volatile_total", ecc_volatile.get("uncorrected"), gpu=index)
        pending = (gpu.get("remapped_rows") or {}).get("pending")
        if pending is None:
            pending = (gpu.get("retired_pages") or {}).get("pending")
        add("gpufleet_gpu_remap_pending", pending, gpu=index)

    system = doc.get("system") or {}
    packages = doc.get("packages") or {}
    booted = system.get("kernel")
    kernels = [k for k in packages.get("kernels") or [] if isinstance(k, dict) and k.get("release")]
    if booted and packages.get("available", True) and doc.get("packages") is not None:
        held = set(packages.get("held") or [])
        images = set(k.get("image_package") for k in kernels if k.get("release") == booted)
        images.add("linux-image-%s" % booted)
        add("gpufleet_kernel_held", bool(images & held), kernel=booted)
    for kernel in kernels:
        add(
            "gpufleet_kernel_nvidia_module",
            bool((kernel.get("nvidia_module") or {}).get("present")),
            kernel=kernel["release"],
            booted="true" if kernel["release"] == booted else "false",
        )
    version = nvml.get("driver_version") or packages.get("driver_package_version")
    if version:
        add("gpufleet_driver_info", 1, version=str(version))
    unattended = doc.get("unattended_upgrades")
    if isinstance(unattended, dict) and "enabled" in unattended:
        add("gpufleet_unattended_upgrades_enabled", bool(unattended.get("enabled")))
    if "reboot_required" in system:
        add("gpufleet_reboot_required", bool(system.get("reboot_required")))
    add("gpufleet_probe_timestamp_seconds", _iso_to_epoch(doc.get("collected_at")))
    duration_ms = doc.get("duration_ms")
    if isinstance(duration_ms, (int, float)) and not isinstance(duration_ms, bool):
        add("gpufleet_probe_duration_seconds", duration_ms / 1000.0)
    return out


def render_prometheus(doc, host=None):
    # type: (Dict[str, Any], Optional[str]) -> str
    """The facts document as a Prometheus textfile (exposition format 0.0.4), computed from the facts alone.

    ``host`` is the value of every sample's ``host`` label (default: the document's ``hostname``)."""
    host = host or str(doc.get("hostname") or socket.gethostname())
    return render_families(PROM_METRICS, _prom_samples(doc, host))


def render_families(metrics, samples, number=prom_number):
    # type: (Iterable[Tuple[str, str, str]], Mapping[str, Sequence[Tuple[Iterable[Tuple[str, Any]], Any]]], Callable[[Any], str]) -> str
    """Samples in the text exposition format (0.0.4), family by family in the order of ``metrics`` ((name, type,
    HELP) triples): a family's HELP and TYPE lines, then its samples, each ``(labels, value)`` with the labels as
    (name, value) pairs, written with ``number``. A metric without samples is left out; no samples at all is "".

    The controller writes its textfiles (remediation.report.prometheus) with this function too."""
    lines = []  # type: List[str]
    for name, kind, help_text in metrics:
        family = samples.get(name)
        if not family:
            continue
        lines.append("# HELP %s %s" % (name, prom_escape_help(help_text)))
        lines.append("# TYPE %s %s" % (name, kind))
        for labels, value in family:
            rendered = ",".join('%s="%s"' % (key, prom_escape_label(text)) for key, text in labels)
            if rendered:
                lines.append("%s{%s} %s" % (name, rendered, number(value)))
            else:
                lines.append("%s %s" % (name, number(value)))
    return "\n".join(lines) + "\n" if lines else ""


# Output file modes. The facts JSON holds kernel log lines (NVRM/Xid), which dmesg_restrict keeps from
# unprivileged users: the file is root's alone, in a directory of its own. The textfile must stay readable by
# node_exporter (often not root) and never carries kernel log text (render_textfile drops that section).
FACTS_FILE_MODE = 0o600
FACTS_DIR_MODE = 0o700
TEXTFILE_MODE = 0o644
TEXTFILE_DIR_MODE = 0o755


def write_atomic(path, text, mode=TEXTFILE_MODE, dir_mode=TEXTFILE_DIR_MODE):
    # type: (str, str, int, int) -> None
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename, so readers
    (node_exporter, the controller) see the old file or the new one, never half of one.  The temporary
    name ends in ``.tmp``: node_exporter's textfile collector reads ``*.prom`` only.

    ``mode`` is set on the temporary file before any byte is written (``mkstemp`` creates it 0600), so the text
    is never readable by more than ``mode`` allows, whatever the umask.  A missing directory is created with
    ``dir_mode``; an existing one is left as it is (the role sets its mode)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, dir_mode)
        os.chmod(directory, dir_mode)  # makedirs' mode goes through the umask
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def render_textfile(doc, host=None):
    # type: (Dict[str, Any], Optional[str]) -> str
    """The node_exporter textfile: :func:`render_prometheus` of the document without its kernel log lines."""
    return render_prometheus(dict((k, v) for k, v in doc.items() if k != "kernel_log"), host)


def build_arg_parser():
    # type: () -> argparse.ArgumentParser
    parser = argparse.ArgumentParser(prog="gpuprobe", description="Collect GPU host facts as one JSON document.")
    parser.add_argument(
        "--nvml-timeout", type=float, default=DEFAULT_NVML_TIMEOUT_S, help="seconds before the NVML child is killed"
    )
    parser.add_argument(
        "--simulate-upgrades", action="store_true", help="also run 'unattended-upgrade --dry-run -d' (slow)"
    )
    parser.add_argument("--root", default="/", help="prefix for host file paths (testing against a sample tree)")
    parser.add_argument("--kernel-release", default=None, help="override the booted kernel release (testing)")
    parser.add_argument("--skip-nvml", action="store_true", help="do not touch NVML")
    parser.add_argument("--command-timeout", type=float, default=COMMAND_TIMEOUT_S, help="seconds for apt-config/dmesg")
    parser.add_argument("--indent", type=int, default=None, help="pretty-print the JSON")
    parser.add_argument(
        "--json-out", default=None, metavar="PATH",
        help="write the facts JSON to PATH (atomically, mode 0600: it holds kernel log lines)"
    )
    parser.add_argument(
        "--prom-out", default=None, metavar="PATH",
        help="write a Prometheus textfile to PATH (atomically, mode 0644, no kernel log text)"
    )
    parser.add_argument(
        "--host-label", default=None, help="value of the metrics' host label (default: the host name)"
    )
    return parser


def main(argv=None):
    # type: (Optional[List[str]]) -> int
    args = build_arg_parser().parse_args(argv)
    options = Options(
        nvml_timeout=args.nvml_timeout,
        simulate_upgrades=args.simulate_upgrades,
        root=args.root,
        kernel_release=args.kernel_release,
        skip_nvml=args.skip_nvml,
        command_timeout=args.command_timeout,
    )
    try:
        doc = collect(options)
    except Exception as exc:  # still one JSON document, still exit 0
        doc = {
            "schema": SCHEMA,
            "probe_version": PROBE_VERSION,
            "collected_at": _utc_iso(time.time()),
            "hostname": socket.gethostname(),
            "errors": [{"section": "probe", "error": "%s: %s" % (type(exc).__name__, exc)}],
        }
    text = json.dumps(doc, indent=args.indent, sort_keys=True) + "\n"
    if not (args.json_out or args.prom_out):
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    # Output files (the timer's mode): nothing on stdout; a file that cannot be written is exit status 1.
    status = 0
    outputs = []  # type: List[Tuple[str, Callable[[], str], int, int]]
    if args.json_out:
        outputs.append((args.json_out, lambda: text, FACTS_FILE_MODE, FACTS_DIR_MODE))
    if args.prom_out:
        outputs.append((args.prom_out, lambda: render_textfile(doc, args.host_label), TEXTFILE_MODE, TEXTFILE_DIR_MODE))
    for path, render, mode, dir_mode in outputs:
        try:
            write_atomic(path, render(), mode, dir_mode)
        except Exception as exc:
            sys.stderr.write("gpuprobe: cannot write %s: %s: %s\n" % (path, type(exc).__name__, exc))
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
