"""Human output on a terminal (rich tables); nothing here decides anything."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from lab.control import HostStatus, UpResult

# Wide enough for the fleet table when piped (CI logs, files); a terminal keeps its own width.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def print_lab_up(result: UpResult) -> None:
    built = " (base image built and cached)" if result.base_built else ""
    console.print(
        f"lab up: {len(result.hosts)} host(s) answering SSH in {result.seconds:.1f} s{built}; "
        f"started {len(result.started)}, removed {len(result.removed)}"
    )
    console.print(f"inventory: {result.inventory}")
    console.print(f"ssh:       ssh -F {result.inventory.parent / 'ssh_config'} {result.hosts[0]}")


def print_lab_status(hosts: Sequence[HostStatus]) -> None:
    if not hosts:
        console.print("no lab hosts (run `invoke lab.up`)")
        return
    table = Table(title="lab hosts")
    for col in ("host", "address", "state", "ssh", "release", "kernel", "boots", "boot id", "faults"):
        table.add_column(col)
    for h in hosts:
        table.add_row(
            h.name,
            h.address,
            h.state,
            "yes" if h.ssh else "no",
            h.release,
            h.kernel or "-",
            str(h.boots),
            (h.boot_id or "-")[:8],
            ", ".join(h.faults) or "-",
        )
    console.print(table)


@contextmanager
def progress_bar(total: int, enabled: bool = True) -> Iterator[Callable[[Any], None]]:
    """A progress bar on a terminal for long fan-outs; a no-op when not a TTY or not wanted."""
    if not enabled or not console.is_terminal or total < 10:
        yield lambda _run: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("probing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as progress:
        job = progress.add_task("probe", total=total)
        yield lambda _run: progress.advance(job)
