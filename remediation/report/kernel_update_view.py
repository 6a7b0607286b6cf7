"""Output of ``invoke kernel-update``: the per-host plan, before/after, and the incident report of what was done.

The report has the restore's five sections (Symptoms, Diagnosis, Root cause, Resolution, Prevention) for every host
the run moved, staged, failed or left alone; field values go through the Markdown filters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from remediation.exitcodes import ExitCode
from remediation.report.markdown import code, fence, inline

if TYPE_CHECKING:
    from remediation.audit import HostAudit
    from remediation.kernelupdate.flow import KernelOutcome, KernelUpdateResult
    from remediation.kernelupdate.rules import KernelPlan

__all__ = ["plan_lines", "print_kernel_plan", "print_kernel_result", "render_kernel_report"]


def _sb(value: bool | None) -> str:
    return {True: "on", False: "off", None: "unknown"}[value]


def plan_lines(plan: KernelPlan) -> list[str]:
    """The plan of one host as plain lines (the table's last column; also the report's)."""
    if plan.blocked:
        return [f"left alone: {plan.blocked}"]
    if not plan.changes_host:
        return [plan.reason]
    return [plan.reason, f"module source {plan.module_source}: {plan.module_source_reason}", *plan.steps]


def print_kernel_plan(console: Console, plans: tuple[KernelPlan, ...]) -> None:
    table = Table(title="kernel-update plan (nothing has changed yet)")
    for col in ("host", "flavour", "secure boot", "booted -> target", "plan"):
        table.add_column(col)
    for p in plans:
        move = f"{p.booted_kernel or '?'} -> {p.target_kernel}" if p.target_kernel else (p.booted_kernel or "?")
        what = Text("\n".join(plan_lines(p)), style="red" if p.blocked else "")  # host text: never markup
        table.add_row(Text(p.host), Text(p.flavour or "?"), _sb(p.secure_boot), Text(move), what)
    console.print(table)


def _state(h: HostAudit | None) -> str:
    if h is None:
        return "not probed"
    if h.facts is None:
        return f"{h.status.value}: {h.error or ''}".strip()
    n = h.facts.nvml
    return f"kernel {h.facts.system.kernel}, " + (f"NVML ok, driver {n.driver_version}" if n.ok
                                                   else f"NVML {n.error_class}")


def _after(result: KernelUpdateResult, host: str) -> HostAudit | None:
    if result.after is None or host not in {h.host for h in result.after.hosts}:
        return None
    return result.after.host(host)


def print_kernel_result(console: Console, result: KernelUpdateResult) -> None:
    if result.stopped in ("dry-run", "declined", "nothing to do"):
        what = {"dry-run": "--check: nothing was changed", "declined": "not confirmed: nothing was changed",
                "nothing to do": "no host has a kernel to move to; nothing ran"}[result.stopped]
        console.print(f"kernel-update: {what}")
    table = Table(title=f"kernel-update {result.run_id}: before / after")
    for col in ("host", "status", "before", "after", "detail"):
        table.add_column(col)
    for o in result.outcomes:
        detail = (f"{o.where}: " if o.where else "") + o.detail
        if o.undone:
            detail += " | undone: " + "; ".join(o.undone)
        if o.undo_error:
            detail += " | " + o.undo_error
        table.add_row(Text(o.host), o.status.value, Text(_state(result.before.host(o.host))),
                      Text(_state(_after(result, o.host))), Text(detail))  # host text: never markup
    console.print(table)
    if result.stopped and result.stopped not in ("dry-run", "declined", "nothing to do"):
        console.print(Text(result.stopped, style="red"))
    console.print("moved" if result.exit_code == ExitCode.OK else "[red]not every host moved: see the table[/red]")


def _resolution(o: KernelOutcome) -> list[str]:
    lines = [f"Plan: {inline(o.plan.reason)}", "", fence(plan_lines(o.plan)), ""]
    lines.append(f"Outcome: **{o.status.value}**" + (f" at {inline(o.where)}" if o.where else "")
                 + (f": {inline(o.detail)}" if o.detail else ""))
    lines.append("")
    if o.changed:
        lines += ["What this run did on the host (its journal):", "", fence(list(o.changed)), ""]
    if o.undone:
        lines += ["Undone after the failure:", "", fence(list(o.undone)), ""]
    if o.undo_error:
        lines += [f"Undo: {inline(o.undo_error)}", ""]
    return lines


def render_kernel_report(result: KernelUpdateResult) -> str:
    """Markdown: one section per host the run acted on or left alone, five sections each."""
    out = [f"# Kernel update {code(result.run_id)} on fleet {code(result.fleet)}", ""]
    if result.stopped:
        out += [f"Run: {inline(result.stopped)}", ""]
    for o in result.outcomes:
        if o.status.value == "current":
            continue
        before = result.before.host(o.host)
        after = _after(result, o.host)
        p = o.plan
        title = {"moved": "kernel moved", "staged": "kernel staged, not booted", "failed": "kernel update failed",
                 "left-alone": "left alone", "not-started": "not started", "planned": "planned"}[o.status.value]
        out += [f"## {inline(o.host)}: {title} ({inline(p.booted_kernel or '?')} -> {inline(p.target_kernel or '-')})",
                ""]
        out += ["### Symptoms", "", f"Before: {inline(_state(before))}; after: {inline(_state(after))}", ""]
        out += ["### Diagnosis", "",
                f"Flavour {code(p.flavour or '?')}, Secure Boot {code(_sb(p.secure_boot))}, driver "
                f"{code(p.driver_version or '?')}, module source {code(p.module_source or '-')}"
                + (f" ({inline(p.module_source_reason)})" if p.module_source_reason else ""), ""]
        for f in (before.findings if before is not None else ()):
            if f.severity.value != "info":
                out += [f"- **{f.id}** ({f.severity.value}): {inline(f.summary)}"]
        out += ["", "### Root cause", ""]
        if o.status.value == "failed":
            out += [inline(o.detail) or "see the outcome below", ""]
        elif o.status.value == "left-alone":
            out += [inline(p.blocked or p.reason), ""]
        else:
            out += ["Planned maintenance: no failure.", ""]
        out += ["### Resolution", "", *_resolution(o)]
        out += ["### Prevention", ""]
        held = sorted(after.facts.packages.held) if after is not None and after.facts is not None else []
        out += ["Held now: " + (", ".join(code(h) for h in held) if held else "nothing"), "",
                "- Kernels move only through `invoke kernel-update` (gate 1 before the reboot, gate 2 after); "
                "`invoke harden` keeps unattended-upgrades from moving them.", ""]
    return "\n".join(out) + "\n"
