"""nvidia-smi / NVML / nvidia-container-cli failure text → :class:`NvmlText`.

``error_class`` is one of (the JSON contract of ``invoke diagnose``):

- ``driver_not_loaded``: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
  "Failed to initialize NVML: Driver Not Loaded", ``nvml error: driver not loaded``;
- ``version_mismatch``: "Failed to initialize NVML: Driver/library version mismatch" (any case, also through
  nvidia-container-cli);
- ``no_devices``: "No devices were found";
- ``library_not_found``: "NVML Shared Library Not Found", ``libnvidia-ml.so…: cannot open shared object file``,
  ``nvidia-smi: command not found``;
- ``gpu_lost``: "Unable to determine the device handle for GPU …: GPU is lost";
- ``handle_unknown_error``: "Unable to determine the device handle for GPU …: Unknown Error";
- ``none``: none of these.

When several appear, the most specific wins, in the order above reversed (a lost GPU explains "no devices",
a version mismatch explains "couldn't communicate"): ``gpu_lost > handle_unknown_error > version_mismatch >
no_devices > library_not_found > driver_not_loaded``. Lines are joined before matching, so a message wrapped
over several lines (a terminal, a poster's newlines) still matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from remediation.parsers._text import Joined, split_lines, unique

__all__ = ["ERROR_CLASSES", "NvmlText", "parse"]

ERROR_CLASSES: tuple[str, ...] = (
    "driver_not_loaded",
    "version_mismatch",
    "no_devices",
    "library_not_found",
    "gpu_lost",
    "handle_unknown_error",
    "none",
)


@dataclass(frozen=True)
class NvmlText:
    """What nvidia-smi/NVML failure text says."""

    error_class: str
    nvml_library_version: str | None
    pci_bus_ids: tuple[str, ...]
    module_missing: bool  # "modprobe: FATAL: Module nvidia… not found"
    missing_modules: tuple[str, ...]  # e.g. ("nvidia", "nvidia-uvm")
    running_kernel: str | None  # from `uname -a`/`uname -r` output or modprobe's /lib/modules/K
    module_kernels: tuple[str, ...]  # kernels under /lib/modules/ that hold an nvidia.ko (from `find` output)
    dkms_missing: bool  # the transcript shows dkms is not installed
    nvml_init_error: str | None  # text after "Failed to initialize NVML:" (also for causes not classified)
    service: str | None  # container service that failed to start (docker compose)
    evidence: tuple[str, ...]

    @property
    def has_error(self) -> bool:
        return self.error_class != "none" or self.nvml_init_error is not None


_F = re.IGNORECASE | re.ASCII
# (class, pattern) in priority order: the first class with a match wins.
_CLASS_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu_lost", re.compile(r"GPU is lost|NVML_ERROR_GPU_IS_LOST", _F)),
    (
        "handle_unknown_error",
        re.compile(r"Unable to determine the device handle for GPU[^\n]{0,40}?: Unknown Error", _F),
    ),
    (
        "version_mismatch",
        re.compile(
            r"(?:nvidia-container-cli: initialization error: )?(?:nvml error: )?driver/library version mismatch"
            r"|NVML_ERROR_LIB_RM_VERSION_MISMATCH",
            _F,
        ),
    ),
    ("no_devices", re.compile(r"No devices were found|nvml error: no (?:cuda-capable )?devices? (?:were )?found", _F)),
    (
        "library_not_found",
        re.compile(
            r"NVML Shared Library Not Found|libnvidia-ml\.so(?:\.1)?: cannot open shared object file"
            r"|could not load NVML library|load library failed: libnvidia-ml|nvidia-smi: (?:command )?not found"
            r"|NVML_ERROR_LIBRARY_NOT_FOUND",
            _F,
        ),
    ),
    (
        "driver_not_loaded",
        re.compile(
            r"couldn.?t communicate with the NVIDIA driver|Failed to initialize NVML: Driver Not Loaded"
            r"|nvml error: driver not loaded|NVML_ERROR_DRIVER_NOT_LOADED|NVIDIA-SMI has failed"
            r"|Make sure that the latest NVIDIA driver is installed and running",
            _F,
        ),
    ),
)

_NVML_VERSION = re.compile(r"NVML library version:\s*([0-9]+(?:\.[0-9]+)*)", _F)
_NVML_INIT = re.compile(r"Failed to initialize NVML:\s*([^\n]*?)\s*(?:\n|$)", _F)
_PCI = re.compile(r"(?<![0-9A-Fa-f:])([0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])(?![0-9A-Fa-f])", re.ASCII)
_MODPROBE = re.compile(
    r"modprobe: FATAL: Module (\S+) not found(?:\s+in directory\s+/lib/modules/(\S+?)/?(?=\s|$))?", _F
)
_UNAME_A = re.compile(r"^\s*Linux\s+\S+\s+([0-9]+\.[0-9]+\S*)\s+#", re.ASCII)
_KERNEL_ALONE = re.compile(r"^\s*([0-9]+\.[0-9]+\.[0-9]+[-.+_~][0-9A-Za-z.+_~-]*)\s*$", re.ASCII)
_MODULE_PATH = re.compile(r"/lib/modules/([^/\s]+)/\S*/nvidia\.ko(?:\.[a-z]+)?\b", re.ASCII)
_DKMS_MISSING = re.compile(r"program 'dkms' is currently not installed|dkms: (?:command )?not found", _F)
_SERVICE = re.compile(r"Cannot start service ([\w.-]+):", _F)
_PROMPT_UNAME_R = re.compile(r"(?:^|[$#]\s*)uname -r\s*$", re.ASCII)


def parse(text: str) -> NvmlText:
    """Parse nvidia-smi/NVML failure text. Never raises: text it does not recognise gives ``error_class='none'``."""
    lines = split_lines(text)
    joined = Joined()
    for i, line in enumerate(lines):
        if line.strip():
            joined.add(i, line, line)
    flat = joined.text

    error_class = "none"
    evidence: list[str] = []
    for name, pattern in _CLASS_PATTERNS:
        match = pattern.search(flat)
        if match:
            error_class = name
            evidence.extend(joined.lines_for(match.start(), match.end()))
            # the rest of a wrapped nvidia-smi message ("Make sure that the latest NVIDIA driver ...")
            for other in pattern.finditer(flat, match.end()):
                evidence.extend(joined.lines_for(other.start(), other.end()))
            break

    version = _NVML_VERSION.search(flat)
    if version:
        evidence.extend(joined.lines_for(version.start(), version.end()))

    init_error: str | None = None
    for i, line in enumerate(lines):
        init = _NVML_INIT.search(line)
        if init:
            init_error = init.group(1).strip() or None
            evidence.append(lines[i].strip())
            break

    missing: list[str] = []
    running_kernel: str | None = None
    for line in lines:
        for mod in _MODPROBE.finditer(line):
            missing.append(mod.group(1).rstrip("."))
            if mod.group(2) and running_kernel is None:
                running_kernel = mod.group(2)
            evidence.append(line.strip())
    module_missing = any(m == "nvidia" or m.startswith(("nvidia-", "nvidia_")) for m in missing)

    for i, line in enumerate(lines):
        uname = _UNAME_A.match(line)
        if uname:
            running_kernel = uname.group(1)
            evidence.append(line.strip())
            break
        if _PROMPT_UNAME_R.search(line) and i + 1 < len(lines):
            alone = _KERNEL_ALONE.match(lines[i + 1].lstrip("# "))
            if alone:
                running_kernel = alone.group(1)
                evidence.append(lines[i + 1].strip())
                break

    module_kernels = unique(m.group(1) for line in lines for m in _MODULE_PATH.finditer(line))
    service = _SERVICE.search(flat)

    return NvmlText(
        error_class=error_class,
        nvml_library_version=version.group(1) if version else None,
        pci_bus_ids=unique(m.group(1) for m in _PCI.finditer(flat)),
        module_missing=module_missing,
        missing_modules=unique(missing),
        running_kernel=running_kernel,
        module_kernels=module_kernels,
        dkms_missing=_DKMS_MISSING.search(flat) is not None,
        nvml_init_error=init_error,
        service=service.group(1) if service else None,
        evidence=unique(line for line in evidence if line),
    )
