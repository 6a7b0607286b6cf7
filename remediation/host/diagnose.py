"""Triage field text: detect its kind, parse it, turn the facts into catalog findings.

``diagnose(text)`` is what ``invoke diagnose FILE`` runs. Its JSON (:meth:`DiagnoseResult.to_dict`) is exactly::

    {"kind": str, "facts": {...}, "findings": [{"id", "scenario", "severity", "summary", "evidence", "remedy"}]}

and, for a paste of several kinds (parts of two kinds, or ``uname``'s output beside one), also
``"parts": [{"kind", "lines": [first, last], "findings": [id, ...]}]`` and
``"unread": [{"lines": [first, last], "reason": "not recognised"}]``: the paste is split into its parts
(:mod:`remediation.host.paste`), each part is diagnosed as its kind, the host parts' evidence goes through the rules
together (cross-kind: ``dkms status`` for one kernel, ``uname -r`` naming another → GPU-DRV-001), and the findings are
merged critical first, a finding ID kept once. ``kind`` and ``facts`` stay the paste read as one kind. An explicit
``kind`` reads the whole text as that kind, as before.

Findings are listed critical first, then warning, then info (in the rules' order within a severity), for a paste of
one kind as for several (:func:`critical_first`). :func:`render_text` gives them in full (runbook included) or brief
(``explain=False``: header, summary, two evidence lines, the one command of :func:`remedy_command`).

- Text over the input cap (:func:`remediation.core.parsers.check_size`, 8 MiB) raises
  :class:`~remediation.core.errors.ParseError` naming the input, its size, the cap and the fix.
- Empty (or whitespace-only) text raises :class:`~remediation.core.errors.ParseError` naming the input.
- Text of no known kind is not an error: the result has kind ``"unknown"``, empty facts and no findings, so a
  batch of files can be triaged without one odd file stopping it. An explicit ``kind`` that is not registered is a
  caller mistake and raises ``ParseError`` listing the known kinds.
- ``nvml`` text is also read as a kernel log, so kernel lines pasted with the nvidia-smi output (RmInitAdapter,
  Xid, API mismatch) are evidence too; their facts sit under ``facts["kernel_log"]``.
- ``nvml`` text that is a healthy ``nvidia-smi`` table or ``nvidia-smi -q`` report: no finding, facts ``healthy``
  (true), ``report``, ``driver_version``, ``gpus``; :func:`render_text` says "no error".
- ``apt-history`` also reads ``/var/log/dpkg.log`` excerpts: transactions with ``source`` ``"dpkg.log"``,
  ``actor`` ``"unknown"`` (dpkg.log names none) and ``states`` (each package's last ``status``).
- ``unattended-upgrades-log`` facts: ``packages`` (what its runs upgraded or would upgrade, in order),
  ``kernel_packages``, ``nvidia_packages`` (of those), ``blacklisted`` (the ``Package-Blacklist`` entries as the
  newest run logs them: "Initial blacklist"), ``blacklisted_packages`` (packages it kept back because of the
  blacklist: "Package X is blacklisted."), ``held_packages``, ``allowed_origins`` (newest run), ``removed``,
  ``dry_run`` (every run was a dry run) and ``runs``.

Findings come from the rules of :mod:`remediation.core.checks` (one rule per finding ID, the same ones the audit runs on
a host's facts), evaluated on the evidence parsed from the text (:mod:`remediation.core.checks.evidence`); see the rule
modules for each ID's decision and granularity (e.g. one GPU-HW-005 per Xid code and GPU, one GPU-KRN-006 per
input). This module only parses the text and lays the facts out as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from remediation.core import catalog
from remediation.core.checks import evaluate
from remediation.core.checks import evidence as ev_mod
from remediation.core.errors import ParseError
from remediation.core.findings import Finding, Severity
from remediation.core.parsers import KINDS, UNKNOWN, check_size, detect_kind, kinds, scores
from remediation.core.parsers import apt_history as apt_mod
from remediation.core.parsers import dkms as dkms_mod
from remediation.core.parsers import kernel_log as klog_mod
from remediation.core.parsers import nvml_text as nvml_mod
from remediation.core.parsers import unattended_upgrades as uu_mod
from remediation.host import paste

__all__ = ["DiagnoseResult", "PartResult", "critical_first", "diagnose", "remedy_command", "render_text"]

_FINDING_KEYS = ("id", "scenario", "severity", "summary", "evidence", "remedy")


@dataclass(frozen=True)
class PartResult:
    """One part of a paste of several kinds: its kind, its lines (1-based, inclusive), its own findings."""

    kind: str
    first: int
    last: int
    findings: tuple[Finding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "lines": [self.first, self.last], "findings": [f.id for f in self.findings]}


@dataclass(frozen=True)
class DiagnoseResult:
    kind: str
    facts: dict[str, Any]
    findings: tuple[Finding, ...]
    parts: tuple[PartResult, ...] = ()  # only for a paste of several kinds
    unread: tuple[tuple[int, int], ...] = ()  # line ranges of such a paste that are of no known kind

    @property
    def worst_severity(self) -> Severity | None:
        return Severity.worst(f.severity for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "facts", "findings": [{"id", "scenario", "severity", "summary", "evidence", "remedy"}]}``, and
        for a paste of several kinds ``parts`` (``[{"kind", "lines": [first, last], "findings": [id, ...]}]``) and
        ``unread`` (``[{"lines": [first, last], "reason": "not recognised"}]``)."""
        doc: dict[str, Any] = {
            "kind": self.kind,
            "facts": self.facts,
            "findings": [{key: f.to_dict()[key] for key in _FINDING_KEYS} for f in self.findings],
        }
        if self.parts:
            doc["parts"] = [p.to_dict() for p in self.parts]
            doc["unread"] = [{"lines": [a, b], "reason": "not recognised"} for a, b in self.unread]
        return doc


