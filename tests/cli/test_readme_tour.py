"""The README's quick tour, as written: every command between the tour markers runs from the repository root.

No lab, no Azure login, no cluster, no network: each reads a file in the repository. Exit 0 (nothing found) or 1
(findings) only, something on stdout, never a traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- tour:begin -->", "<!-- tour:end -->"


def tour_lines() -> list[str]:
    """The lines of the tour's ``sh`` block, as written (comments included)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, "one tour block in README.md"
    block = readme[readme.index(BEGIN) + len(BEGIN) : readme.index(END)].strip()
    assert block.startswith("```sh\n") and block.endswith("\n```"), "the tour is one ```sh block"
    return [line for line in block.splitlines()[1:-1] if line.strip() and not line.lstrip().startswith("#")]


def command_of(line: str) -> str:
    """The command without its trailing ``# comment``."""
    return re.split(r"\s+#\s", line, maxsplit=1)[0].strip()


LINES = tour_lines()


def test_the_tour_covers_every_scenario() -> None:
    assert len(LINES) >= 5
    for line in LINES:
        assert not line.rstrip().endswith("\\"), f"no line continuations: {line}"
        assert re.search(r"\s#\sS[1-5]\b", line), f"each command says its scenario (# S1..S5): {line}"
        command = command_of(line)
        # gpufleet: the program that keeps "bad input is one line and exit 2" for Invoke's own parse errors too
        assert command.startswith(".venv/bin/gpufleet ") or re.match(
            r"cat \S+ \| \.venv/bin/gpufleet ", command
        ), command
        assert "/work/" not in command and not re.search(r"(^|\s)/", command), f"paths relative to the root: {command}"
    tags = {tag for line in LINES for tag in re.findall(r"#\s(S[1-5])\b", line)}
    assert tags == {"S1", "S2", "S3", "S4", "S5"}


@pytest.mark.parametrize("line", LINES, ids=[command_of(line)[:90] for line in LINES])
def test_the_tour_command_runs(line: str) -> None:
    command = command_of(line)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode in (0, 1), (command, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert r.stdout.strip(), (command, r.stderr[-2000:])
    assert "Traceback (most recent call last)" not in r.stdout + r.stderr, (command, r.stderr[-2000:])
