"""Output of ``invoke remediate --check``: the plan per host and finding, with the guards' arithmetic."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from remediation.remediate.act import ActResult
    from remediation.remediate.flow import ResetResult
    from remediation.remediate.plan import Plan

__all__ = ["print_plan", "print_reset", "print_result"]

_STYLE = {"auto": "yellow", "propose": "cyan", "escalate": "red", "blocked": "magenta", "observe": "dim"}
_OUTCOME_STYLE = {"fixed": "green", "gone": "green", "nothing-to-do": "green", "failed": "red", "escalated": "red",
                  "blocked": "magenta", "not-started": "magenta", "not-acted": "cyan", "declined": "dim"}


def print_plan(console: Console, plan: Plan, *, acting: bool = False, result: ActResult | None = None) -> None:
    """The plan per host and finding; ``result``: with each host's outcome (after acting)."""
    title = ("remediate run" if result is not None else "remediate plan") + f", fleet {plan.fleet}"
    if not acting and result is None:
        title += " (--check: nothing changes)"
    table = Table(title=title)
    cols = ("host", "finding", "decision", "action", "why", "attempts") + (("outcome",) if result is not None else ())
    for col in cols:
        table.add_column(col)
    for h in plan.hosts:
        outcome: tuple[Text, ...] = ()
        if result is not None:
            o = result.outcomes.get(h.host)
            outcome = (Text(f"{o.status.value}: {o.why}", style=_OUTCOME_STYLE.get(o.status.value, ""))
                       if o is not None else Text("-"),)
        if not h.decisions:
            table.add_row(Text(h.host), "-", Text("nothing to do", style="green"), "-", "no finding", Text(h.budget),
                          *outcome)
        for i, d in enumerate(h.decisions):
            action = (d.action.value if d.action else "-") + (" + reboot" if d.reboot else "")
            table.add_row(Text(h.host if i == 0 else ""), Text(d.finding), Text(d.verdict.value, style=_STYLE.get(
                d.verdict.value, "")), Text(action), Text(d.why), Text(h.budget if i == 0 else ""),
                *(outcome if i == 0 else (Text(""),) * len(outcome)))
    console.print(table)
    if acting or result is not None:
        return
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


def print_result(console: Console, result: ActResult) -> None:
    """After acting: the plan with each host's outcome, the escalations (packet, page), why the loop halted."""
    print_plan(console, result.plan, result=result)
    from remediation.remediate.act import HostStatus

    console.print(Text("outcomes: " + ", ".join(
        f"{n} {s.value}" for s in HostStatus if (n := sum(1 for o in result.outcomes.values() if o.status is s)))))
    for name, o in sorted(result.outcomes.items()):
        if o.evidence:
            console.print(Text(f"evidence kept before {name} could reboot: {o.evidence}"))
    for e in result.escalations:
        console.print(Text(f"escalated {e.host} {e.finding} (key {e.key}): packet {e.packet}; page {e.page}",
                           style="red"))
    if result.halted:
        console.print(Text(f"the loop halted after a failed gate: {result.halted}", style="red"))
    for note in result.notes:
        console.print(Text(note, style="dim"))
    console.print(Text(f"state: {result.state}"))
