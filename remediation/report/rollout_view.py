"""What every rolling change prints the same way: the stop line, the before/after table, the leases, the outcome
lines of a host's resolution, the incident report's header. The driver restore's and the kernel update's views add
only their own columns and words (:mod:`.restore_view`, :mod:`.kernel_update_view`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.table import Table
from rich.text import Text

from remediation.core.exitcodes import ExitCode
from remediation.report.markdown import code, fence, inline
from remediation.rollout.engine import StopReason
from remediation.rollout.lock import describe_lease

if TYPE_CHECKING:
    from remediation.host.audit import HostAudit
    from remediation.rollout.engine import Rollout

__all__ = ["after_of", "lease_lines", "outcome_lines", "print_outcomes", "report_header", "stop_line"]

# What a run that changed nothing says, by change; the rest of the words are shared.
_NOTHING = {"driver-restore": "no host needs a driver restore; nothing ran",
            "kernel-update": "no host has a kernel to move to; nothing ran"}


class _Outcome(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def where(self) -> str | None: ...
    @property
    def detail(self) -> str: ...
    @property
    def changed(self) -> tuple[str, ...]: ...
    @property
    def undone(self) -> tuple[str, ...]: ...
    @property
    def undo_error(self) -> str | None: ...


def stop_line(result: Rollout[Any, Any, Any]) -> str | None:
    """One line for a run that changed nothing (preview, declined, nothing to do); None otherwise."""
    if result.stopped is None or not result.stopped.changed_nothing:
        return None
    what = {StopReason.PREVIEW: "--check: nothing was changed",
            StopReason.DECLINED: "not confirmed: nothing was changed",
            StopReason.NOTHING_TO_DO: _NOTHING.get(result.change, "nothing to do; nothing ran")}[result.stopped]
    return f"{result.change}: {what}"


def after_of(result: Rollout[Any, Any, Any], host: str) -> HostAudit | None:
    if result.after is None or host not in {h.host for h in result.after.hosts}:
        return None
    return result.after.host(host)


def _detail(o: _Outcome) -> str:
    detail = (f"{o.where}: " if o.where else "") + o.detail
    if o.undone:
        detail += " | undone: " + "; ".join(o.undone)
    if o.undo_error:
        detail += " | " + o.undo_error
    return detail


def lease_lines(result: Rollout[Any, Any, Any]) -> list[str]:
    leases = result.leases
    if leases is None:
        return []
    out = [f"rollout lease held on {len(leases.held)} host(s) of the fleet while the run changed hosts"]
    if leases.unreachable:
        out.append(f"not leased (unreachable): {', '.join(leases.unreachable)}")
    for host, stale in sorted(leases.took_over.items()):
        out.append(f"{host}: took over the expired lease of {describe_lease(stale)}")
    for host, why in sorted(leases.lost.items()):
        out.append(f"{host}: lease lost during the run: {why}")
    return out


def print_outcomes(console: Console, result: Rollout[Any, Any, Any], state: Callable[[HostAudit | None], str],
                   *, ok: str, not_ok: str) -> None:
    """The stop line, the before/after table (host text never markup), the leases and the verdict line."""
    if (line := stop_line(result)) is not None:
        console.print(line, markup=False)
    table = Table(title=f"{result.change} {result.run_id}: before / after")
    for col in ("host", "status", "before", "after", "detail"):
        table.add_column(col)
    outcomes: Sequence[Any] = result.outcomes
    for o in outcomes:
        table.add_row(Text(o.host), o.status.value, Text(state(result.before.host(o.host))),
                      Text(state(after_of(result, o.host))), Text(_detail(o)))
    console.print(table)
    if result.stopped is not None and not result.stopped.changed_nothing:
        console.print(Text(result.stop_detail or result.stopped.value, style="red"))
    for lease in lease_lines(result):
        console.print(lease, markup=False)
    console.print(ok if result.exit_code == ExitCode.OK else f"[red]{not_ok}[/red]")


def outcome_lines(o: _Outcome, status: str) -> list[str]:
    """A host's outcome in the report: what happened, what the journal recorded, what was undone, an undo error."""
    lines = [f"Outcome: **{status}**" + (f" at {inline(o.where)}" if o.where else "")
             + (f": {inline(o.detail)}" if o.detail else ""), ""]
    if o.changed:
        lines += ["What this run did on the host (its journal):", "", fence(list(o.changed)), ""]
    if o.undone:
        lines += ["Undone after the failure:", "", fence(list(o.undone)), ""]
    if o.undo_error:
        lines += [f"Undo: {inline(o.undo_error)}", ""]
    return lines


def report_header(result: Rollout[Any, Any, Any], title: str) -> list[str]:
    out = [f"# {title} {code(result.run_id)} on fleet {code(result.fleet)}", ""]
    if result.stopped is not None:
        out += [f"Run: {inline(result.stop_detail or result.stopped.value)}", ""]
    out += [f"- {inline(line)}" for line in lease_lines(result)]
    if result.leases is not None:
        out.append("")
    return out
