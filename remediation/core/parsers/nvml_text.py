"""nvidia-smi / NVML / nvidia-container-cli failure text, and NVML errors printed by any program → :class:`NvmlText`.

``error_class`` is one of (the JSON contract of ``invoke diagnose``; the probe's classes,
:mod:`remediation.hostside.gpuprobe`, less the probe's own ``timeout``):

- ``driver_not_loaded``: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
  "Failed to initialize NVML: Driver Not Loaded", ``nvml error: driver not loaded``, PyTorch's "RuntimeError: Found
  no NVIDIA driver on your system";
- ``version_mismatch``: "Failed to initialize NVML: Driver/library version mismatch" (any case, also through
  nvidia-container-cli);
- ``no_devices``: "No devices were found";
- ``library_not_found``: "NVML Shared Library Not Found", ``libnvidia-ml.so…: cannot open shared object file``,
  ``nvidia-smi: command not found``;
- ``gpu_lost``: "Unable to determine the device handle for GPU …: GPU is lost";
- ``handle_unknown_error``: "Unable to determine the device handle for GPU …: Unknown Error", and its wording
  variants (``nvmlDeviceGetHandleByIndex(0) failed: Unknown Error``, "Failed to get device handle for GPU 0: unknown
  error", ...);
- ``other``: NVML failed with a code no class above covers ("Insufficient Permissions", "GPU requires restart",
  "Unknown Error" outside a device-handle call), or "Failed to initialize NVML: <reason>" with any other reason;
- ``none``: none of these.

A healthy answer is recognised too: ``nvidia-smi``'s table (``| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04
...`` and one row per GPU) or ``nvidia-smi -q``'s report (``Driver Version : ...``, ``Product Name : ...``) with no
failure text and no ``ERR!`` in a field (nvidia-smi's mark for a value it could not read) gives ``report``
(``"nvidia-smi"`` / ``"nvidia-smi -q"``), ``driver_version`` and ``gpus`` (the product names), and
:attr:`NvmlText.healthy`: ``diagnose`` says "no error" instead of "unknown".

NVML errors printed by programs other than nvidia-smi (container runtimes, device plugins, Python and Go
bindings) are read with NVML's own table (:mod:`remediation.core.parsers.nvml_errors`): an NVML function call or an
NVML word (``nvmlInit_v2 … failed: …``, ``nvml error: …``, ``NVML: …``, ``pynvml…NVMLError_X: …``, a device-handle
call) followed by ``nvmlErrorString``'s text or nvml.h's description of the code, the enum name
(``NVML_ERROR_DRIVER_NOT_LOADED``, go-nvml's ``ERROR_DRIVER_NOT_LOADED``, pynvml's ``NVMLError_DriverNotLoaded``),
or the number (``nvmlInit_v2 failed with error 9``). The code, its name and the NVML function are facts.

When several appear, the most specific wins, in the order above reversed (a lost GPU explains "no devices",
a version mismatch explains "couldn't communicate"): ``gpu_lost > handle_unknown_error > version_mismatch >
no_devices > library_not_found > driver_not_loaded > other``. Lines are joined before matching, so a message
wrapped over several lines (a terminal, a poster's newlines) still matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from remediation.core.parsers import nvml_errors
from remediation.core.parsers._text import Joined, split_lines, unique

__all__ = ["ERROR_CLASSES", "NvmlMention", "NvmlText", "mentions", "parse"]

ERROR_CLASSES: tuple[str, ...] = (
    "driver_not_loaded",
    "version_mismatch",
    "no_devices",
    "library_not_found",
    "gpu_lost",
    "handle_unknown_error",
    "other",
    "none",
)
#: Most specific first: the class of the first one present wins.
_PRIORITY: tuple[str, ...] = (
    "gpu_lost",
    "handle_unknown_error",
    "version_mismatch",
    "no_devices",
    "library_not_found",
    "driver_not_loaded",
    "other",
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
    nvml_error_code: int | None = None  # NVML's return code when the text names one (by number, name or string)
    nvml_error_name: str | None = None  # e.g. "NVML_ERROR_DRIVER_NOT_LOADED"
    nvml_function: str | None = None  # the NVML call that failed, e.g. "nvmlDeviceGetHandleByIndex"
    report: str | None = None  # "nvidia-smi" (the table) | "nvidia-smi -q" (the report) | None: neither
    driver_version: str | None = None  # as the table or report gives it
    gpus: tuple[str, ...] = ()  # product names, one per GPU the table or report lists
    unreadable_fields: bool = False  # "ERR!" in a field of the table or report

    @property
    def has_error(self) -> bool:
        return self.error_class != "none" or self.nvml_init_error is not None

    @property
    def healthy(self) -> bool:
        """An nvidia-smi table or report that lists GPUs, with no failure text and no ``ERR!`` field."""
        return self.report is not None and bool(self.gpus) and not self.has_error and not self.unreadable_fields


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
            r"|Make sure that the latest NVIDIA driver is installed and running"
            r"|Found no NVIDIA driver on your system",
            _F,
        ),
    ),
)

# nvidia-smi's table header and nvidia-smi -q's report (a healthy answer)
_SMI_HEADER = re.compile(r"NVIDIA-SMI ([0-9]+\.[0-9][0-9.]*) +Driver Version: ([0-9]+\.[0-9][0-9.]*)", re.ASCII)
_SMI_Q_DRIVER = re.compile(r"^ *Driver Version *: ([0-9]+\.[0-9][0-9.]*)", re.ASCII)
_SMI_Q_PRODUCT = re.compile(r"^ *Product Name *: (\S.*)$", re.ASCII)
_SMI_Q_LOG = re.compile(r"==NVSMI LOG==", re.ASCII)
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


# --- NVML errors printed by any program ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NvmlMention:
    """One NVML error in the text: the code, its class there, the NVML call, where it is in the joined text."""

    error: nvml_errors.NvmlError
    error_class: str
    function: str | None
    start: int
    end: int


def _phrase(text: str) -> str:
    words = [re.escape(w) for w in re.split(r"\s+", text.strip().rstrip("."))]
    return r"\s+".join(words)


_STRINGS: dict[str, nvml_errors.NvmlError] = {
    " ".join(s.lower().rstrip(".").split()): e for e in nvml_errors.NVML_ERRORS for s in e.strings
}
_STRING_ALTS = "|".join(_phrase(s) for s in sorted(_STRINGS, key=len, reverse=True))
# An NVML word or call before the error on the same logical line: nvmlInit_v2(), nvml error:, NVML:, pynvml,
# NVMLError_X, go-nvml's nvml.DeviceGetCount, or a device-handle call (nvidia-smi and the tools around it).
_CONTEXT = re.compile(r"nvml|" + nvml_errors.HANDLE_CONTEXT.pattern, re.I)
_CONTEXT_WINDOW = 160
# The call an error came from can be further up: a Python traceback names the NVML function a few frames before
# the exception line.
_CALL_WINDOW = 400
_STRING_AFTER_SEPARATOR = re.compile(
    r"(?:[:=(\[]|\b(?:failed|fails|error|errors|returned|returns|with|reason|code)\b)[\s\"'`]*(?P<msg>"
    + _STRING_ALTS
    + r")(?![A-Za-z])",
    re.I,
)
_NAME = re.compile(r"\b(?:NVML_ERROR_[A-Z_]+|NVMLError_[A-Za-z]+|(?<![A-Za-z_])ERROR_[A-Z_]{3,})\b")
_NUMBER = re.compile(
    r"\bnvml\w*(?:\.\w+)?(?:\([^()\n]{0,40}\))?[^\n]{0,60}?\b(?:error|code|returned|returns|ret|status|result)\b"
    r"(?:\s*code)?\s*[:=]?\s*\(?(?P<code>[0-9]{1,3})\b(?![.:][0-9])(?!\s*(?:devices?|gpus?|of|%|[KMG]i?B)\b)",
    re.I,
)
_FUNCTION = re.compile(r"\b(?:nvml\.(?P<go>[A-Z][A-Za-z0-9_]*)|(?P<c>nvml[A-Z][A-Za-z0-9_]*))")


def _function_before(flat: str, start: int) -> str | None:
    window = flat[max(0, start - _CALL_WINDOW) : start]
    found: str | None = None
    for m in _FUNCTION.finditer(window):
        found = m.group("c") or f"nvml{m.group('go')}"
    return found


def _mention(flat: str, error: nvml_errors.NvmlError, start: int, end: int) -> NvmlMention:
    window = flat[max(0, start - _CALL_WINDOW) : end]
    function = _function_before(flat, start)
    handle = nvml_errors.HANDLE_CONTEXT.search(window) is not None
    return NvmlMention(error, nvml_errors.class_for(error, handle=handle), function, start, end)


def mentions(flat: str) -> list[NvmlMention]:
    """Every NVML error named in ``flat`` (one logical text), in order of appearance. Never raises."""
    found: list[NvmlMention] = []
    for m in _NAME.finditer(flat):
        name = m.group(0)
        if name.startswith("ERROR_") and not _CONTEXT.search(flat[max(0, m.start() - _CONTEXT_WINDOW) : m.end()]):
            continue  # go-nvml's bare names count only next to NVML
        error = nvml_errors.by_name(name)
        if error is not None:
            found.append(_mention(flat, error, m.start(), m.end()))
    for m in _STRING_AFTER_SEPARATOR.finditer(flat):
        start = m.start("msg")
        if not _CONTEXT.search(flat[max(0, start - _CONTEXT_WINDOW) : start]):
            continue
        error = _STRINGS.get(" ".join(m.group("msg").lower().split()))
        if error is not None:
            found.append(_mention(flat, error, start, m.end("msg")))
    for m in _NUMBER.finditer(flat):
        error = nvml_errors.by_code(int(m.group("code")))
        if error is not None:
            found.append(_mention(flat, error, m.start("code"), m.end("code")))
    return sorted(found, key=lambda x: x.start)


def parse(text: str) -> NvmlText:
    """Parse nvidia-smi/NVML failure text. Never raises: text it does not recognise gives ``error_class='none'``."""
    lines = split_lines(text)
    joined = Joined()
    for i, line in enumerate(lines):
        if line.strip():
            joined.add(i, line, line)
    flat = joined.text

    # Every class the text shows, from nvidia-smi's own wording and from NVML errors named by any program.
    spans: dict[str, list[tuple[int, int]]] = {}
    for name, pattern in _CLASS_PATTERNS:
        for match in pattern.finditer(flat):
            spans.setdefault(name, []).append((match.start(), match.end()))
    found = mentions(flat)
    for mention in found:
        spans.setdefault(mention.error_class, []).append((mention.start, mention.end))
    error_class = next((name for name in _PRIORITY if name in spans), "none")
    evidence: list[str] = []
    for start, end in sorted(spans.get(error_class, ())):
        evidence.extend(joined.lines_for(start, end))
    chosen = next((m for m in found if m.error_class == error_class), found[0] if found else None)

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
    if error_class == "none" and init_error is not None:
        error_class = "other"  # "Failed to initialize NVML: <a reason no class covers>"

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

    report, driver, gpus = _healthy_report(lines)

    return NvmlText(
        report=report,
        driver_version=driver,
        gpus=gpus,
        unreadable_fields=report is not None and "ERR!" in flat,
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
        nvml_error_code=chosen.error.code if chosen else None,
        nvml_error_name=chosen.error.name if chosen else None,
        nvml_function=chosen.function if chosen else None,
    )


def _healthy_report(lines: list[str]) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(report, driver version, GPU names) of an nvidia-smi table or nvidia-smi -q report in ``lines``."""
    for i, line in enumerate(lines):
        header = _SMI_HEADER.search(line)
        if header is not None:
            return "nvidia-smi", header.group(2), _table_gpus(lines[i + 1 :])
    driver: str | None = None
    names: list[str] = []
    seen_log = False
    for line in lines:
        seen_log = seen_log or _SMI_Q_LOG.search(line) is not None
        d = _SMI_Q_DRIVER.match(line)
        if d is not None and driver is None:
            driver = d.group(1)
        p = _SMI_Q_PRODUCT.match(line)
        if p is not None:
            names.append(p.group(1).strip())
    if driver is not None and (seen_log or names):
        return "nvidia-smi -q", driver, tuple(names)
    return None, None, ()


def _table_gpus(lines: list[str]) -> tuple[str, ...]:
    """GPU names from the table's rows: ``|   0  NVIDIA H200       On  |   00000000:00:06.0 Off |   0 |``."""
    names: list[str] = []
    for line in lines:
        if line.startswith("| Processes"):
            break
        cells = line.strip().strip("|").split("|")
        if len(cells) < 3:
            continue
        words = cells[0].split()
        if len(words) >= 3 and words[0].isdigit() and words[-1] in ("On", "Off", "N/A") and _PCI.search(cells[1]):
            names.append(" ".join(words[1:-1]))
    return tuple(names)
