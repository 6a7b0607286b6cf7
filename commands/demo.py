"""``invoke demo``: the product's face, a self-checking game day on the lab and the local stand-ins."""

from __future__ import annotations

from invoke import Exit, task

from commands import edge, project_dir, with_collections
from commands.lab import the_lab


@task(
    iterable=["scene"],
    help={"hosts": "lab size for the demo", "scene": "play only this scene (repeatable); all scenes by default"},
)
@edge
@with_collections
def demo(c, hosts=3, scene=None):  # type: ignore[no-untyped-def]
    """Game day: every runbook scenario as on-call meets it, on the lab and local stand-ins; checks itself."""
    from remediation.core.errors import UsageError

    try:
        from demo import run_demo
    except ModuleNotFoundError as exc:
        if exc.name != "demo":
            raise
        raise UsageError("the demo plays from a checkout (./run demo there); it is not installed") from None
    raise Exit(code=run_demo(the_lab(c), int(hosts), project_dir(c), only=tuple(scene or ())))
