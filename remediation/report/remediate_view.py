"""Output of ``invoke remediate --check``: the plan per host and finding, with the guards' arithmetic."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from remediation.remediate.flow import ResetResult
    from remediation.remediate.plan import Plan

__all__ = ["print_plan", "print_reset"]

_STYLE = {"auto": "yellow", "propose": "cyan", "escalate": "red", "blocked": "magenta", "observe": "dim"}


def print_plan(console: Console, plan: Plan) -> None:
    table = Table(title=f"remediate plan, fleet {plan.fleet} (--check: nothing changes)")
    for col in ("host", "finding", "decision", "action", "why", "attempts"):
        table.add_column(col)
    for h in plan.hosts:
        if not h.decisions:
            table.add_row(Text(h.host), "-", Text("nothing to do", style="green"), "-", "no finding", Text(h.budget))
        for i, d in enumerate(h.decisions):
            action = (d.action.value if d.action else "-") + (" + reboot" if d.reboot else "")
            table.add_row(Text(h.host if i == 0 else ""), Text(d.finding), Text(d.verdict.value, style=_STYLE.get(
                d.verdict.value, "")), Text(action), Text(d.why), Text(h.budget if i == 0 else ""))
    console.print(table)
    from remediation.remediate.plan import Verdict

    console.print(Text("decisions: " + ", ".join(f"{plan.count(v)} {v.value}" for v in Verdict)))
    console.print(Text(f"in flight: {plan.in_flight}"))
    breaker = plan.breaker
    if plan.breaker_tripped_at is not None:
        console.print(Text(f"circuit breaker: TRIPPED at {plan.breaker_tripped_at.isoformat(timespec='seconds')} "
                           f"(now: {breaker.why}); invoke remediate.reset --fleet {plan.fleet} after a person has "
                           "looked", style="red"))
    elif breaker.tripped:
        console.print(Text(f"circuit breaker: would trip in this run: {breaker.why}", style="red"))
    else:
        console.print(Text(f"circuit breaker: closed ({breaker.why})"))
    reboot = "allowed (--allow-reboot)" if plan.allow_reboot else "only inside a maintenance window"
    console.print(Text(f"reboots: {reboot}"))
    console.print(Text("remediate --check: nothing was changed and the state was not written"))


def print_reset(console: Console, result: ResetResult, *, applied: bool) -> None:
    before = result.before
    if not result.existed:
        console.print(Text(f"no remediate state at {result.path}: nothing to reset"))
        return
    trip = before.breaker
    what = (f"circuit breaker tripped at {trip.at.isoformat(timespec='seconds')} ({trip.why})" if trip
            else "circuit breaker not tripped")
    verb = "reset" if applied else "would reset"
    console.print(Text(f"{verb}: {what}; {len(before.seen)} recorded finding(s) and {len(before.observations)} "
                       f"observation(s) discarded; {len(result.after.attempts)} attempt(s) kept (the budget stays) "
                       f"in {result.path}"))
