"""Human output on a terminal (rich tables); nothing here decides anything."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

# Wide enough for the fleet table when piped (CI logs, files); a terminal keeps its own width.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


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
