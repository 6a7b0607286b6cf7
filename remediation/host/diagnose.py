"""Triage field text: detect its kind, parse it, turn the facts into catalog findings.

``diagnose(text)`` is what ``invoke diagnose FILE`` runs. Its JSON (:meth:`DiagnoseResult.to_dict`) is exactly::

    {"kind": str, "facts": {...}, "findings": [{"id", "scenario", "severity", "summary", "evidence", "remedy"}]}

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

from dataclasses import dataclass
from typing import Any

from remediation.core import catalog
from remediation.core.checks import evaluate
from remediation.core.checks import evidence as ev_mod
from remediation.core.errors import ParseError
from remediation.core.findings import Finding, Severity
from remediation.core.parsers import KINDS, UNKNOWN, check_size, detect_kind, kinds
from remediation.core.parsers import apt_history as apt_mod
from remediation.core.parsers import dkms as dkms_mod
from remediation.core.parsers import kernel_log as klog_mod
from remediation.core.parsers import nvml_text as nvml_mod
from remediation.core.parsers import unattended_upgrades as uu_mod

__all__ = ["DiagnoseResult", "diagnose", "render_text"]

_FINDING_KEYS = ("id", "scenario", "severity", "summary", "evidence", "remedy")


@dataclass(frozen=True)
class DiagnoseResult:
    kind: str
    facts: dict[str, Any]
    findings: tuple[Finding, ...]

    @property
    def worst_severity(self) -> Severity | None:
        return Severity.worst(f.severity for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "facts", "findings": [{"id", "scenario", "severity", "summary", "evidence", "remedy"}]}``."""
        return {
            "kind": self.kind,
            "facts": self.facts,
            "findings": [{key: f.to_dict()[key] for key in _FINDING_KEYS} for f in self.findings],
        }


def diagnose(text: str, kind: str | None = None, source: str = "<text>") -> DiagnoseResult:
    """Detect (or take) the kind of ``text``, parse it and map the facts to findings.

    ``source`` names the input in error messages (a file name, ``<stdin>``).
    """
    check_size(text, source)
    if not text or not text.strip():
        raise ParseError(f"{source}: nothing to diagnose: the input is empty")
    if kind is None:
        kind = detect_kind(text)
    if kind == UNKNOWN:
        return DiagnoseResult(UNKNOWN, {}, ())
    spec = kinds().get(kind)
    handler = _HANDLERS.get(kind) or (spec.diagnose if spec is not None else None)
    if handler is None:
        known = ", ".join(sorted(kinds()))
        raise ParseError(f"{source}: unknown kind {kind!r} (known: {known})")
    facts, findings = handler(text)
    return DiagnoseResult(kind, facts, tuple(findings))


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


def render_text(result: DiagnoseResult) -> str:
    """Human-readable triage: each finding, its evidence, remedy, and the runbook's five sections."""
    out: list[str] = [f"kind: {result.kind}"]
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
    shown_runbooks: set[str] = set()
    for finding in result.findings:
        entry = catalog.get(finding.id)
        out.append("")
        out.append(f"[{finding.severity.value.upper()}] {finding.id} ({finding.scenario.value}) {entry.title}")
        out.append(f"  {finding.summary}")
        if finding.evidence:
            out.append("  evidence:")
            out.extend(f"    | {line}" for line in finding.evidence)
        out.append(f"  remedy: {finding.remedy}")
        if finding.id in shown_runbooks:
            out.append("  runbook: see above")
            continue
        shown_runbooks.add(finding.id)
        out.append("  runbook:")
        for title, body in entry.runbook.sections():
            out.append(f"    {title}:")
            out.extend(f"      {line}" for line in body.splitlines())
    return "\n".join(out) + "\n"
