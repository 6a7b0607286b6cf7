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
from dataclasses import dataclass

from remediation.parsers._text import split_lines

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


def parse(text: str) -> Dkms:
    """Parse ``dkms status`` / DKMS build output. Never raises; other text gives an empty :class:`Dkms`."""
    lines = [line.strip() for line in split_lines(text)]
    entries: list[DkmsEntry] = []
    failures: list[BuildFailure] = []
    skipped: list[SkippedKernel] = []
    installs: list[DkmsInstall] = []
    errors: list[DkmsError] = []
    dpkg: list[DpkgError] = []
    triggers: list[str] = []

    module: str | None = None
    version: str | None = None
    kernel: str | None = None
    ko: str | None = None
    reasons: list[str] = []
    reason_lines: list[str] = []

    def path_near(index: int) -> tuple[str | None, str | None]:
        for j in range(index, min(index + 4, len(lines))):
            p = _DKMS_PATH.search(lines[j])
            if p:
                return p.group("module"), p.group("version")
        return module, version

    for i, line in enumerate(lines):
        if not line:
            continue
        body = line.lstrip("$#~ ").strip() if line.startswith(("$", "#", "~")) else line

        status = _STATUS_NEW.match(body) or _STATUS_OLD.match(body)
        if status:
            entries.append(
                DkmsEntry(
                    module=status.group("module"),
                    version=status.group("version"),
                    kernel=status.group("kernel"),
                    arch=status.group("arch"),
                    state=status.group("state").lower(),
                    note=_note(status.group("rest")),
                    text=line,
                )
            )
            continue

        path = _DKMS_PATH.search(line)
        if path:
            module, version = path.group("module"), path.group("version")

        for pattern in _KERNEL_CONTEXT:
            km = pattern.search(line)
            if km:
                kernel = _kernel(km.group("kernel"))
                break

        skip = next((m for m in (p.search(line) for p in _SKIP_HEADERS) if m), None)
        if skip:
            reason = skip.group("reason").strip(" .")
            skipped.append(SkippedKernel(_kernel(skip.group("kernel")), reason, module, version, line))
            continue

        for pattern, template in _REASONS:
            rm = pattern.search(line)
            if rm:
                reasons.append(template.format(**rm.groupdict()))
                reason_lines.append(line)

        if line.startswith("Error!") and not _BAD_RETURN.search(line):
            near_module, near_version = path_near(i + 1)
            evidence = [line]
            if i + 1 < len(lines) and _DKMS_PATH.search(lines[i + 1]):
                evidence.append(lines[i + 1])
            errors.append(DkmsError(line[len("Error!") :].strip(), near_module, near_version, tuple(evidence)))
            continue

        bad = _BAD_RETURN.search(line)
        if bad:
            fail_module, fail_version = path_near(i + 1)
            evidence = [*reason_lines, line]
            if i + 1 < len(lines) and _DKMS_PATH.search(lines[i + 1]):
                evidence.append(lines[i + 1])
            failures.append(
                BuildFailure(
                    module=fail_module,
                    version=fail_version,
                    kernel=_kernel(bad.group("kernel")),
                    reason="; ".join(dict.fromkeys(reasons)) or "bad return status for module build",
                    evidence=tuple(dict.fromkeys(evidence)),
                )
            )
            reasons, reason_lines = [], []
            continue

        building = _BUILDING_FAILED.search(line)
        if building:
            fail_module, fail_version = _split_mv(building.group("mv"))
            module, version = fail_module, fail_version
            evidence = [*reason_lines, line]
            failures.append(
                BuildFailure(
                    fail_module,
                    fail_version,
                    _kernel(building.group("kernel")),
                    "; ".join(dict.fromkeys(reasons)) or "build failed",
                    tuple(evidence),
                )
            )
            reasons, reason_lines = [], []
            continue

        failed = _MODULE_FAILED.search(line)
        if failed:
            fail_module, fail_version = _split_mv(failed.group("mv"))
            if not any(f.module == fail_module and f.version == fail_version for f in failures):
                failures.append(BuildFailure(fail_module, fail_version, kernel, "build failed", (line,)))
            else:
                # attach the follow-up line to the failure it repeats
                for k, f in enumerate(failures):
                    if f.module == fail_module and f.version == fail_version:
                        failures[k] = BuildFailure(f.module, f.version, f.kernel, f.reason, (*f.evidence, line))
                        break
            continue

        mv = re.search(r"DKMS module '(?P<mv>[^']+)'", line)
        if mv:
            module, version = _split_mv(mv.group("mv"))

        header = _KO_HEADER.match(line)
        if header:
            ko = header.group("ko")
            continue

        inst = _INSTALLING.search(line)
        if inst:
            path_text = inst.group("path")
            file_ko = path_text.rsplit("/", 1)[-1] if ".ko" in path_text.rsplit("/", 1)[-1] else None
            installs.append(
                DkmsInstall(
                    module=module,
                    version=version,
                    kernel=inst.group("kernel"),
                    ko=file_ko or ko,
                    path=path_text,
                    text=line,
                )
            )
            continue

        pkg = _DPKG_PROCESSING.search(line)
        if pkg:
            dpkg.append(DpkgError(pkg.group("pkg"), None, (line,)))
            continue
        code = _DPKG_STATUS.search(line)
        if code and dpkg and dpkg[-1].exit_status is None:
            last = dpkg[-1]
            dpkg[-1] = DpkgError(last.package, int(code.group("code")), (*last.evidence, line))
            continue

        trig = _TRIGGERS.search(line)
        if trig and trig.group("pkg") not in triggers:
            triggers.append(trig.group("pkg"))

    return Dkms(
        entries=tuple(entries),
        build_failures=tuple(failures),
        skipped_kernels=tuple(skipped),
        installs=tuple(installs),
        errors=tuple(errors),
        dpkg_errors=tuple(dpkg),
        kernel_triggers=tuple(triggers),
        dkms_missing=_DKMS_MISSING.search(text) is not None,
    )
