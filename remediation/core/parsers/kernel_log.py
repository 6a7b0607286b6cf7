"""Kernel log text about NVIDIA (dmesg, journalctl -k, syslog, Talos) → :class:`KernelLog`.

Lines are located by ``NVRM:`` wherever it sits behind a prefix: bare, ``kernel:``, ``[secs.usecs]``,
``[ctime]`` (``dmesg -T``/``--ctime``), syslog ``Mon DD HH:MM:SS host kernel:`` (one or two spaces before the day),
Talos ``IP: kern: level: [RFC3339]:``, diff/quote prefixes (``+> ``), ``#012`` escapes. Only ``NVRM:`` lines can be
Xid events, so a NIC's ``XID 641`` is never one. Multi-line kernel messages (API mismatch, fallen off the bus,
probe routine not called) are matched on the consecutive ``NVRM:`` lines joined, including continuation lines that
carry no timestamp.

Decision on "fallen off the bus": every GPU reported as fallen off the bus is listed in ``fallen_off_bus`` (both the
multi-line "The NVIDIA GPU … has fallen off the bus" block and ``Xid …: 79`` lines); an :class:`XidEvent` with code
79 is recorded only when the line itself says ``Xid``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from remediation.core.catalog import xid_meaning
from remediation.core.parsers._text import Joined, split_lines, strip_quote_prefix, unique

__all__ = [
    "ApiMismatch",
    "FallenOffBus",
    "FirmwareFailure",
    "KernelLog",
    "LogLine",
    "ModInfo",
    "ModuleMissing",
    "ModuleRejection",
    "ProbeFailure",
    "RmInitFailure",
    "XidEvent",
    "parse",
    "split_prefix",
]


@dataclass(frozen=True)
class LogLine:
    """One kernel log line split into its prefix fields and the message."""

    timestamp: str | None
    host: str | None
    facility: str | None
    level: str | None
    message: str


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str  # as printed, e.g. "0000:cb:00"; "unknown" when redacted ("...") or empty
    pid: int | None  # None for pid='<unknown>' or no pid field
    name: str | None  # process name; None for <unknown> or no name field
    meaning: str  # from the Xid catalog
    text: str  # the line
    timestamp: str | None
    host: str | None = None
    detail: str = ""  # what follows the code (and pid/name fields)
    link: int | None = None  # NVLink link number for NVLink Xids ("Link 13", "link 11")
    fatal: bool | None = None  # "Fatal"/"Nonfatal" for NVLink Xids


@dataclass(frozen=True)
class ApiMismatch:
    client_version: str
    module_version: str
    client_process: str | None
    client_pid: int | None
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class FallenOffBus:
    pci: str
    pci_id: str | None  # vendor:device, e.g. "10de:26b5"
    via_xid: bool  # True when reported by an "Xid …: 79" line
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class ProbeFailure:
    kind: str  # "failed" | "not_called" | "no_adapter" | "probe_error"
    device_count: int | None
    pci: str | None
    conflicting_drivers: tuple[str, ...]
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class RmInitFailure:
    pci: str | None
    code: str | None  # e.g. "0x22:0x56:884" (without parentheses)
    minor: int | None
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class ModuleMissing:
    module: str
    kernel: str | None
    text: str


@dataclass(frozen=True)
class ModuleRejection:
    """The kernel refused to load a module for want of a trusted signature (Secure Boot / lockdown).

    ``reason``: ``key-rejected`` ("Key was rejected by service", EKEYREJECTED), ``key-unavailable`` ("Required key
    not available", ENOKEY, older kernels) or ``lockdown`` ("Lockdown: PROG: unsigned module loading is restricted",
    which names the program, not the module). ``module`` is None where the line does not name it.
    """

    module: str | None
    reason: str
    program: str | None
    text: str


@dataclass(frozen=True)
class FirmwareFailure:
    path: str | None  # e.g. "nvidia/570.144/gsp_ga10x.bin"
    error: int | None  # e.g. -2 (ENOENT)
    text: str


@dataclass(frozen=True)
class ModInfo:
    filename: str | None
    version: str | None
    kernel: str | None  # from /lib/modules/KERNEL/ in filename
    dkms: bool  # built by DKMS (…/updates/dkms/…)


@dataclass(frozen=True)
class KernelLog:
    xid_events: tuple[XidEvent, ...]
    api_mismatches: tuple[ApiMismatch, ...]
    fallen_off_bus: tuple[FallenOffBus, ...]
    probe_failures: tuple[ProbeFailure, ...]
    rm_init_failures: tuple[RmInitFailure, ...]
    module_missing: tuple[ModuleMissing, ...]
    firmware_failures: tuple[FirmwareFailure, ...]
    driver_version: str | None  # "loading NVIDIA UNIX … Kernel Module … VERSION"
    open_kernel_module: bool | None
    modinfo: ModInfo | None
    hosts: tuple[str, ...]
    nvrm_lines: tuple[LogLine, ...]
    evidence: tuple[str, ...]
    module_rejections: tuple[ModuleRejection, ...] = ()
    unsigned_module_tainted: bool = False  # "module verification failed: ... tainting kernel" (loaded unsigned)

    @property
    def nvidia_rejected(self) -> tuple[ModuleRejection, ...]:
        """Rejections of an NVIDIA module, and the lockdown lines (which name no module) when NVIDIA context is
        in the same log (a rejected nvidia, or no other module named)."""
        named = [r for r in self.module_rejections if r.module is not None]
        nvidia = [r for r in named if (r.module or "").startswith("nvidia")]
        lockdown = [r for r in self.module_rejections if r.module is None]
        if nvidia or (lockdown and not named):
            return tuple(nvidia + lockdown)
        return ()

    @property
    def is_empty(self) -> bool:
        return not (
            self.module_rejections
            or self.xid_events
            or self.api_mismatches
            or self.fallen_off_bus
            or self.probe_failures
            or self.rm_init_failures
            or self.module_missing
            or self.firmware_failures
        )


_A = re.ASCII
_BUS = r"[0-9A-Fa-f.]{1,8}:[0-9A-Fa-f:.]{2,12}?"  # a PCI bus id as printed (lazy: the caller anchors the end)
_TALOS = re.compile(
    r"^(?P<host>[^\s:]+|\[[0-9A-Fa-f:]+\]): (?P<fac>[a-z]+): (?P<lvl>[a-z]+): "
    r"\[(?P<ts>[0-9]{4}-[0-9]{2}-[0-9]{2}T[^\]]*)\]: ?",
    _A,
)
_SYSLOG = re.compile(r"^(?P<ts>[A-Z][a-z]{2} +[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2}) (?P<host>\S+) kernel: ?", _A)
_ISO_SYSLOG = re.compile(r"^(?P<ts>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(?:Z|[+-][0-9:]+)?) (?P<host>\S+) kernel: ?", _A)
_DMESG_X = re.compile(r"^(?P<fac>kern|user|daemon|syslog) *: *(?P<lvl>[a-z]+) *: ?", _A)
_KMSG_PRIO = re.compile(r"^<[0-9]{1,3}>")
_KERNEL_TAG = re.compile(r"^kernel: ?")
_SECS = re.compile(r"^\[ *(?P<secs>[0-9]+\.[0-9]+)\] ?", _A)
_CTIME = re.compile(r"^\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} +[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4})\] ?", _A)


def split_prefix(line: str) -> LogLine:
    """Split a kernel log line into timestamp, host, facility, level and message. Never raises."""
    rest = strip_quote_prefix(line).strip()
    timestamp: str | None = None
    host: str | None = None
    facility: str | None = None
    level: str | None = None
    for pattern in (_TALOS, _SYSLOG, _ISO_SYSLOG):
        m = pattern.match(rest)
        if m:
            timestamp = " ".join(m.group("ts").split())
            host = m.group("host")
            groups = m.groupdict()
            facility, level = groups.get("fac"), groups.get("lvl")
            rest = rest[m.end() :]
            break
    m = _KMSG_PRIO.match(rest)
    if m:
        rest = rest[m.end() :]
    m = _DMESG_X.match(rest)
    if m:
        facility, level = m.group("fac"), m.group("lvl")
        rest = rest[m.end() :]
    m = _KERNEL_TAG.match(rest)
    if m:
        rest = rest[m.end() :]
    m = _CTIME.match(rest)
    if m:
        timestamp = timestamp or " ".join(m.group("ts").split())
        rest = rest[m.end() :]
    else:
        m = _SECS.match(rest)
        if m:
            timestamp = timestamp or m.group("secs")
            rest = rest[m.end() :]
    return LogLine(timestamp, host, facility, level, rest.strip())


_XID = re.compile(
    r"\bXid\s*\((?:PCI:)?(?P<pci>[^)]{0,40})\)\s*:\s*(?P<code>[0-9]{1,4})\b\s*,?\s*(?P<rest>.*)$", _A | re.I
)
_PID = re.compile(r"^pid\s*=\s*(?P<pid>'[^']*'|\"[^\"]*\"|<[^>]*>|[^,\s]*)\s*,?\s*", _A)
_NAME = re.compile(r"^name\s*=\s*(?P<name>[^,]*?)\s*(?:,\s*|$)", _A)
_LINK = re.compile(r"\blink\s+(-?[0-9]{1,3})\b", _A | re.I)
_FATAL = re.compile(r"\b(Nonfatal|Non-fatal|Fatal)\b", _A | re.I)

_API = (
    re.compile(
        r"API mismatch: the client (?:'(?P<proc>[^']{0,80})' \(pid[ =](?P<pid>[0-9]+)\) )?has the version "
        r"(?P<client>[0-9]+(?:\.[0-9]+)*), but this kernel module has the version (?P<module>[0-9]+(?:\.[0-9]+)*)",
        _A,
    ),
    re.compile(
        r"API mismatch: this NVIDIA kernel module has version (?P<module>[0-9]+(?:\.[0-9]+)*), but this NVIDIA "
        r"driver component has version (?P<client>[0-9]+(?:\.[0-9]+)*)",
        _A,
    ),
)
_FALLEN = re.compile(
    rf"GPU (?:at )?(?:PCI:)?(?P<pci>{_BUS})"
    r"(?::? \(PCI ID: (?P<id>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4})\))?(?::? GPU)?"
    r" (?:installed in this system )?has fallen off the bus",
    _A,
)
_PROBE_FAILED = re.compile(r"The NVIDIA probe routine failed for (?P<n>[0-9]+) device", _A)
_PROBE_NOT_CALLED = re.compile(r"The NVIDIA probe routine was not called for (?P<n>[0-9]+) device", _A)
_CONFLICTING = re.compile(r"\A\W{0,20}This can occur when a driver such as: ?(?P<drivers>[^\n]{0,200}?) was loaded", _A)
_NO_ADAPTER = re.compile(r"No NVIDIA (?:graphics adapter|GPU) (?:probed|found)", _A | re.I)
_PROBE_ERROR = re.compile(
    r"\bnvidia(?:-[a-z]+)? (?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): "
    r"probe (?:of \S+ )?failed with error (?P<err>-?[0-9]+)",
    _A,
)
_PROBE_OF = re.compile(r"\bnvidia: probe of (?P<pci>\S+) failed with error (?P<err>-?[0-9]+)", _A)
_RMINIT = re.compile(
    rf"(?:GPU (?P<pci>{_BUS}):? )?RmInitAdapter failed! ?\((?P<code>[0-9A-Fa-fx:]{{1,40}})\)",
    _A,
)
_RM_INIT_MINOR = re.compile(
    rf"(?:GPU (?P<pci>{_BUS}):? )?rm_init_adapter failed(?:, device minor number (?P<minor>[0-9]+))?",
    _A,
)
_MODPROBE = re.compile(
    r"modprobe: FATAL: Module (?P<mod>\S+?)\.? not found(?: in directory /lib/modules/(?P<k>[^/\s]+))?", _A
)
_INSERT_REJECTED = re.compile(
    r"(?:(?P<prog>modprobe|insmod|systemd-modules-load)(?:\[[0-9]+\])?: )?"
    r"(?:ERROR: could not insert|Failed to insert module|could not insert module) '?(?P<mod>[A-Za-z0-9_-]+?)'?:"
    r" (?P<why>Key was rejected by service|Required key not available)",
    _A,
)
_LOCKDOWN = re.compile(
    r"Lockdown: (?P<prog>[^:\s]+): unsigned module loading is restricted", _A
)
_UNSIGNED_TAINT = re.compile(r"module verification failed: signature and/or required key missing", _A)
_MODULES_DEP = re.compile(r"module (?P<mod>nvidia\S*) not found in modules\.dep", _A | re.I)
_FIRMWARE = re.compile(r"Direct firmware load for (?P<path>\S+) failed with error (?P<err>-?[0-9]+)", _A)
_NO_FIRMWARE = re.compile(r"RmFetchGspRmImages: No firmware image found", _A)
_LOADING = re.compile(
    r"loading NVIDIA UNIX (?P<open>Open )?(?:\S+ )?Kernel Module for \S+ +(?P<ver>[0-9]+(?:\.[0-9]+)+)", _A
)
_KERNEL_MODULE_VER = re.compile(
    r"NVIDIA UNIX (?P<open>Open )?(?:\S+ )?Kernel Module(?: for \S+)? +(?P<ver>[0-9]+(?:\.[0-9]+)+)", _A
)
_MODINFO = re.compile(r"^(?P<key>filename|version|description|vermagic):\s+(?P<val>\S.*)$", _A)
_CONTINUATION = re.compile(r"^\s+\S")


def _eol(flat: str, pos: int) -> int:
    """End of the joined message that contains ``pos``."""
    end = flat.find("\n", pos)
    return len(flat) if end < 0 else end


def _pci(raw: str) -> str:
    raw = raw.strip()
    if not raw or "..." in raw or "\u2026" in raw or not re.search(r"[0-9A-Fa-f]", raw):
        return "unknown"
    return raw


def _pid(raw: str | None) -> int | None:
    if raw is None:
        return None
    raw = raw.strip("'\" ")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 12 else None


def _name(raw: str | None) -> str | None:
    if raw is None:
        return None
    raw = raw.strip("'\" ")
    return None if not raw or raw.lower() in ("<unknown>", "unknown") else raw


def _xid(line: str, log: LogLine) -> XidEvent | None:
    m = _XID.search(log.message)
    if m is None:
        return None
    rest = m.group("rest").strip()
    pid_raw: str | None = None
    name_raw: str | None = None
    pm = _PID.match(rest)
    if pm:
        pid_raw = pm.group("pid")
        rest = rest[pm.end() :]
    nm = _NAME.match(rest)
    if nm:
        name_raw = nm.group("name")
        rest = rest[nm.end() :]
    code = int(m.group("code"))
    link = _LINK.search(rest)
    fatal = _FATAL.search(rest)
    return XidEvent(
        code=code,
        pci=_pci(m.group("pci")),
        pid=_pid(pid_raw),
        name=_name(name_raw),
        meaning=xid_meaning(code),
        text=line.strip(),
        timestamp=log.timestamp,
        host=log.host,
        detail=rest.strip(),
        link=int(link.group(1)) if link else None,
        fatal=(fatal.group(1).lower() == "fatal") if fatal else None,
    )


# ---------------------------------------------------------------------------------------------------------------
# Rules. A line rule looks at one line that is not an ``NVRM:`` line; a message rule looks at the joined ``NVRM:``
# messages once every line is read. Both are walked in order and every rule applies (all matches, not the first).

_Found = dict[str, list[Any]]  # KernelLog field (or a working list: probe_errors, modinfo, tainted) -> items


@dataclass(frozen=True)
class _LineRule:
    """What one non-``NVRM:`` line says: ``find(line, stripped text) -> items``, filed under ``field``."""

    name: str
    field: str
    find: Callable[[LogLine, str], list[Any]]
    evidence: bool = True  # each item found puts the line into the log's evidence


def _modprobe_missing(log: LogLine, text: str) -> list[Any]:
    return [ModuleMissing(m.group("mod"), m.group("k"), text) for m in _MODPROBE.finditer(log.message)]


def _insert_rejected(log: LogLine, text: str) -> list[Any]:
    m = _INSERT_REJECTED.search(log.message)
    if m is None:
        return []
    why = "key-rejected" if m.group("why").startswith("Key") else "key-unavailable"
    return [ModuleRejection(m.group("mod"), why, m.group("prog"), text)]


def _lockdown(log: LogLine, text: str) -> list[Any]:
    m = _LOCKDOWN.search(log.message)
    return [ModuleRejection(None, "lockdown", m.group("prog"), text)] if m else []


def _unsigned_taint(log: LogLine, text: str) -> list[Any]:
    return [True] if _UNSIGNED_TAINT.search(log.message) else []


def _modules_dep(log: LogLine, text: str) -> list[Any]:
    m = _MODULES_DEP.search(log.message)
    return [ModuleMissing(m.group("mod"), None, text)] if m else []


def _firmware_load(log: LogLine, text: str) -> list[Any]:
    m = _FIRMWARE.search(log.message)
    if m is None or "nvidia" not in m.group("path").lower():
        return []
    return [FirmwareFailure(m.group("path"), int(m.group("err")), text)]


def _probe_error(log: LogLine, text: str) -> list[Any]:
    m = _PROBE_OF.search(log.message) or _PROBE_ERROR.search(log.message)
    return [ProbeFailure("probe_error", None, m.group("pci"), (), (text,))] if m else []


def _modinfo_field(log: LogLine, text: str) -> list[Any]:
    m = _MODINFO.match(text)
    return [(m.group("key"), m.group("val").strip())] if m else []


_LINE_RULES: tuple[_LineRule, ...] = (
    _LineRule("modprobe: FATAL: Module … not found", "module_missing", _modprobe_missing),
    _LineRule("insmod/modprobe refused: key rejected or not available", "module_rejections", _insert_rejected),
    _LineRule("Lockdown: unsigned module loading is restricted", "module_rejections", _lockdown),
    _LineRule("module verification failed: loaded unsigned, kernel tainted", "tainted", _unsigned_taint, False),
    _LineRule("module nvidia… not found in modules.dep", "module_missing", _modules_dep),
    _LineRule("Direct firmware load for an nvidia file failed", "firmware_failures", _firmware_load),
    _LineRule("nvidia probe of a PCI device failed with an error", "probe_errors", _probe_error),
    _LineRule("modinfo output: filename/version/description/vermagic", "modinfo", _modinfo_field, False),
)


@dataclass(frozen=True)
class _MessageRule:
    """What the joined ``NVRM:`` messages say: ``apply(flat, joined, found) -> the new items of field``."""

    name: str
    field: str
    apply: Callable[[str, Joined, _Found], list[Any]]


def _api_mismatches(flat: str, joined: Joined, found: _Found) -> list[Any]:
    at: list[tuple[int, ApiMismatch]] = []
    for pattern in _API:
        for m in pattern.finditer(flat):
            groups = m.groupdict()
            mismatch = ApiMismatch(
                client_version=m.group("client"),
                module_version=m.group("module"),
                client_process=groups.get("proc"),
                client_pid=_pid(groups.get("pid")),
                evidence=joined.lines_for(m.start(), _eol(flat, m.end())),
            )
            at.append((m.start(), mismatch))
    return [item for _, item in sorted(at, key=lambda pair: pair[0])]


def _fallen_message(flat: str, joined: Joined, found: _Found) -> list[Any]:
    return [
        FallenOffBus(_pci(m.group("pci")), m.group("id"), False, joined.lines_for(m.start(), m.end()))
        for m in _FALLEN.finditer(flat)
    ]


def _fallen_xid(flat: str, joined: Joined, found: _Found) -> list[Any]:
    xids: list[XidEvent] = found["xid_events"]
    return found["fallen_off_bus"] + [FallenOffBus(e.pci, None, True, (e.text,)) for e in xids if e.code == 79]


def _fallen_per_gpu(flat: str, joined: Joined, found: _Found) -> list[Any]:
    kept: list[FallenOffBus] = []
    for item in found["fallen_off_bus"]:
        if not any(f.pci == item.pci for f in kept):
            kept.append(item)
    return kept


def _probe_failed(flat: str, joined: Joined, found: _Found) -> list[Any]:
    return found["probe_failures"] + [
        ProbeFailure("failed", int(m.group("n")), None, (), joined.lines_for(m.start(), m.end()))
        for m in _PROBE_FAILED.finditer(flat)
    ]


def _probe_not_called(flat: str, joined: Joined, found: _Found) -> list[Any]:
    probes = list(found["probe_failures"])
    for m in _PROBE_NOT_CALLED.finditer(flat):
        drivers: tuple[str, ...] = ()
        end = _eol(flat, m.end())
        conflict = _CONFLICTING.search(flat[end : end + 400])
        if conflict:
            drivers = tuple(d for d in re.split(r"\s*,\s*|\s+or\s+", conflict.group("drivers").strip()) if d)
            end = _eol(flat, end + conflict.end())
        probes.append(ProbeFailure("not_called", int(m.group("n")), None, drivers, joined.lines_for(m.start(), end)))
    return probes


def _no_adapter(flat: str, joined: Joined, found: _Found) -> list[Any]:
    return found["probe_failures"] + [
        ProbeFailure("no_adapter", None, None, (), joined.lines_for(m.start(), m.end()))
        for m in _NO_ADAPTER.finditer(flat)
    ]


def _probe_errors(flat: str, joined: Joined, found: _Found) -> list[Any]:
    return found["probe_failures"] + found["probe_errors"]


def _rm_init_adapter(flat: str, joined: Joined, found: _Found) -> list[Any]:
    return [
        RmInitFailure(m.group("pci"), m.group("code").strip(), None, joined.lines_for(m.start(), m.end()))
        for m in _RMINIT.finditer(flat)
    ]


def _rm_init_minor(flat: str, joined: Joined, found: _Found) -> list[Any]:
    rm: list[RmInitFailure] = list(found["rm_init_failures"])
    for m in _RM_INIT_MINOR.finditer(flat):
        pci = m.group("pci")
        minor = int(m.group("minor")) if m.group("minor") else None
        lines_hit = joined.lines_for(m.start(), m.end())
        for k, failure in enumerate(rm):
            if failure.pci == pci and failure.minor is None:
                rm[k] = RmInitFailure(failure.pci, failure.code, minor, unique(failure.evidence + lines_hit))
                break
        else:
            rm.append(RmInitFailure(pci, None, minor, lines_hit))
    return rm


def _no_firmware_image(flat: str, joined: Joined, found: _Found) -> list[Any]:
    m = _NO_FIRMWARE.search(flat)
    if m is None or found["firmware_failures"]:
        return found["firmware_failures"]
    return [FirmwareFailure(None, None, " ".join(joined.lines_for(m.start(), m.end())))]


_MESSAGE_RULES: tuple[_MessageRule, ...] = (
    _MessageRule("API mismatch, client vs module (either wording), in text order", "api_mismatches", _api_mismatches),
    _MessageRule("GPU … has fallen off the bus (the kernel message)", "fallen_off_bus", _fallen_message),
    _MessageRule("Xid 79 lines: the GPU fell off the bus", "fallen_off_bus", _fallen_xid),
    _MessageRule("one fallen-off-the-bus entry per GPU (the first kept)", "fallen_off_bus", _fallen_per_gpu),
    _MessageRule("the NVIDIA probe routine failed for N devices", "probe_failures", _probe_failed),
    _MessageRule("probe routine not called (and the conflicting drivers)", "probe_failures", _probe_not_called),
    _MessageRule("no NVIDIA graphics adapter/GPU probed or found", "probe_failures", _no_adapter),
    _MessageRule("per-device probe errors from single lines", "probe_failures", _probe_errors),
    _MessageRule("RmInitAdapter failed (with its code)", "rm_init_failures", _rm_init_adapter),
    _MessageRule("rm_init_adapter failed: the minor, joined to its GPU's", "rm_init_failures", _rm_init_minor),
    _MessageRule("no GSP firmware image (unless a firmware load failed)", "firmware_failures", _no_firmware_image),
)


def _driver_version(flat: str) -> tuple[str | None, bool | None]:
    """The loaded module's version and whether it is the open kernel module, from its banner."""
    loading = _LOADING.search(flat) or _KERNEL_MODULE_VER.search(flat)
    if loading is None:
        return None, None
    return loading.group("ver"), loading.group("open") is not None


