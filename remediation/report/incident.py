"""Incident reports in Markdown: the runbook's five sections, filled in with one host's real evidence.

Grouping (one incident = one problem to hand to someone):

- Findings are grouped per host by *family*, the root cause they share: ``driver`` (GPU-DRV-*, GPU-KRN-*,
  GPU-DKMS-*, GPU-APT-*: the driver/kernel-update story of scenario S1, its predictive check and its hardening
  gaps), ``hardware`` (GPU-HW-*), ``thermal`` (GPU-THM-*, GPU-CFG-*: GPU work slowed down, S5) and ``memory``
  (GPU-MEM-*). An ID outside these prefixes is a family of its own.
- A group becomes an incident when it has a warning or critical finding. Its *primary* finding is the worst
  one (ties: catalog order), which gives the title, scenario and runbook text; the others are *related*: on the
  S1 host GPU-DRV-001 (critical) leads, and GPU-KRN-006 (info: unattended-upgrade installed the kernel) plus the
  unprotected-package warnings GPU-KRN-002/003/004 are the evidence and the prevention of the same incident.
  Info-only groups (a reboot pending, an install logged) make no incident on their own.
- Incidents are ordered by host (inventory order), then worst first.

Each incident: a header (title, host, fleet, scenario, severity, detected at, the findings), then
**Symptoms, Diagnosis, Root cause, Resolution, Prevention** in the runbook's order. Every section puts the facts
of that host first (the NVML error and what ``nvidia-smi`` prints for it, the booted kernel and which kernels
have a module, the apt history stanza that installed the kernel, kernel log lines, the concrete Invoke commands
with the host filled in) and the catalog's runbook text after them. Evidence goes into fenced code blocks that
no text inside can close (:mod:`remediation.report.markdown`).

Hosts that were not probed get a short "not probed" section at the end of the document: their state is unknown,
which is itself something to act on.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from remediation.core import catalog
from remediation.core.checks.history import last_change_of, who
from remediation.core.facts import HostFacts
from remediation.core.findings import Finding, Scenario, Severity
from remediation.core.parsers.apt_history import AptTransaction
from remediation.report.jinja import render_template
from remediation.report.markdown import code, inline

if TYPE_CHECKING:
    from remediation.host.audit import AuditResult, HostAudit

__all__ = ["FAMILIES", "Incident", "family_of", "incidents", "render_incident"]

TEMPLATE = "incident.md.j2"

FAMILIES: dict[str, str] = {
    "GPU-DRV": "driver",
    "GPU-KRN": "driver",
    "GPU-DKMS": "driver",
    "GPU-APT": "driver",
    "GPU-HW": "hardware",
    "GPU-THM": "thermal",
    "GPU-CFG": "thermal",
    "GPU-MEM": "memory",
}

SCENARIO_NAMES: dict[Scenario, str] = {
    Scenario.S1: "GPU work fails: NVIDIA driver lost after a kernel update, or a GPU fault",
    Scenario.S2: "CUDA out of memory during fine-tuning",
    Scenario.S3: "AKS GPU pods stuck in Pending",
    Scenario.S4: "Azure OpenAI 429 storm",
    Scenario.S5: "inference latency spike (cold start, thermal throttling, noisy neighbour)",
}

# What nvidia-smi prints for each NVML error class (the text on-call engineers search for).
NVIDIA_SMI_SAYS: dict[str, str] = {
    "driver_not_loaded": (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
        "NVIDIA driver is installed and running."
    ),
    "version_mismatch": "Failed to initialize NVML: Driver/library version mismatch",
    "library_not_found": "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.",
    "no_devices": "No devices were found",
    "gpu_lost": "Unable to determine the device handle for GPU N: GPU is lost. Reboot the system to recover this GPU",
    "handle_unknown_error": "Unable to determine the device handle for GPU N: Unknown Error",
    "timeout": "(nvidia-smi hangs: the NVML call did not return within the probe's timeout)",
}

_SAFE_HOST = re.compile(r"^[A-Za-z0-9._-]+$")
_KERNEL_LOG_RELEVANT = re.compile(r"nvidia|NVRM|Xid|nvrm|modprobe", re.I)
_CATALOG_ORDER = {fid: i for i, fid in enumerate(catalog.CATALOG)}
_MAX_LOG_LINES = 40
_VERBS = {"Install": "installed", "Upgrade": "upgraded", "Reinstall": "reinstalled", "Downgrade": "downgraded"}


def family_of(finding_id: str) -> str:
    """The incident family of a finding ID (see the module docstring)."""
    prefix = finding_id.rsplit("-", 1)[0]
    return FAMILIES.get(prefix, prefix)


def _rank(f: Finding) -> tuple[int, int]:
    return (-f.severity.rank, _CATALOG_ORDER.get(f.id, len(_CATALOG_ORDER)))


@dataclass(frozen=True)
class Incident:
    """One incident: a host, a family, the primary finding and the related ones (primary first)."""

    host: str
    family: str
    findings: tuple[Finding, ...]

    @property
    def primary(self) -> Finding:
        return self.findings[0]

    @property
    def related(self) -> tuple[Finding, ...]:
        return self.findings[1:]

    @property
    def severity(self) -> Severity:
        return self.primary.severity

    @property
    def scenario(self) -> Scenario:
        return self.primary.scenario


def incidents(result: AuditResult, host: str | None = None) -> list[Incident]:
    """The incidents of ``result`` (of one host when ``host`` is given), grouped as the module docstring says."""
    out: list[Incident] = []
    for h in result.hosts:
        if host is not None and h.host != host:
            continue
        groups: dict[str, list[Finding]] = {}
        for f in h.findings:
            groups.setdefault(family_of(f.id), []).append(f)
        host_incidents = [
            Incident(h.host, family, tuple(sorted(found, key=_rank)))
            for family, found in groups.items()
            if any(f.severity is not Severity.INFO for f in found)
        ]
        out.extend(sorted(host_incidents, key=lambda i: _rank(i.primary)))
    return out


# --- facts as Markdown-ready values ----------------------------------------------------------------------------


def _apt_stanza(tx: AptTransaction) -> list[str]:
    if tx.text:
        return list(tx.text)
    lines = [f"Start-Date: {tx.start or '?'}"]
    if tx.commandline:
        lines.append(f"Commandline: {tx.commandline}")
    if tx.requested_by:
        lines.append(f"Requested-By: {tx.requested_by}")
    lines.extend(f"{a.action}: {a.package} ({a.version or '?'})" for a in tx.actions)
    return lines


def _kernel_change(facts: HostFacts) -> dict[str, Any] | None:
    """Who installed the booted kernel's image package, when, with which command (from apt history)."""
    booted = facts.booted_kernel
    if booted is None:
        return None
    return _change(facts, [booted.image_package])


