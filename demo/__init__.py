"""``invoke demo``: the product's face, one scene per capability, each checking itself.

A scene shows one runbook scenario the way on-call meets it, offline: on lab hosts, against the local service
stand-ins the tests also use, or on recorded snapshots. Each scene returns whether every step showed what it
should; the demo prints a summary and exits 1 when a scene did not. Scenes run in :data:`SCENES` order;
``invoke demo --scene NAME`` runs some of them. A capability adds its scene as ``demo/<name>.py`` with a
:class:`Scene` called ``SCENE`` and one line in :data:`SCENE_MODULES`.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.rule import Rule
from rich.table import Table

from remediation.core.errors import UsageError
from remediation.core.exitcodes import ExitCode
from remediation.report.console import console

if TYPE_CHECKING:
    from rich.console import Console

    from lab.control import Lab

__all__ = ["SCENE_MODULES", "Checks", "Scene", "SceneContext", "run_demo", "scenes"]


@dataclass(frozen=True)
class SceneContext:
    """What a scene gets: where to print, the project root, the lab (started by the scene that needs it)."""

    console: Console
    root: Path
    lab: Lab
    hosts: int


@dataclass(frozen=True)
class Scene:
    name: str  # what --scene takes
    title: str  # one line: the scenario and what the scene shows
    run: Callable[[SceneContext], bool]


class Checks:
    """A scene's self-checks, each with a name: a scene that fails says which of its checks did (on its console)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.failed: list[str] = []

    def __call__(self, passed: object, what: str) -> bool:
        if not passed:
            self.failed.append(what)
            self.console.print(f"check failed: {what}", markup=False)
        return bool(passed)

    @property
    def ok(self) -> bool:
        return not self.failed


#: Scene modules in the order the demo plays them.
SCENE_MODULES: tuple[str, ...] = (
    "demo.s1_driver", "demo.kernel_update", "demo.train", "demo.azure", "demo.k8s", "demo.aoai", "demo.remediate"
)


def scenes() -> list[Scene]:
    """Every scene, in order."""
    return [importlib.import_module(name).SCENE for name in SCENE_MODULES]


def run_demo(lab: Lab, hosts: int, root: Path, only: Sequence[str] = ()) -> ExitCode:
    """Play the scenes (all, or those named in ``only``); OK when every one showed what it should, else FINDINGS."""
    available = scenes()
    names = [s.name for s in available]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise UsageError(f"--scene {unknown[0]!r} is not a demo scene; scenes: {', '.join(names)}")
    chosen = [s for s in available if not only or s.name in only]
    ctx = SceneContext(console=console, root=root, lab=lab, hosts=hosts)
    results: list[tuple[Scene, bool, float]] = []
    for scene in chosen:
        console.print(Rule(f"[bold]{scene.name}[/bold]: {scene.title}", style="cyan"))
        start = time.monotonic()
        try:
            ok = scene.run(ctx)
        except Exception as exc:  # a scene that crashes is a failed scene; the others still play
            console.print(f"scene {scene.name} stopped: {type(exc).__name__}: {exc}", markup=False)
            ok = False
        results.append((scene, ok, time.monotonic() - start))
    table = Table(title="demo")
    for col in ("scene", "what it shows", "result", "seconds"):
        table.add_column(col)
    for scene, ok, seconds in results:
        table.add_row(scene.name, scene.title, "ok" if ok else "[red]DID NOT SHOW AS EXPECTED[/red]", f"{seconds:.0f}")
    console.print(table)
    failed = [scene.name for scene, ok, _ in results if not ok]
    console.print("demo: " + ("every scene showed what it should" if not failed else f"FAILED: {', '.join(failed)}"))
    return ExitCode.FINDINGS if failed else ExitCode.OK