def _modinfo(fields: list[tuple[str, str]]) -> ModInfo | None:
    """``modinfo`` output (the first value of each key) about an NVIDIA module."""
    modinfo: dict[str, str] = {}
    for key, value in fields:
        modinfo.setdefault(key, value)
    if not (modinfo.get("filename") or (modinfo.get("version") and "nvidia" in modinfo.get("description", "").lower())):
        return None
    filename = modinfo.get("filename")
    kernel_m = re.search(r"/lib/modules/([^/\s]+)/", filename or "")
    return ModInfo(
        filename=filename,
        version=modinfo.get("version"),
        kernel=kernel_m.group(1) if kernel_m else None,
        dkms="/updates/dkms/" in (filename or "") or "/extra/" in (filename or ""),
    )


_FIELDS = (
    *("xid_events", "api_mismatches", "fallen_off_bus", "probe_failures", "rm_init_failures", "module_missing"),
    *("firmware_failures", "module_rejections", "probe_errors", "modinfo", "tainted"),
)


def parse(text: str) -> KernelLog:
    """Parse kernel log text. Never raises; text without NVIDIA lines gives an empty :class:`KernelLog`."""
    joined = Joined()
    found: _Found = {field: [] for field in _FIELDS}
    nvrm_lines: list[LogLine] = []
    hosts: list[str] = []
    evidence: list[str] = []
    in_nvrm = False

    for i, line in enumerate(split_lines(text)):
        if not line.strip():
            joined.break_message()
            in_nvrm = False
            continue
        log = split_prefix(line)
        at = log.message.find("NVRM:")
        if at >= 0:
            nvrm_lines.append(log)
            if log.host and log.host not in hosts:
                hosts.append(log.host)
            payload = log.message[at + len("NVRM:") :]
            # a new timestamped record starts a new message; an un-prefixed NVRM line continues one
            if log.timestamp is not None or at > 0 or not in_nvrm:
                joined.break_message()
            joined.add(i, payload, line)
            in_nvrm = True
            event = _xid(line, LogLine(log.timestamp, log.host, log.facility, log.level, payload))
            if event is not None:
                found["xid_events"].append(event)
                evidence.append(line.strip())
            continue
        if in_nvrm and _CONTINUATION.match(line) and log.timestamp is None:
            joined.add(i, log.message, line)  # wrapped NVRM message without its own prefix
            continue
        joined.break_message()
        in_nvrm = False
        for line_rule in _LINE_RULES:  # non-NVRM lines that still matter
            items = line_rule.find(log, line.strip())
            found[line_rule.field].extend(items)
            evidence.extend(line.strip() for _ in items if line_rule.evidence)
        if log.host and (log.host not in hosts) and ("nvidia" in log.message.lower()):
            hosts.append(log.host)

    flat = joined.text
    for rule in _MESSAGE_RULES:
        found[rule.field] = rule.apply(flat, joined, found)
    driver_version, open_module = _driver_version(flat)

    for field in ("api_mismatches", "fallen_off_bus", "probe_failures", "rm_init_failures"):
        evidence.extend(line for item in found[field] for line in item.evidence)
    evidence.extend(f.text for f in found["firmware_failures"])

    return KernelLog(
        xid_events=tuple(found["xid_events"]),
        api_mismatches=tuple(found["api_mismatches"]),
        fallen_off_bus=tuple(found["fallen_off_bus"]),
        probe_failures=tuple(found["probe_failures"]),
        rm_init_failures=tuple(found["rm_init_failures"]),
        module_missing=tuple(found["module_missing"]),
        firmware_failures=tuple(found["firmware_failures"]),
        driver_version=driver_version,
        open_kernel_module=open_module,
        modinfo=_modinfo(found["modinfo"]),
        hosts=tuple(hosts),
        nvrm_lines=tuple(nvrm_lines),
        evidence=unique(e for e in evidence if e),
        module_rejections=tuple(found["module_rejections"]),
        unsigned_module_tainted=bool(found["tainted"]),
    )