def _change(facts: HostFacts, packages: Sequence[str]) -> dict[str, Any] | None:
    found = last_change_of(facts.apt_history, packages)
    if found is None:
        return None
    tx, action = found
    return {
        "package": action.package,
        "version": action.version or "?",
        "old_version": action.old_version,
        "action": _VERBS.get(action.action, action.action.lower()),
        "who": who(tx),
        "when": tx.start or "?",
        "commandline": tx.commandline or "",
        "requested_by": tx.requested_by or "",
        "unattended": tx.actor == "unattended-upgrade",
        "stanza": _apt_stanza(tx),
    }


def _nvidia_change(facts: HostFacts) -> dict[str, Any] | None:
    names = list(facts.packages.nvidia_names)
    if facts.packages.driver_package:
        names.append(facts.packages.driver_package)
    return _change(facts, names) if names else None


def _kernels(facts: HostFacts) -> list[dict[str, Any]]:
    return [
        {
            "release": k.release,
            "package": k.image_package,
            "version": k.image_version or "?",
            "booted": k.release == facts.system.kernel,
            "module": k.nvidia_module.path if k.has_nvidia_module else None,
            "module_version": k.nvidia_module.version,
            "headers": k.headers_installed,
            "dkms": ", ".join(f"{d.module} {d.version} {d.state}" for d in k.dkms),
            "held": k.image_package in facts.packages.held,
        }
        for k in facts.packages.kernels
    ]


def _gpu_lines(facts: HostFacts) -> list[str]:
    lines = []
    for g in facts.nvml.gpus:
        if not g.ok:
            lines.append(f"{g.label}: {g.error_class}: {g.error or 'no message'}")
            continue
        parts = [f"{g.label} {g.name or ''}".strip()]
        if g.temperature_c is not None:
            parts.append(f"{g.temperature_c} °C")
        if g.utilization_gpu is not None:
            parts.append(f"util {g.utilization_gpu} %")
        if g.memory is not None:
            parts.append(f"mem {g.memory.used // 2**20}/{g.memory.total // 2**20} MiB")
        if g.clocks_event_reasons:
            parts.append("clock events " + ",".join(g.clocks_event_reasons))
        lines.append(", ".join(parts))
    return lines


