"""``dkms status`` and DKMS build output → :class:`Dkms`.

``dkms status`` rows, both formats: old ``module, version, kernel, arch: state`` and new ``module/version, kernel,
arch: state`` (also the kernel-less ``module/version: added``). Whatever follows the state is kept as ``note``:
``(original_module exists)``, ``(WARNING! Diff between built and installed module!)``, or a warning glued to the
state with no space (``installedWARNING! ...``); the entry is kept either way. ``Error! …`` lines are kept as
errors (with the module/version of a ``/var/lib/dkms/M/V/`` path on the next line).

Build output: ``Bad return status for module build on kernel: K`` and ``Building DKMS module 'M-V' for K... FAILED!``
are build failures (module/version from the ``/var/lib/dkms/M/V/`` path nearby, the reason from the lines before:
unsupported headers, make's exit status); ``Skipping kernel K …`` / "headers … not installed" are skipped kernels;
``Installing to /lib/modules/K/updates/dkms/`` are installs. A package manager's "installed successfully" after a
failed build is not trusted: the failure stands.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from remediation.core.parsers._text import split_lines

__all__ = [
    "BuildFailure",
    "Dkms",
    "DkmsEntry",
    "DkmsError",
    "DkmsInstall",
    "DpkgError",
    "SkippedKernel",
    "parse",
]


@dataclass(frozen=True)
class DkmsEntry:
    module: str
    version: str
    kernel: str | None
    arch: str | None
    state: str  # "installed", "built", "added", ...
    note: str | None  # e.g. "original_module exists"
    text: str


@dataclass(frozen=True)
class BuildFailure:
    module: str | None
    version: str | None
    kernel: str | None
    reason: str
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class SkippedKernel:
    kernel: str
    reason: str
    module: str | None
    version: str | None
    text: str


@dataclass(frozen=True)
class DkmsInstall:
    module: str | None  # the DKMS module (e.g. nvidia)
    version: str | None
    kernel: str
    ko: str | None  # the kernel object installed (e.g. nvidia-uvm.ko)
    path: str
    text: str


@dataclass(frozen=True)
class DkmsError:
    message: str
    module: str | None
    version: str | None
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class DpkgError:
    package: str
    exit_status: int | None
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Dkms:
    entries: tuple[DkmsEntry, ...]
    build_failures: tuple[BuildFailure, ...]
    skipped_kernels: tuple[SkippedKernel, ...]
    installs: tuple[DkmsInstall, ...]
    errors: tuple[DkmsError, ...]
    dpkg_errors: tuple[DpkgError, ...]
    kernel_triggers: tuple[str, ...]  # "Processing triggers for linux-image-K" packages
    dkms_missing: bool  # dkms itself is not installed

    def installed_kernels(self, module: str = "nvidia") -> tuple[str, ...]:
        """Kernels ``module`` is installed for, from status rows and install lines."""
        out: list[str] = []
        for e in self.entries:
            if e.module == module and e.kernel and e.state == "installed" and e.kernel not in out:
                out.append(e.kernel)
        for i in self.installs:
            if i.module == module and i.kernel not in out:
                out.append(i.kernel)
        return tuple(out)


_A = re.ASCII
# The state is one of DKMS's words, whatever follows it: a note in parentheses, a build warning glued to it
# ("installedWARNING! Diff between built and installed module!"), or anything else (kept as ``note``).
_STATE = r"(?P<state>(?i:installed-weak|installed|unbuilt|built|added|broken))(?![a-z-])(?P<rest>.*)$"
_STATUS_OLD = re.compile(
    r"^(?P<module>[A-Za-z0-9_.+-]+), (?P<version>[^,\s]+)(?:, (?P<kernel>[^,\s]+), (?P<arch>[^,:\s]+))?:\s*"
    + _STATE,
    _A,
)
_STATUS_NEW = re.compile(
    r"^(?P<module>[A-Za-z0-9_.+-]+)/(?P<version>[^,\s/]+)(?:, (?P<kernel>[^,\s]+), (?P<arch>[^,:\s]+))?:\s*"
    + _STATE,
    _A,
)
_PAREN = re.compile(r"\(([^()]*)\)")
_DKMS_PATH = re.compile(r"/var/lib/dkms/(?P<module>[^/\s]+)/(?P<version>[^/\s]+)/", _A)
_BAD_RETURN = re.compile(
    r"Bad return status for module build on kernel: ?(?P<kernel>\S+?)(?: \((?P<arch>[^)]*)\))?$", _A
)
_BUILDING_FAILED = re.compile(
    r"Building DKMS module '(?P<mv>[^']+)' for (?:kernel[- ]?)?(?P<kernel>[^\s.]+(?:\.[^\s.]+)*?)\.*\s*FAILED",
    _A | re.I,
)
_MODULE_FAILED = re.compile(r"DKMS module '(?P<mv>[^']+)' failed to build", _A)
_MODULE_NAMED = re.compile(r"DKMS module '(?P<mv>[^']+)'")
_MODULE_MV = re.compile(r"^(?P<module>.+?)-(?P<version>[0-9]\S*)$", _A)
_SKIP_HEADERS = (
    re.compile(r"Skipping kernel[- ]?(?P<kernel>[0-9]\S*?)\.?\s+(?P<reason>.*)$", _A),
    re.compile(r"Module build for kernel (?P<kernel>\S+) was skipped since (?P<reason>.*)$", _A),
    re.compile(r"Your kernel headers for kernel (?P<kernel>\S+) (?P<reason>cannot be found.*)$", _A),
    re.compile(r"Kernel headers for kernel (?P<kernel>\S+) (?P<reason>(?:not found|are missing|not installed).*)$", _A),
)
_INSTALLING = re.compile(r"Installing (?:to )?(?P<path>/lib/modules/(?P<kernel>[^/\s]+)/\S*)", _A)
_KO_HEADER = re.compile(r"^(?P<ko>[A-Za-z0-9_-]+\.ko(?:\.[a-z]+)?):\s*$", _A)
_KERNEL_CONTEXT = (
    re.compile(r"KERNEL_UNAME=(?P<kernel>\S+)", _A),
    re.compile(r"Building initial module for (?P<kernel>\S+)", _A),
    re.compile(r"running auto installation service for kernel (?P<kernel>\S+?)\.?$", _A),
    re.compile(r"Building module(?:\(s\))? .*for kernel:? (?P<kernel>\S+)", _A),
)
_REASONS = (
    (
        re.compile(r"kernel package (?P<pkg>linux-headers-\S+) is not supported", _A),
        "kernel package {pkg} is not supported",
    ),
    (re.compile(r"\(bad exit status: (?P<code>[0-9]+)\)", _A), "make failed (exit status {code})"),
    (
        re.compile(r"headers? (?:package )?(?:are |is )?(?:not installed|missing)", _A | re.I),
        "kernel headers not installed",
    ),
)
_DPKG_PROCESSING = re.compile(r"dpkg: error processing package (?P<pkg>\S+)", _A)
_DPKG_STATUS = re.compile(r"returned error exit status (?P<code>[0-9]+)", _A)
_TRIGGERS = re.compile(r"Processing triggers for (?P<pkg>linux-image-\S+)", _A)
_DKMS_MISSING = re.compile(r"program 'dkms' is currently not installed|dkms: (?:command )?not found", _A)


def _note(rest: str) -> str | None:
    """What follows the state: ``(original_module exists)`` -> ``original_module exists``; several parenthesised
    notes and any other text (a glued ``WARNING! ...``) joined with ``; ``."""
    parts = [p.strip() for p in _PAREN.findall(rest)]
    outside = " ".join(_PAREN.sub(" ", rest).split()).strip(" ,;:")
    if outside:
        parts.append(outside)
    parts = [p for p in parts if p]
    return "; ".join(parts) if parts else None


def _split_mv(mv: str) -> tuple[str | None, str | None]:
    m = _MODULE_MV.match(mv.strip())
    return (m.group("module"), m.group("version")) if m else (mv.strip() or None, None)


def _kernel(raw: str) -> str:
    raw = raw.strip().rstrip(".")
    return raw[len("kernel-") :] if raw.startswith("kernel-") and raw[7:8].isdigit() else raw


@dataclass
class _State:
    """What :func:`parse` has found so far, and the context the build output has set (module, version, kernel)."""

    lines: list[str]
    entries: list[DkmsEntry] = field(default_factory=list)
    failures: list[BuildFailure] = field(default_factory=list)
    skipped: list[SkippedKernel] = field(default_factory=list)
    installs: list[DkmsInstall] = field(default_factory=list)
    errors: list[DkmsError] = field(default_factory=list)
    dpkg: list[DpkgError] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)
    module: str | None = None
    version: str | None = None
    kernel: str | None = None
    ko: str | None = None
    reasons: list[str] = field(default_factory=list)
    reason_lines: list[str] = field(default_factory=list)

    def path_near(self, index: int) -> tuple[str | None, str | None]:
        """Module and version of a ``/var/lib/dkms/M/V/`` path on the next lines, else the current context."""
        for j in range(index, min(index + 4, len(self.lines))):
            p = _DKMS_PATH.search(self.lines[j])
            if p:
                return p.group("module"), p.group("version")
        return self.module, self.version

    def path_line(self, index: int) -> list[str]:
        """Line ``index`` when it carries a ``/var/lib/dkms/M/V/`` path (evidence for the line before it)."""
        return [self.lines[index]] if index < len(self.lines) and _DKMS_PATH.search(self.lines[index]) else []

    def take_reasons(self, default: str) -> tuple[str, list[str]]:
        """The failure reasons gathered since the last failure (or ``default``) and their lines; starts afresh."""
        reason = "; ".join(dict.fromkeys(self.reasons)) or default
        lines = self.reason_lines
        self.reasons, self.reason_lines = [], []
        return reason, lines


@dataclass(frozen=True)
class _Rule:
    """One kind of line: ``find(state, line, body)`` is truthy on it, then ``act(state, index, line, found)``.

    A rule that ``settles`` the line ends the walk there (the old ``continue``); the others (context) go on.
    """

    name: str
    find: Callable[[_State, str, str], Any]
    act: Callable[[_State, int, str, Any], None]
    settles: bool = True


def _find_status_row(s: _State, line: str, body: str) -> re.Match[str] | None:
    return _STATUS_NEW.match(body) or _STATUS_OLD.match(body)


def _status_row(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    s.entries.append(
        DkmsEntry(
            module=m.group("module"),
            version=m.group("version"),
            kernel=m.group("kernel"),
            arch=m.group("arch"),
            state=m.group("state").lower(),
            note=_note(m.group("rest")),
            text=line,
        )
    )


def _set_path(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    s.module, s.version = m.group("module"), m.group("version")


def _set_kernel(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    s.kernel = _kernel(m.group("kernel"))


def _skipped(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    reason = m.group("reason").strip(" .")
    s.skipped.append(SkippedKernel(_kernel(m.group("kernel")), reason, s.module, s.version, line))


def _find_reasons(s: _State, line: str, body: str) -> list[str]:
    return [template.format(**m.groupdict()) for pattern, template in _REASONS if (m := pattern.search(line))]


def _add_reasons(s: _State, i: int, line: str, reasons: list[str]) -> None:
    s.reasons.extend(reasons)
    s.reason_lines.extend(line for _ in reasons)


def _find_error(s: _State, line: str, body: str) -> bool:
    return line.startswith("Error!") and not _BAD_RETURN.search(line)


def _error(s: _State, i: int, line: str, found: bool) -> None:
    near_module, near_version = s.path_near(i + 1)
    evidence = (line, *s.path_line(i + 1))
    s.errors.append(DkmsError(line[len("Error!") :].strip(), near_module, near_version, evidence))


def _bad_return(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    fail_module, fail_version = s.path_near(i + 1)
    reason, reason_lines = s.take_reasons("bad return status for module build")
    evidence = [*reason_lines, line, *s.path_line(i + 1)]
    kernel = _kernel(m.group("kernel"))
    s.failures.append(BuildFailure(fail_module, fail_version, kernel, reason, tuple(dict.fromkeys(evidence))))


def _building_failed(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    s.module, s.version = _split_mv(m.group("mv"))
    reason, reason_lines = s.take_reasons("build failed")
    s.failures.append(BuildFailure(s.module, s.version, _kernel(m.group("kernel")), reason, (*reason_lines, line)))


def _module_failed(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    fail_module, fail_version = _split_mv(m.group("mv"))
    for k, f in enumerate(s.failures):
        if f.module == fail_module and f.version == fail_version:  # a follow-up line of a failure already seen
            s.failures[k] = BuildFailure(f.module, f.version, f.kernel, f.reason, (*f.evidence, line))
            return
    s.failures.append(BuildFailure(fail_module, fail_version, s.kernel, "build failed", (line,)))


def _set_module_version(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    s.module, s.version = _split_mv(m.group("mv"))


def _find_ko_header(s: _State, line: str, body: str) -> re.Match[str] | None:
    return _KO_HEADER.match(line)


def _set_ko(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    s.ko = m.group("ko")


def _install(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    path_text = m.group("path")
    file_ko = path_text.rsplit("/", 1)[-1] if ".ko" in path_text.rsplit("/", 1)[-1] else None
    kernel = m.group("kernel")
    s.installs.append(DkmsInstall(s.module, s.version, kernel, file_ko or s.ko, path_text, line))


def _dpkg_error(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    s.dpkg.append(DpkgError(m.group("pkg"), None, (line,)))


def _find_dpkg_status(s: _State, line: str, body: str) -> re.Match[str] | None:
    code = _DPKG_STATUS.search(line)
    return code if code and s.dpkg and s.dpkg[-1].exit_status is None else None


def _dpkg_status(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    last = s.dpkg[-1]
    s.dpkg[-1] = DpkgError(last.package, int(m.group("code")), (*last.evidence, line))


def _trigger(s: _State, i: int, line: str, m: re.Match[str]) -> None:
    if m.group("pkg") not in s.triggers:
        s.triggers.append(m.group("pkg"))


def _first(patterns: tuple[re.Pattern[str], ...]) -> Callable[[_State, str, str], re.Match[str] | None]:
    """The first of ``patterns`` that matches somewhere in the line."""
    return lambda s, line, body: next((m for m in (p.search(line) for p in patterns) if m), None)


def _search(pattern: re.Pattern[str]) -> Callable[[_State, str, str], re.Match[str] | None]:
    """``pattern`` somewhere in the line."""
    return lambda s, line, body: pattern.search(line)


_RULES: tuple[_Rule, ...] = (
    _Rule("dkms status row (old or new format)", _find_status_row, _status_row),
    _Rule("a /var/lib/dkms/M/V/ path sets module and version", _search(_DKMS_PATH), _set_path, settles=False),
    _Rule("a line naming the kernel being built for", _first(_KERNEL_CONTEXT), _set_kernel, settles=False),
    _Rule("kernel skipped (headers missing)", _first(_SKIP_HEADERS), _skipped),
    _Rule("a reason the next build failure gives", _find_reasons, _add_reasons, settles=False),
    _Rule("Error! line (not a bad return status)", _find_error, _error),
    _Rule("Bad return status for module build on kernel K", _search(_BAD_RETURN), _bad_return),
    _Rule("Building DKMS module 'M-V' for K ... FAILED", _search(_BUILDING_FAILED), _building_failed),
    _Rule("DKMS module 'M-V' failed to build", _search(_MODULE_FAILED), _module_failed),
    _Rule("DKMS module 'M-V' sets module and version", _search(_MODULE_NAMED), _set_module_version, settles=False),
    _Rule("a NAME.ko: header (the module file the next install is)", _find_ko_header, _set_ko),
    _Rule("Installing to /lib/modules/K/...", _search(_INSTALLING), _install),
    _Rule("dpkg: error processing package P", _search(_DPKG_PROCESSING), _dpkg_error),
    _Rule("returned error exit status N (of the last dpkg error)", _find_dpkg_status, _dpkg_status),
    _Rule("Processing triggers for linux-image-K", _search(_TRIGGERS), _trigger),
)


def parse(text: str) -> Dkms:
    """Parse ``dkms status`` / DKMS build output. Never raises; other text gives an empty :class:`Dkms`."""
    s = _State([line.strip() for line in split_lines(text)])
    for i, line in enumerate(s.lines):
        if not line:
            continue
        body = line.lstrip("$#~ ").strip() if line.startswith(("$", "#", "~")) else line
        for rule in _RULES:
            found = rule.find(s, line, body)
            if found:
                rule.act(s, i, line, found)
                if rule.settles:
                    break
    return Dkms(
        entries=tuple(s.entries),
        build_failures=tuple(s.failures),
        skipped_kernels=tuple(s.skipped),
        installs=tuple(s.installs),
        errors=tuple(s.errors),
        dpkg_errors=tuple(s.dpkg),
        kernel_triggers=tuple(s.triggers),
        dkms_missing=_DKMS_MISSING.search(text) is not None,
    )
