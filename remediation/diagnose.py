"""Triage field text: detect its kind, parse it, turn the facts into catalog findings.

``diagnose(text)`` is what ``invoke diagnose FILE`` runs. Its JSON (:meth:`DiagnoseResult.to_dict`) is exactly::

    {"kind": str, "facts": {...}, "findings": [{"id", "scenario", "severity", "summary", "evidence", "remedy"}]}

- Empty (or whitespace-only) text raises :class:`~remediation.errors.ParseError` naming the input.
- Text of no known kind is not an error: the result has kind ``"unknown"``, empty facts and no findings, so a
  batch of files can be triaged without one odd file stopping it. An explicit ``kind`` that is not registered is a
  caller mistake and raises ``ParseError`` listing the known kinds.
- ``nvml`` text is also read as a kernel log, so kernel lines pasted with the nvidia-smi output (RmInitAdapter,
  Xid, API mismatch) add their findings; their facts sit under ``facts["kernel_log"]``.

Decisions (kept here so the mapping reads in one place):

- "couldn't communicate with the NVIDIA driver" means the driver is not loaded: GPU-DRV-001, whose usual cause
  (S1) is a booted kernel without an NVIDIA module. The summary says whether the text proves it (``modprobe: FATAL:
  Module nvidia not found``) or whether it is still to confirm. "Failed to initialize NVML: <other reason>" that no
  error class covers is GPU-DRV-004.
- Xid events: one GPU-HW-005 per distinct code, severity from the Xid table; Xid 79 and every "fallen off the bus"
  block are GPU-HW-001 instead (not also GPU-HW-005). "The NVIDIA probe routine failed" after a GPU fell off the bus
  is part of GPU-HW-001's evidence, not a separate GPU-HW-008.
- apt history: GPU-KRN-006 for kernel packages installed by unattended-upgrade (one per transaction) and
  GPU-KRN-004 for NVIDIA packages it changed; dry runs are ignored; installs by packagekit, apt, aptdaemon... are
  facts (with their actor) but no finding, since a person asked for them.
- DKMS: GPU-DKMS-001 per (module, version, kernel) build failure, and per kernel skipped for missing headers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from remediation import catalog
from remediation.errors import ParseError
from remediation.findings import Finding, Severity, make_finding
from remediation.parsers import KINDS, UNKNOWN, detect_kind, kinds
from remediation.parsers import apt_history as apt_mod
from remediation.parsers import dkms as dkms_mod
from remediation.parsers import kernel_log as klog_mod
from remediation.parsers import nvml_text as nvml_mod

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
        "evidence": list(parsed.evidence),
    }
    findings: list[Finding] = []
    ev = parsed.evidence
    pcis = ", ".join(parsed.pci_bus_ids) or "unknown bus id"
    cls = parsed.error_class
    if cls == "driver_not_loaded":
        if parsed.module_missing:
            kernel = parsed.running_kernel or "the booted kernel"
            where = ""
            if parsed.module_kernels and parsed.running_kernel not in parsed.module_kernels:
                where = f"; nvidia.ko exists only for {', '.join(parsed.module_kernels)}"
            dkms_note = "; dkms is not installed, so nothing rebuilt the module" if parsed.dkms_missing else ""
            summary = f"NVIDIA driver not loaded: no NVIDIA module for {kernel} (modprobe: FATAL){where}{dkms_note}"
        else:
            summary = (
                "NVIDIA driver not loaded (nvidia-smi cannot communicate with the driver); usual cause to confirm: "
                "the booted kernel has no NVIDIA module (`modinfo nvidia`, `uname -r`, apt history)"
            )
        findings.append(make_finding("GPU-DRV-001", summary, ev))
    elif cls == "version_mismatch":
        lib = f" (NVML library {parsed.nvml_library_version})" if parsed.nvml_library_version else ""
        via = f"; container service {parsed.service} cannot start" if parsed.service else ""
        findings.append(
            make_finding(
                "GPU-DRV-002",
                f"Driver/library version mismatch{lib}: userspace differs from the loaded kernel module{via}",
                ev,
            )
        )
    elif cls == "library_not_found":
        findings.append(make_finding("GPU-DRV-003", "NVIDIA driver not installed: libnvidia-ml not found", ev))
    elif cls == "gpu_lost":
        findings.append(make_finding("GPU-HW-001", f"GPU lost ({pcis}): not a driver problem", ev))
    elif cls == "handle_unknown_error":
        findings.append(
            make_finding("GPU-HW-006", f"NVML cannot get a device handle for GPU {pcis}: Unknown Error", ev)
        )
    elif cls == "no_devices":
        findings.append(make_finding("GPU-HW-007", "nvidia-smi: No devices were found", ev))
    elif parsed.nvml_init_error:
        findings.append(make_finding("GPU-DRV-004", f"NVML failed to initialise: {parsed.nvml_init_error}", ev))

    klog = klog_mod.parse(text)
    if not klog.is_empty:
        kfacts, kfindings = _kernel_facts_findings(klog)
        facts["kernel_log"] = kfacts
        have = {f.id for f in findings}
        for finding in kfindings:
            if finding.id in have and finding.id in ("GPU-HW-007", "GPU-DRV-001"):
                # same finding, better evidence: merge the kernel lines into the NVML finding
                findings = [_merge(f, finding) if f.id == finding.id else f for f in findings]
            else:
                findings.append(finding)
    return facts, findings


def _merge(base: Finding, extra: Finding) -> Finding:
    evidence = tuple(dict.fromkeys((*base.evidence, *extra.evidence)))
    return Finding(base.id, base.scenario, base.severity, f"{base.summary}; {extra.summary}", evidence, base.remedy)


# --- kernel log --------------------------------------------------------------------------------------------------


def _kernel(text: str) -> tuple[dict[str, Any], list[Finding]]:
    return _kernel_facts_findings(klog_mod.parse(text))


def _kernel_facts_findings(log: klog_mod.KernelLog) -> tuple[dict[str, Any], list[Finding]]:
    facts: dict[str, Any] = {
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
    findings: list[Finding] = []

    if log.fallen_off_bus:
        pcis = ", ".join(f.pci for f in log.fallen_off_bus)
        evidence = [line for f in log.fallen_off_bus for line in f.evidence]
        evidence += [line for p in log.probe_failures if p.kind == "failed" for line in p.evidence]
        findings.append(
            make_finding("GPU-HW-001", f"GPU fallen off the bus (Xid 79 or equivalent): {pcis}", _uniq(evidence))
        )

    by_code: dict[int, list[klog_mod.XidEvent]] = {}
    for event in log.xid_events:
        if event.code != 79:
            by_code.setdefault(event.code, []).append(event)
    for code, events in by_code.items():
        pcis = ", ".join(dict.fromkeys(e.pci for e in events))
        procs = ", ".join(dict.fromkeys(f"{e.name or '?'}[{e.pid}]" for e in events if e.pid is not None))
        who = f"; processes {procs}" if procs else ""
        findings.append(
            make_finding(
                "GPU-HW-005",
                f"Xid {code} x{len(events)} on {pcis}: {catalog.xid_meaning(code)}{who}",
                _uniq(e.text for e in events),
                severity=catalog.xid_severity(code),
            )
        )

    if log.api_mismatches:
        pairs = ", ".join(
            dict.fromkeys(
                f"client {a.client_version}"
                + (f" ({a.client_process}, pid {a.client_pid})" if a.client_process else "")
                + f" vs kernel module {a.module_version}"
                for a in log.api_mismatches
            )
        )
        findings.append(
            make_finding(
                "GPU-DRV-007",
                f"NVIDIA kernel module API mismatch x{len(log.api_mismatches)}: {pairs}",
                _uniq(line for a in log.api_mismatches for line in a.evidence),
            )
        )

    probes = [p for p in log.probe_failures if not (p.kind == "failed" and log.fallen_off_bus)]
    if probes:
        parts = []
        for p in probes:
            if p.kind == "not_called":
                owners = f" (owned by {', '.join(p.conflicting_drivers)}?)" if p.conflicting_drivers else ""
                parts.append(f"probe routine not called for {p.device_count} device(s){owners}")
            elif p.kind == "failed":
                parts.append(f"probe routine failed for {p.device_count} device(s)")
            elif p.kind == "no_adapter":
                parts.append("no NVIDIA graphics adapter probed")
            else:
                parts.append(f"probe of {p.pci} failed")
        findings.append(
            make_finding(
                "GPU-HW-008",
                "NVIDIA probe failed: " + "; ".join(dict.fromkeys(parts)),
                _uniq(line for p in probes for line in p.evidence),
            )
        )

    if log.rm_init_failures:
        parts = [f"{r.pci or 'GPU'} ({r.code})" if r.code else f"{r.pci or 'GPU'}" for r in log.rm_init_failures]
        fw = [f.path for f in log.firmware_failures if f.path]
        fw_note = f"; firmware missing: {', '.join(fw)}" if fw else ""
        findings.append(
            make_finding(
                "GPU-HW-007",
                f"RmInitAdapter failed on {', '.join(dict.fromkeys(parts))}{fw_note}",
                _uniq(
                    [
                        *(line for r in log.rm_init_failures for line in r.evidence),
                        *(f.text for f in log.firmware_failures),
                    ]
                ),
            )
        )

    nvidia_missing = [m for m in log.module_missing if m.module.startswith("nvidia")]
    if nvidia_missing:
        kernels = ", ".join(dict.fromkeys(m.kernel for m in nvidia_missing if m.kernel)) or "the booted kernel"
        findings.append(
            make_finding(
                "GPU-DRV-001",
                f"NVIDIA module not found for {kernels}: the driver cannot load",
                _uniq(m.text for m in nvidia_missing),
            )
        )
    return facts, findings


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
                "actions": [action_dict(a) for a in t.actions],
            }
            for t in history.transactions
        ],
        "kernel_installs": [
            {**action_dict(a), "kernel_release": a.kernel_release, "start": t.start, "actor": t.actor}
            for t, a in history.kernel_installs()
        ],
        "nvidia_changes": [{**action_dict(a), "start": t.start, "actor": t.actor} for t, a in history.nvidia_changes()],
    }
    findings: list[Finding] = []
    for t in history.transactions:
        if t.dry_run or t.actor != "unattended-upgrade":
            continue
        kernels = t.kernel_installs()
        if kernels:
            findings.append(
                make_finding(
                    "GPU-KRN-006",
                    f"unattended-upgrade installed kernel packages at {t.start or 'unknown time'}: "
                    + ", ".join(_describe(a) for a in kernels),
                    _evidence_lines(t, kernels),
                )
            )
        nvidia = t.nvidia_changes()
        if nvidia:
            findings.append(
                make_finding(
                    "GPU-KRN-004",
                    f"unattended-upgrade changed NVIDIA packages at {t.start or 'unknown time'}: "
                    + ", ".join(_describe(a) for a in nvidia),
                    _evidence_lines(t, nvidia),
                )
            )
    return facts, findings


def _describe(a: apt_mod.AptAction) -> str:
    if a.old_version and a.version:
        return f"{a.action} {a.package} {a.old_version} → {a.version}"
    return f"{a.action} {a.package} {a.version or ''}".rstrip()


def _evidence_lines(t: apt_mod.AptTransaction, actions: Iterable[apt_mod.AptAction]) -> tuple[str, ...]:
    wanted = {a.action for a in actions}
    keep = [line for line in t.text if line.startswith(("Start-Date", "Commandline", "Requested-By", "End-Date"))]
    keep += [line for line in t.text if line.split(":", 1)[0] in wanted]
    order = {line: i for i, line in enumerate(t.text)}
    return tuple(sorted(dict.fromkeys(keep), key=lambda line: order.get(line, 0)))


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
    findings: list[Finding] = []
    seen: set[tuple[str | None, str | None, str | None]] = set()
    for f in parsed.build_failures:
        key = (f.module, f.version, f.kernel)
        if key in seen:
            continue
        seen.add(key)
        what = f"{f.module or 'module'} {f.version or ''}".strip()
        findings.append(
            make_finding(
                "GPU-DKMS-001",
                f"DKMS build of {what} failed for kernel {f.kernel or 'unknown'}: {f.reason}",
                f.evidence,
            )
        )
    for s in parsed.skipped_kernels:
        what = f"{s.module or 'module'} {s.version or ''}".strip()
        findings.append(
            make_finding(
                "GPU-DKMS-001",
                f"DKMS did not build {what} for kernel {s.kernel}: {s.reason}",
                (s.text,),
            )
        )
    return facts, findings


def _uniq(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(line for line in lines if line))


_HANDLERS = {
    "nvml": _nvml,
    "kernel-log": _kernel,
    "apt-history": _apt,
    "dkms": _dkms,
}
assert set(_HANDLERS) <= set(KINDS), "every diagnose handler needs a registered kind"


# --- text rendering ----------------------------------------------------------------------------------------------


def render_text(result: DiagnoseResult) -> str:
    """Human-readable triage: each finding, its evidence, remedy, and the runbook's five sections."""
    out: list[str] = [f"kind: {result.kind}"]
    if not result.findings:
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