def _specialise(text: str, host: str) -> str:
    """Catalog runbook text with ``<host>`` filled in (only for host names that cannot break Markdown)."""
    return text.replace("<host>", host) if _SAFE_HOST.match(host) else text


def _commands(incident: Incident, fleet: str) -> list[str]:
    host = incident.host
    primary = incident.primary
    cmds: list[str] = []
    if incident.family == "driver":
        if primary.severity is Severity.CRITICAL or primary.id.startswith(("GPU-DRV", "GPU-DKMS")):
            cmds.append(f"invoke driver-restore --fleet {fleet} --limit {host}")
        else:
            cmds.append(f"invoke harden --fleet {fleet} --limit {host}")
    for f in incident.findings:
        if f.severity is Severity.INFO:
            continue
        remedy = f.remedy
        if remedy.startswith("invoke ") and "--fleet" not in remedy:
            remedy = remedy.replace("invoke driver-restore ", f"invoke driver-restore --fleet {fleet} ", 1)
        if remedy.startswith(("invoke ", "az ", "nvidia-smi ", "sudo ")) and remedy not in cmds:
            cmds.append(remedy)
    cmds.append(f"invoke audit --fleet {fleet} --limit {host}")
    return cmds


def _prevention_commands(incident: Incident, fleet: str) -> list[str]:
    if incident.family == "driver":
        return [f"invoke harden --fleet {fleet}", f"invoke audit --fleet {fleet}"]
    return [f"invoke audit --fleet {fleet}"]


def _root_cause(incident: Incident, facts: HostFacts | None) -> list[str]:
    """Markdown sentences specialising the runbook's root cause with this host's facts (values in code spans)."""
    primary = incident.primary
    sentences: list[str] = []
    if facts is None:
        return sentences
    booted = facts.system.kernel
    change = _kernel_change(facts)
    with_module = [k.release for k in facts.packages.kernels if k.has_nvidia_module]
    if primary.id in ("GPU-DRV-001", "GPU-DKMS-001"):
        if change is not None:
            sentences.append(
                f"{code(change['who'])} {change['action']} {code(change['package'])} ({code(change['version'])}) "
                f"at {code(change['when'])}"
                + (f" (command line {code(change['commandline'])})" if change["commandline"] else "")
                + "."
            )
        modules = ", ".join(code(r) for r in with_module) if with_module else "no installed kernel"
        sentences.append(
            f"The NVIDIA kernel module on this host exists for {modules}; the host booted {code(booted or '?')}, "
            f"which has none, so NVML reports {code(facts.nvml.error_class)}."
        )
    elif primary.id in ("GPU-DRV-002", "GPU-DRV-007"):
        nv = _nvidia_change(facts)
        if nv is not None:
            versions = f"{nv['old_version']} -> {nv['version']}" if nv["old_version"] else nv["version"]
            sentences.append(
                f"{code(nv['who'])} {nv['action']} {code(nv['package'])} ({code(versions)}) at {code(nv['when'])} "
                "while the old kernel module stayed loaded: userspace and kernel module now differ until the "
                "module is reloaded (reboot) or the packages are brought back in line."
            )
    elif primary.id == "GPU-DRV-008":
        kernel = facts.booted_kernel
        if kernel is not None and kernel.has_nvidia_module:
            m = kernel.nvidia_module
            signed = {True: "signed", False: "unsigned", None: "of unknown signature"}[m.signed]
            sentences.append(
                f"The host booted {code(booted or '?')}, whose NVIDIA module {code(m.path or '?')} is {signed} "
                f"({code(m.source or '?')}); Secure Boot is {code(facts.secure_boot.state)}, so the kernel refuses "
                f"it and NVML reports {code(facts.nvml.error_class)}."
            )
    elif primary.id == "GPU-KRN-001":
        newer = [k for k in facts.packages.kernels if not k.has_nvidia_module and k.release != booted]
        for k in newer:
            ch = _change(facts, [k.image_package])
            by = f" by {code(ch['who'])} at {code(ch['when'])}" if ch else ""
            sentences.append(
                f"Kernel {code(k.release)} ({code(k.image_package)}) was installed{by} without an NVIDIA module; "
                f"the host still runs {code(booted or '?')}, so nothing has failed yet, but the next reboot will."
            )
    if not sentences:
        sentences.append(f"{inline(primary.summary)} ({primary.id}, {primary.severity.value}).")
    return sentences