def diagnose(text: str, kind: str | None = None, source: str = "<text>") -> DiagnoseResult:
    """Detect (or take) the kind of ``text``, parse it and map the facts to findings.

    ``source`` names the input in error messages (a file name, ``<stdin>``). Without ``kind``, a paste of several
    kinds is split into its parts (:mod:`remediation.host.paste`) and each is diagnosed (:func:`_several`).
    """
    check_size(text, source)
    if not text or not text.strip():
        raise ParseError(f"nothing to diagnose: {source} is empty")
    parts: list[paste.Part] = []
    if kind is None:
        by_kind = scores(text)
        kind = detect_kind(text, by_kind)
        families = {_family(name) for name, value in by_kind.items() if value > 0}
        if len(families) > 1 or (families and paste.has_transcript(text)):
            parts = paste.split(text, kind)
    if kind == UNKNOWN:
        return DiagnoseResult(UNKNOWN, {}, ())
    if _of_several_kinds(kind, parts):
        return _several(text, kind, parts)
    spec = kinds().get(kind)
    handler = _HANDLERS.get(kind) or (spec.diagnose if spec is not None else None)
    if handler is None:
        known = ", ".join(sorted(kinds()))
        raise ParseError(f"{source}: unknown kind {kind!r} (known: {known})")
    facts, findings = handler(text)
    return DiagnoseResult(kind, facts, critical_first(findings))


