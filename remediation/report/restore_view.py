"""Output of ``invoke driver-restore``: the plan, per-host before/after, and the incident report with what was DONE.

``remediation.report.incident.render_incident`` renders an audit's incidents and has no place for what a
remediation did, so the restore renders its own report here, with the same five sections (Symptoms, Diagnosis,
Root cause, Resolution, Prevention) per restored/attempted host: the facts from the audit before the run, the
actions and their outcome, and the audit after it. Field values go through the Markdown filters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from remediation.core import catalog
from remediation.core.checks.history import last_change_of, who
from remediation.report.markdown import code, fence, inline
from remediation.report.rollout_view import outcome_lines, print_outcomes, report_header

if TYPE_CHECKING:
    from remediation.host.audit import HostAudit
    from remediation.restore.flow import HostOutcome, RestoreResult
    from remediation.restore.rules import Decision

__all__ = ["print_restore_plan", "print_restore_result", "render_restore_report"]


def print_restore_plan(console: Console, plan: tuple[Decision, ...]) -> None:
    table = Table(title="driver-restore plan (nothing has changed yet)")
    for col in ("host", "action", "findings", "why / steps"):
        table.add_column(col)
    for d in plan:
        if d.blocked:
            action = f"[red]left alone[/red] ({d.action.value})"
            why = d.blocked
        elif d.changes_host:
            action = f"[yellow]{d.action.value}[/yellow]"
            why = d.reason + "\n" + " -> ".join(d.steps)
        else:
            action = d.action.value
            why = d.reason
        ids = ", ".join(i for i in d.findings if i.startswith(("GPU-DRV", "GPU-HW", "GPU-APT"))) or "-"
        table.add_row(Text(d.host), action, Text(ids), Text(why))  # host text: never markup
    console.print(table)


def _nvml(h: HostAudit | None) -> str:
    if h is None:
        return "not probed"
    if h.facts is None:
        return f"{h.status.value}: {h.error or ''}".strip()
    n = h.facts.nvml
    kernel = h.facts.system.kernel or "?"
    return (f"NVML ok, driver {n.driver_version}" if n.ok else f"NVML {n.error_class}") + f", kernel {kernel}"


def print_restore_result(console: Console, result: RestoreResult) -> None:
    print_outcomes(console, result, _nvml, ok="restored", not_ok="not restored: see the table")


def _root_cause(h: HostAudit) -> list[str]:
    f = h.facts
    if f is None:
        return ["The host could not be probed before the run."]
    out = []
    booted = f.booted_kernel
    if booted is not None:
        change = last_change_of(f.apt_history, [booted.image_package])
        if change is not None:
            tx, action = change
            out.append(f"{code(who(tx))} installed {code(action.package)} ({code(action.version or '?')}) at "
                       f"{code(tx.start or '?')}; the host then booted {code(f.system.kernel or '?')}, which had no "
                       "NVIDIA module.")
    return out


def _section_resolution(o: HostOutcome) -> list[str]:
    d = o.decision
    outcome = outcome_lines(o, o.status.value)
    if not o.changed and d.changes_host:  # nothing recorded: what was planned, after the outcome line
        outcome[2:2] = ["Planned steps:", "", fence(list(d.steps)), ""]
    return [f"Action: {code(d.action.value)}: {inline(d.reason)}", "", *outcome]


def render_restore_report(result: RestoreResult) -> str:
    """Markdown: one incident per host the run acted on or left broken, five sections each."""
    out = report_header(result, "Driver restore")
    for o in result.outcomes:
        before = result.before.host(o.host)
        if o.status.value == "healthy":
            continue
        after = None
        if result.after is not None and o.host in {h.host for h in result.after.hosts}:
            after = result.after.host(o.host)
        primary = next((i for i in ("GPU-HW-001", "GPU-HW-004", "GPU-DRV-003", "GPU-DRV-001", "GPU-DRV-002")
                        if i in o.decision.findings), None)
        entry = catalog.CATALOG.get(primary) if primary else None
        title = entry.title if entry else o.decision.reason
        out += [f"## {inline(o.host)}: {inline(title)}", ""]
        out += ["### Symptoms", "", f"Before: {inline(_nvml(before))}", ""]
        if entry:
            out += [entry.runbook.symptoms, ""]
        out += ["### Diagnosis", ""]
        for f in before.findings:
            if f.severity.value != "info" or f.id == "GPU-KRN-006":
                out += [f"- **{f.id}** ({f.severity.value}): {inline(f.summary)}"]
                out += ["", fence(list(f.evidence)), ""]
        out += ["### Root cause", ""]
        out += [*_root_cause(before), ""]
        if entry:
            out += [entry.runbook.root_cause, ""]
        out += ["### Resolution", ""]
        out += _section_resolution(o)
        out += [f"After: {inline(_nvml(after))}", ""]
        out += ["### Prevention", ""]
        held = sorted(after.facts.packages.held) if after is not None and after.facts is not None else []
        out += ["Held now: " + (", ".join(code(p) for p in held) if held else "nothing"), ""]
        out += [f"- `invoke harden --fleet {result.fleet}` (unattended-upgrades Package-Blacklist, kernel hold)", ""]
        if entry:
            out += [entry.runbook.prevention, ""]
    return "\n".join(out) + "\n"
