"""``invoke demo``: the product's face, a self-checking game day on the lab and the local stand-ins."""

from __future__ import annotations

from invoke import Exit, task

from commands import ROOT, edge
from commands.lab import the_lab


@task(
    iterable=["scene"],
    help={"hosts": "lab size for the demo", "scene": "play only this scene (repeatable); all scenes by default"},
)
@edge
def demo(c, hosts=3, scene=None):  # type: ignore[no-untyped-def]
    """Game day: every runbook scenario as on-call meets it, on the lab and local stand-ins; checks itself."""
    from demo import run_demo

    raise Exit(code=run_demo(the_lab(c), int(hosts), ROOT, only=tuple(scene or ())))
