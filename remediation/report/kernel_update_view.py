"""Output of ``invoke kernel-update``: the per-host plan, before/after, and the incident report of what was done.

The report has the restore's five sections (Symptoms, Diagnosis, Root cause, Resolution, Prevention) for every host
the run moved, staged, failed or left alone; field values go through the Markdown filters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from remediation.report.markdown import code, fence, inline
from remediation.report.rollout_view import after_of, outcome_lines, print_outcomes, report_header

if TYPE_CHECKING:
    from remediation.host.audit import HostAudit
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


def print_kernel_result(console: Console, result: KernelUpdateResult) -> None:
    print_outcomes(console, result, _state, ok="moved", not_ok="not every host moved: see the table")


def _resolution(o: KernelOutcome) -> list[str]:
    return [f"Plan: {inline(o.plan.reason)}", "", fence(plan_lines(o.plan)), "", *outcome_lines(o, o.status.value)]


def render_kernel_report(result: KernelUpdateResult) -> str:
    """Markdown: one section per host the run acted on or left alone, five sections each."""
    out = report_header(result, "Kernel update")
    for o in result.outcomes:
        if o.status.value == "current":
            continue
        before = result.before.host(o.host)
        after = after_of(result, o.host)
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