def critical_first(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """``findings`` critical first, then warning, then info; in their order within a severity (a stable sort)."""
    return tuple(sorted(findings, key=lambda f: -f.severity.rank))


# --- a paste of several kinds -------------------------------------------------------------------------------

#: Host kinds whose text the combined evidence reads as a transcript (nvidia-smi, kernel lines, uname, dkms).
_TRANSCRIPT_KINDS = frozenset({"nvml", "kernel-log", paste.TRANSCRIPT, "dkms"})


def _family(kind: str) -> str:
    return "nvml" if kind in ("nvml", "kernel-log", paste.TRANSCRIPT) else kind


def _of_several_kinds(kind: str, parts: list[paste.Part]) -> bool:
    """Parts of two kinds (kernel lines beside nvidia-smi output count as one), or uname's output beside a kind."""
    known = [p for p in parts if p.kind != UNKNOWN]
    if len(known) < 2:
        return False
    families = {_family(p.kind) for p in known if p.kind != paste.TRANSCRIPT} | {_family(kind)}
    return len(families) > 1 or any(p.kind == paste.TRANSCRIPT for p in known)


def _several(text: str, kind: str, parts: list[paste.Part]) -> DiagnoseResult:
    """Each part with its own kind's diagnosis, and every host part's evidence together through the same rules.

    ``kind`` and ``facts`` stay what the paste read as one kind gives (as before parts existed); ``findings`` are
    the host rules on all host parts at once (so a rule sees ``dkms status`` and ``uname -r`` side by side) plus each
    other part's findings, a finding ID kept from the first part that has it, critical first.
    """
    handler = _HANDLERS.get(kind) or kinds()[kind].diagnose
    assert handler is not None
    facts, _ = handler(text)
    results: list[PartResult] = []
    by_kind: dict[str, list[str]] = {}
    for part in parts:
        if part.kind == UNKNOWN:
            continue
        by_kind.setdefault(part.kind, []).append(part.text)
        part_handler = _HANDLERS.get(part.kind) or (
            kinds()[part.kind].diagnose if part.kind in kinds() else None
        )
        found = tuple(part_handler(part.text)[1]) if part_handler is not None else ()
        results.append(PartResult(part.kind, part.first, part.last, found))

    def joined(*names: str) -> str:
        return "\n".join(t for name in names for t in by_kind.get(name, ()))

    host: list[Finding] = []
    if any(name in by_kind for name in _HANDLERS):
        transcript_text = "\n".join(p.text for p in parts if p.kind in _TRANSCRIPT_KINDS)
        transcript = nvml_mod.parse(transcript_text)
        if transcript.running_kernel is None:
            releases = [paste.kernel_release(line) for line in joined(paste.TRANSCRIPT).split("\n")]
            running = next((r for r in releases if r), None)
            if running is not None:
                transcript = replace(transcript, running_kernel=running)
        from_text = ev_mod.from_nvml_text(transcript, klog_mod.parse(transcript_text))
        evidence = replace(
            from_text,
            apt_history=apt_mod.parse(joined("apt-history")),
            dkms=dkms_mod.parse(joined("dkms")) if "dkms" in by_kind else None,
            unattended_log=uu_mod.parse(joined("unattended-upgrades-log")),
        )
        host = list(evaluate(evidence))
    merged: list[Finding] = list(host)
    seen = {f.id for f in host}
    for result in results:
        if result.kind in _HANDLERS:
            continue  # read above, with the other host parts
        new = [f for f in result.findings if f.id not in seen]
        seen.update(f.id for f in new)
        merged.extend(new)
    unread = tuple((p.first, p.last) for p in parts if p.kind == UNKNOWN)
    return DiagnoseResult(kind, facts, critical_first(merged), tuple(results), unread)


# --- nvml ------------------------------------------------------------------------------------------------------


def _nvml(text: str) -> tuple[dict[str, Any], list[Finding]]:
    parsed = nvml_mod.parse(text)
    facts: dict[str, Any] = {
        "error_class": parsed.error_class,
        "nvml_library_version": parsed.nvml_library_version,
        "pci_bus_ids": list(parsed.pci_bus_ids),
        "module_missing": parsed.module_missing,
        "missing_modules": list(parsed.missing_modules),
        "running_kernel": parsed.running_kernel,
        "module_kernels": list(parsed.module_kernels),
        "dkms_missing": parsed.dkms_missing,
        "nvml_init_error": parsed.nvml_init_error,
        "service": parsed.service,
        "nvml_error_code": parsed.nvml_error_code,
        "nvml_error_name": parsed.nvml_error_name,
        "nvml_function": parsed.nvml_function,
        "evidence": list(parsed.evidence),
        "report": parsed.report,
        "driver_version": parsed.driver_version,
        "gpus": list(parsed.gpus),
        "healthy": parsed.healthy,
    }
    klog = klog_mod.parse(text)
    if not klog.is_empty:
        facts["kernel_log"] = _kernel_facts(klog)
    return facts, list(evaluate(ev_mod.from_nvml_text(parsed, klog)))


# --- kernel log --------------------------------------------------------------------------------------------------


def _kernel(text: str) -> tuple[dict[str, Any], list[Finding]]:
    log = klog_mod.parse(text)
    return _kernel_facts(log), list(evaluate(ev_mod.from_kernel_log(log)))


def _kernel_facts(log: klog_mod.KernelLog) -> dict[str, Any]:
    return {
        "xid_events": [
            {
                "code": x.code,
                "pci": x.pci,
                "pid": x.pid,
                "meaning": x.meaning,
                "name": x.name,
                "timestamp": x.timestamp,
                "host": x.host,
                "link": x.link,
                "fatal": x.fatal,
                "text": x.text,
            }
            for x in log.xid_events
        ],
        "api_mismatches": [
            {
                "client_version": a.client_version,
                "module_version": a.module_version,
                "client_process": a.client_process,
                "client_pid": a.client_pid,
            }
            for a in log.api_mismatches
        ],
        "fallen_off_bus": [
            {"pci": f.pci, "pci_id": f.pci_id, "via_xid": f.via_xid, "xid_equivalent": 79} for f in log.fallen_off_bus
        ],
        "probe_failures": [
            {
                "kind": p.kind,
                "device_count": p.device_count,
                "pci": p.pci,
                "conflicting_drivers": list(p.conflicting_drivers),
            }
            for p in log.probe_failures
        ],
        "rm_init_failures": [{"pci": r.pci, "code": r.code, "minor": r.minor} for r in log.rm_init_failures],
        "module_missing": [{"module": m.module, "kernel": m.kernel} for m in log.module_missing],
        "firmware_failures": [{"path": f.path, "error": f.error} for f in log.firmware_failures],
        "module_rejections": [
            {"module": r.module, "reason": r.reason, "program": r.program} for r in log.module_rejections
        ],
        "unsigned_module_tainted": log.unsigned_module_tainted,
        "driver_version": log.driver_version,
        "open_kernel_module": log.open_kernel_module,
        "modinfo": None
        if log.modinfo is None
        else {
            "filename": log.modinfo.filename,
            "version": log.modinfo.version,
            "kernel": log.modinfo.kernel,
            "dkms": log.modinfo.dkms,
        },
        "hosts": list(log.hosts),
    }


# --- apt history -------------------------------------------------------------------------------------------------


def _apt(text: str) -> tuple[dict[str, Any], list[Finding]]:
    history = apt_mod.parse(text)

    def action_dict(a: apt_mod.AptAction) -> dict[str, Any]:
        return {
            "action": a.action,
            "package": a.package,
            "arch": a.arch,
            "version": a.version,
            "old_version": a.old_version,
            "automatic": a.automatic,
        }

    facts: dict[str, Any] = {
        "transactions": [
            {
                "start": t.start,
                "end": t.end,
                "commandline": t.commandline,
                "actor": t.actor,
                "requested_by": t.requested_by,
                "dry_run": t.dry_run,
                "error": t.error,
                "source": t.source,
                "states": dict(t.states),
                "actions": [action_dict(a) for a in t.actions],
            }
            for t in history.transactions
        ],
        "kernel_installs": [
            {
                **action_dict(a),
                "kernel_release": a.kernel_release,
                "start": t.start,
                "actor": t.actor,
                "source": t.source,
            }
            for t, a in history.kernel_installs()
        ],
        "nvidia_changes": [
            {**action_dict(a), "start": t.start, "actor": t.actor, "source": t.source}
            for t, a in history.nvidia_changes()
        ],
    }
    return facts, list(evaluate(ev_mod.from_apt_history(history)))


# --- dkms --------------------------------------------------------------------------------------------------------


def _dkms(text: str) -> tuple[dict[str, Any], list[Finding]]:
    parsed = dkms_mod.parse(text)
    facts: dict[str, Any] = {
        "entries": [
            {
                "module": e.module,
                "version": e.version,
                "kernel": e.kernel,
                "arch": e.arch,
                "state": e.state,
                "note": e.note,
            }
            for e in parsed.entries
        ],
        "build_failures": [
            {"module": f.module, "version": f.version, "kernel": f.kernel, "reason": f.reason}
            for f in parsed.build_failures
        ],
        "skipped_kernels": [
            {"kernel": s.kernel, "reason": s.reason, "module": s.module, "version": s.version}
            for s in parsed.skipped_kernels
        ],
        "installs": [
            {"module": i.module, "version": i.version, "kernel": i.kernel, "ko": i.ko} for i in parsed.installs
        ],
        "errors": [{"message": e.message, "module": e.module, "version": e.version} for e in parsed.errors],
        "dpkg_errors": [{"package": d.package, "exit_status": d.exit_status} for d in parsed.dpkg_errors],
        "kernel_triggers": list(parsed.kernel_triggers),
        "dkms_missing": parsed.dkms_missing,
    }
    return facts, list(evaluate(ev_mod.from_dkms(parsed)))


# --- unattended-upgrades log -------------------------------------------------------------------------------------


def _unattended(text: str) -> tuple[dict[str, Any], list[Finding]]:
    log = uu_mod.parse(text)
    facts: dict[str, Any] = {
        "packages": list(log.packages),
        "kernel_packages": list(log.kernel_packages),
        "nvidia_packages": list(log.nvidia_packages),
        "blacklisted": list(log.blacklist or ()),
        "blacklisted_packages": list(log.blacklisted_packages),
        "held_packages": list(log.held_packages),
        "allowed_origins": list(log.allowed_origins or ()),
        "removed": list(dict.fromkeys(p for r in log.runs for p in r.removed)),
        "dry_run": bool(log.runs) and all(r.dry_run for r in log.runs),
        "runs": [
            {
                "start": r.start,
                "dry_run": r.dry_run,
                "result": r.result,
                "packages": list(r.packages),
                "kernel_packages": list(r.kernel_packages),
                "nvidia_packages": list(r.nvidia_packages),
                "blacklist": None if r.blacklist is None else list(r.blacklist),
                "allowed_origins": None if r.allowed_origins is None else list(r.allowed_origins),
                "removed": list(r.removed),
                "kept_back": [{"package": k.package, "reason": k.reason} for k in r.kept_back],
                "conffile_prompts": list(r.conffile_prompts),
                "errors": list(r.errors),
            }
            for r in log.runs
        ],
    }
    return facts, list(evaluate(ev_mod.from_unattended_log(log)))


_HANDLERS = {
    "nvml": _nvml,
    "kernel-log": _kernel,
    "apt-history": _apt,
    "dkms": _dkms,
    "unattended-upgrades-log": _unattended,
}
assert set(_HANDLERS) <= set(KINDS), "every diagnose handler needs a registered kind"


# --- text rendering ----------------------------------------------------------------------------------------------


def _span(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


#: Programs a remedy's command starts with (the one command the brief output names).
_PROGRAMS = ("invoke", "az", "kubectl", "export", "nvidia-smi", "sudo", "systemctl", "helm", "modprobe", "dkms")
_PROGRAM = re.compile(r"(?<![\w./-])(?:" + "|".join(re.escape(p) for p in _PROGRAMS) + r") +[^\s`]")
_BACKTICKED = re.compile(r"`([^`]+)`")
#: Where a command written in running text ends: a clause break, a parenthesis, "then"/"if"/"past" words.
_COMMAND_END = re.compile(r"[;()`]|, | (?:then|if|past|or|and) ")
#: Words that make a command found in running text prose ("the kubectl patch from ...", "invoke X prints ...").
_PROSE = frozenset({"after", "for", "from", "on", "prints", "the", "with"})
_CLAUSE_START = re.compile(r"(?:^|; |\(|, then |then )$")
_BARE_PLACEHOLDER = re.compile(r"(?<![\w<.:/=-])([A-Z][A-Z_]*)(?![\w>.:/=-])")
_BRACED = re.compile(r"\{([A-Za-z][\w-]*)\}")
_FLAG_VALUE = re.compile(r"(--([a-z][\w-]*))([ =])([A-Z][A-Z_]*)(?![\w.:/=-])")
#: Evidence lines the brief output shows per finding (the summary line comes first), and their width.
_BRIEF_EVIDENCE = 2
_BRIEF_WIDTH = 200


def mark_placeholders(text: str) -> str:
    """``text`` with its unfilled values visibly marked: ``{host}`` → ``<host>``, ``--location LOCATION`` →
    ``--location <location>`` (a flag followed by an upper-case word such as ``MODEL``, ``RG``, ``N``)."""
    text = _BRACED.sub(lambda m: f"<{m.group(1)}>", text)
    return _FLAG_VALUE.sub(lambda m: f"{m.group(1)}{m.group(3)}<{m.group(2)}>", text)


def remedy_command(remedy: str) -> str | None:
    """The first command in ``remedy`` (a backticked one, or one written in the text: ``invoke ...``, ``az ...``,
    ``kubectl ...``, ``export ...``), unfilled values marked (:func:`mark_placeholders`); ``None`` when it has none
    (a role, an instruction)."""
    candidates: list[tuple[int, str]] = []
    for match in _BACKTICKED.finditer(remedy):
        if _PROGRAM.match(match.group(1)):
            candidates.append((match.start(), match.group(1)))
    masked = _BACKTICKED.sub(lambda m: " " * len(m.group(0)), remedy)
    for found in _PROGRAM.finditer(masked):
        if not _CLAUSE_START.search(masked[: found.start()]):
            continue
        rest = masked[found.start() :]
        end = _COMMAND_END.search(rest)
        command = (rest if end is None else rest[: end.start()]).strip().rstrip(".,")
        if not _PROSE.intersection(command.split()[1:]):
            candidates.append((found.start(), command))
            break
    if not candidates:
        return None
    command = mark_placeholders(min(candidates)[1].strip())
    return _BARE_PLACEHOLDER.sub(lambda m: f"<{m.group(1).lower()}>", command)


def _brief_line(line: str) -> str:
    return line if len(line) <= _BRIEF_WIDTH else line[: _BRIEF_WIDTH - 1] + "…"


def _brief(finding: Finding, title: str) -> list[str]:
    """A finding in a few lines: header, summary, at most two evidence lines, the remedy and the one command."""
    out = [f"[{finding.severity.value.upper()}] {finding.id} ({finding.scenario.value}) {title}"]
    out.append(f"  {finding.summary}")
    lines = [line.strip() for item in finding.evidence for line in item.splitlines() if line.strip()]
    out.extend(f"  | {_brief_line(line)}" for line in lines[:_BRIEF_EVIDENCE])
    if len(lines) > _BRIEF_EVIDENCE:
        out.append(f"  | (+{len(lines) - _BRIEF_EVIDENCE} more evidence lines: --explain)")
    remedy = mark_placeholders(finding.remedy)
    command = remedy_command(finding.remedy)
    rest = remedy[len(command) :].strip() if command is not None and remedy.startswith(command) else None
    if command is None or not (rest == "" or (rest is not None and rest.startswith("(") and rest.endswith(")"))):
        out.append(f"  fix: {remedy}")
    if command is not None:
        out.append(f"  run: {command}")
    return out


def render_text(result: DiagnoseResult, explain: bool = True) -> str:
    """Human-readable triage, findings critical first. ``explain`` (the default here; ``invoke diagnose --explain``):
    each finding, its evidence, remedy and the runbook's five sections. Otherwise brief (``invoke diagnose``'s
    default): per finding a header line, its summary, at most two evidence lines, the remedy when it is more than a
    command, and the one command to run (:func:`remedy_command`), unfilled values marked ``<...>``. Plain lines,
    never wrapped to a terminal's width."""
    out: list[str] = [f"kind: {result.kind}"]
    if result.parts:
        out.append("parts: " + ", ".join(f"{p.kind} ({_span(p.first, p.last)})" for p in result.parts))
    if result.unread:
        out.append("not recognised: " + ", ".join(_span(a, b) for a, b in result.unread))
    if not result.findings:
        if result.kind == "nvml" and result.facts.get("healthy"):
            gpus = result.facts["gpus"]
            out.append(
                f"no error: {result.facts['report']} answers for {len(gpus)} GPU(s) ({', '.join(dict.fromkeys(gpus))}),"
                f" driver {result.facts['driver_version']}"
            )
        else:
            out.append("no findings" if result.kind != UNKNOWN else "no findings: the text is of no known kind")
        return "\n".join(out) + "\n"
    findings = critical_first(result.findings)
    if not explain:
        for finding in findings:
            out.append("")
            out.extend(_brief(finding, catalog.get(finding.id).title))
        out.append("")
        out.append("--explain: the runbook of each finding; --format json: everything")
        return "\n".join(out) + "\n"
    shown_runbooks: set[str] = set()
    for finding in findings:
        entry = catalog.get(finding.id)
        out.append("")
        out.append(f"[{finding.severity.value.upper()}] {finding.id} ({finding.scenario.value}) {entry.title}")
        out.append(f"  {finding.summary}")
        if finding.evidence:
            out.append("  evidence:")
            out.extend(f"    | {line}" for line in finding.evidence)
        out.append(f"  remedy: {mark_placeholders(finding.remedy)}")
        if finding.id in shown_runbooks:
            out.append("  runbook: see above")
            continue
        shown_runbooks.add(finding.id)
        out.append("  runbook:")
        for title, body in entry.runbook.sections():
            out.append(f"    {title}:")
            out.extend(f"      {line}" for line in body.splitlines())
    return "\n".join(out) + "\n"
