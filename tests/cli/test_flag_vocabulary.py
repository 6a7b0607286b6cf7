"""One flag vocabulary for every task (README "Flags every task uses"), checked over the project's namespace.

Long flags only (no automatic short flag: ``-h`` is always help), no parameter named ``h``, and ``-h``/``--help``
after any task prints that task's help and exits 0 under ``invoke`` and ``gpufleet``, also where the task's
positional (FILE, TEMPLATE, HOST) is not given yet.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invoke import Collection

from commands.namespace import ns

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]
GPUFLEET = [sys.executable, "-m", "commands.cli"]


def tasks(collection: Collection = ns, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, task in collection.tasks.items():
        yield prefix + name, task
    for name, sub in collection.collections.items():
        yield from tasks(sub, f"{prefix}{name}.")


TASKS = sorted(tasks(), key=lambda item: item[0])
NAMES = [name for name, _task in TASKS]


def cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(("name", "task"), TASKS, ids=NAMES)
def test_every_flag_is_long(name: str, task: Any) -> None:
    arguments = task.get_arguments()
    assert arguments or name in ("lab.status",)
    for argument in arguments:
        assert argument.name != "h", name
        assert all(len(flag) > 1 for flag in argument.names), (name, argument.names)


def test_help_lists_no_short_flag_and_no_bare_dashes() -> None:
    r = cli([*INVOKE, "--help", "train.plan"])
    assert r.returncode == 0, r.stderr
    assert "--lora-targets=STRING" in r.stdout and "--=STRING" not in r.stdout
    assert " -h," not in r.stdout and " -g," not in r.stdout


def positionals(task: Any) -> int:
    return sum(1 for argument in task.get_arguments() if argument.positional)


@pytest.mark.parametrize(
    ("program", "usage"), [(INVOKE, "inv[oke]"), (GPUFLEET, "gpufleet")], ids=["invoke", "gpufleet"]
)
@pytest.mark.parametrize(("name", "task"), TASKS, ids=NAMES)
def test_dash_h_after_any_task_is_its_help(program: list[str], usage: str, name: str, task: Any) -> None:
    r = cli([*program, name, "-h"])
    if program is INVOKE and positionals(task) > 1:
        # Invoke's parser gives -h to the first positional and then misses the second, before any task code runs:
        # `invoke --help TASK` there (gpufleet reads -h before Invoke's parser)
        assert "did not receive required positional arguments" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: {usage} [--core-opts] {name} "), r.stdout[:200]
    assert r.stderr == ""


@pytest.mark.parametrize("argv", [["audit", "-h"], ["k8s.render", "--help"], ["train.plan", "--model", "x", "-h"]])
def test_help_after_an_alias_or_other_flags(argv: list[str]) -> None:
    r = cli([*GPUFLEET, *argv])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: gpufleet [--core-opts] {argv[0]} "), r.stdout[:200]
