"""Terminal output of the converge flows (harden): the plan, the per-host diff, the outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from remediation.rollout.engine import StopReason

if TYPE_CHECKING:
    from remediation.host.harden import HardenPlan, HardenResult
    from remediation.transport.runner import PlaybookResult


def print_harden_plan(console: Console, plan: HardenPlan, preview: PlaybookResult | None) -> None:
    table = Table(title="harden plan")
    for col in ("host", "action", "findings remediated", "roles"):
        table.add_column(col)
    for h in plan.hosts:
        if h.blocked:
            action = f"[red]left alone: {escape(h.blocked)}[/red]"
        elif h.roles:
            action = "[yellow]change[/yellow]"
        else:
            action = "[green]compliant, not touched[/green]"
        table.add_row(Text(h.host), action, Text(", ".join(h.findings) or "-"), Text(", ".join(h.roles) or "-"))
    console.print(table)
    if preview is None:
        return
    for host in plan.to_change:
        outcome = preview.hosts.get(host)
        console.rule(Text(f"{host}: changes (check mode)"))
        if outcome is None:
            console.print("  no result from Ansible for this host")
            continue
        for failure in outcome.failures:
            console.print(f"  [red]would fail:[/red] {escape(failure)}", markup=True)
        for change in outcome.changes:
            if not change.changed:
                continue
            console.print(Text(f"  {change.task}", style="bold"))
            for chunk in change.diff:
                console.print(chunk.rstrip("\n"), markup=False, highlight=False)


def print_harden_result(console: Console, result: HardenResult) -> None:
    if result.stopped is StopReason.NOTHING_TO_DO:
        console.print("harden: every reachable host is already compliant; nothing ran")
    elif result.stopped is StopReason.PREVIEW:
        console.print(f"harden --check: {len(result.plan.to_change)} host(s) would change; nothing was changed")
    elif result.stopped is StopReason.DECLINED:
        console.print("harden: not confirmed; nothing was changed")
    if result.applied is not None and result.stopped is None:
        a = result.applied
        console.print(
            f"applied: changed {', '.join(a.changed_hosts) or 'none'}; failed {', '.join(a.failed_hosts) or 'none'};"
            f" unreachable {', '.join(a.unreachable_hosts) or 'none'}",
            markup=False,
        )
        for host in a.failed_hosts + a.unreachable_hosts:
            for failure in a.hosts[host].failures:
                console.print(f"  {host}: {failure}", markup=False)
    for h in result.plan.blocked:
        console.print(f"left alone: {h.host}: {h.blocked}", markup=False)
    if result.stopped in (None, StopReason.NOTHING_TO_DO):
        bad = result.not_converged
        console.print(Text("converged: every host hardened") if not bad
                      else Text(f"not converged: {', '.join(bad)}", style="red"))