def _symptoms(incident: Incident, facts: HostFacts | None) -> dict[str, Any]:
    if facts is None:
        return {"nvml": None, "nvidia_smi": None, "gpus": []}
    nvml = facts.nvml
    if nvml.ok:
        line = f"NVML answered: driver {nvml.driver_version or '?'}, {nvml.device_count or len(nvml.gpus)} GPU(s)"
    else:
        error_code = f" (code {nvml.error_code})" if nvml.error_code is not None else ""
        line = f"NVML: {nvml.error_class}: {nvml.error or 'no message'}{error_code}"
    return {
        "nvml": line,
        "nvidia_smi": None if nvml.ok else NVIDIA_SMI_SAYS.get(nvml.error_class),
        "gpus": _gpu_lines(facts) if incident.family != "driver" or nvml.ok else [],
    }


def _diagnosis(incident: Incident, facts: HostFacts | None) -> dict[str, Any]:
    if facts is None:
        return {"facts": False}
    pkgs = facts.packages
    log = [line for line in facts.kernel_log_lines if _KERNEL_LOG_RELEVANT.search(line)]
    uu = facts.unattended_upgrades
    return {
        "facts": True,
        "driver_family": incident.family == "driver",
        "booted": facts.system.kernel or "?",
        "boot_time": facts.system.boot_time.isoformat() if facts.system.boot_time else None,
        "os": facts.system.os_pretty_name,
        "kernels": _kernels(facts) if pkgs.available else [],
        "packages_error": None if pkgs.available else (pkgs.error or "package database not read"),
        "driver_package": pkgs.driver_package,
        "driver_package_version": pkgs.driver_package_version,
        "nvml_driver": facts.nvml.driver_version,
        "held": sorted(pkgs.held),
        "unattended": {
            "enabled": uu.enabled,
            "blacklist": list(uu.package_blacklist),
        }
        if uu.available
        else None,
        "kernel_change": _kernel_change(facts) if incident.family == "driver" else None,
        "nvidia_change": _nvidia_change(facts) if incident.family == "driver" else None,
        "kernel_log": log[-_MAX_LOG_LINES:],
        "kernel_log_source": facts.kernel_log_source or "kernel log",
        "kernel_log_dropped": max(0, len(log) - _MAX_LOG_LINES),
    }


def _detected_at(result: AuditResult, facts: HostFacts | None) -> str:
    when: _dt.datetime = (facts.collected_at if facts and facts.collected_at else None) or result.started_at
    return when.isoformat()


def _context(result: AuditResult, h: HostAudit, incident: Incident) -> dict[str, Any]:
    entry = catalog.CATALOG.get(incident.primary.id)
    runbook = entry.runbook if entry else None
    title = entry.title if entry else incident.primary.summary
    facts = h.facts
    return {
        "title": title,
        "host": h.host,
        "fleet": result.fleet,
        "scenario": incident.scenario.value,
        "scenario_name": SCENARIO_NAMES[incident.scenario],
        "severity": incident.severity.value,
        "detected_at": _detected_at(result, facts),
        "audit_started_at": result.started_at.isoformat(),
        "primary": incident.primary,
        "findings": incident.findings,
        "related": incident.related,
        "symptoms": _symptoms(incident, facts),
        "diagnosis": _diagnosis(incident, facts),
        "root_cause": _root_cause(incident, facts),
        "commands": _commands(incident, result.fleet),
        "prevention_commands": _prevention_commands(incident, result.fleet),
        "open_exposures": [
            f for f in incident.related if f.id in ("GPU-KRN-002", "GPU-KRN-003", "GPU-KRN-004", "GPU-KRN-001")
        ],
        "runbook": {
            "symptoms": runbook.symptoms if runbook else "",
            "diagnosis": runbook.diagnosis if runbook else "",
            "root_cause": runbook.root_cause if runbook else "",
            "resolution": _specialise(runbook.resolution, h.host) if runbook else "",
            "prevention": _specialise(runbook.prevention, h.host) if runbook else "",
        },
    }


def render_incident(result: AuditResult, host: str | None = None) -> str:
    """The incident report(s) of ``result`` (or of ``host`` only) as one Markdown document.

    Raises ``KeyError`` for a ``host`` that is not in the result.
    """
    if host is not None:
        result.host(host)  # KeyError naming the host
    selected = [h for h in result.hosts if host is None or h.host == host]
    found = incidents(result, host)
    by_host = {h.host: h for h in selected}
    contexts = [_context(result, by_host[i.host], i) for i in found]
    not_probed = [{"host": h.host, "status": h.status.value, "error": h.error or ""} for h in selected if not h.probed]
    return render_template(
        TEMPLATE,
        fleet=result.fleet,
        started_at=result.started_at.isoformat(),
        host=host,
        incidents=contexts,
        not_probed=not_probed,
        hosts_checked=len(selected),
    )
