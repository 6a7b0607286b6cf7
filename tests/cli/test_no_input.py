"""``diagnose`` with nothing to read: no FILE and a terminal on stdin is one line saying what to pass (never a wait for
input); an empty file or an empty stdin is ``nothing to diagnose: <input> is empty``. Exit 2 both ways."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPUFLEET = [sys.executable, "-m", "commands.cli"]
INVOKE = [sys.executable, "-m", "invoke"]


def run(argv: list[str], stdin: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=ROOT, env=env, stdin=stdin, capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize("task", ["diagnose", "train.diagnose-oom", "aoai.diagnose"])
def test_no_file_and_a_terminal_on_stdin_says_what_to_pass(task: str) -> None:
    main, other = pty.openpty()
    try:
        r = run([*GPUFLEET, task], stdin=other)  # the timeout is the "no hang"
    finally:
        os.close(main)
        os.close(other)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"error: {task}: no input: give a FILE, - to read stdin (paste, then Ctrl-D), or pipe the text in "
        f"(... | gpufleet {task})"
    ]


@pytest.mark.parametrize("program", [GPUFLEET, INVOKE], ids=["gpufleet", "invoke"])
def test_an_empty_stdin_or_file_is_nothing_to_diagnose(program: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    given = run([*program, "diagnose", "-"], stdin=subprocess.DEVNULL)
    assert given.returncode == 2 and given.stderr.splitlines() == ["error: nothing to diagnose: <stdin> is empty"]
    named = run([*program, "diagnose", str(empty)], stdin=subprocess.DEVNULL)
    assert named.returncode == 2 and named.stderr.splitlines() == [f"error: nothing to diagnose: {empty} is empty"]


def test_no_file_and_nothing_piped_is_nothing_to_diagnose() -> None:
    """gpufleet reads stdin where FILE is missing and stdin is not a terminal (here /dev/null: empty)."""
    r = run([*GPUFLEET, "diagnose"], stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["error: nothing to diagnose: <stdin> is empty"]


def test_the_library_check_says_the_same_without_a_program() -> None:
    """read_input (what every task reading text calls) on a terminal without a FILE: the same line, BAD_INPUT."""
    from commands import read_input
    from remediation.core.errors import UsageError

    main, other = pty.openpty()
    saved = sys.stdin
    try:
        with os.fdopen(other, "r", closefd=False) as tty:
            sys.stdin = tty
            with pytest.raises(UsageError, match=r"^diagnose: no input: give a FILE, - to read stdin"):
                read_input(None, "diagnose")
    finally:
        sys.stdin = saved
        os.close(main)
        os.close(other)
