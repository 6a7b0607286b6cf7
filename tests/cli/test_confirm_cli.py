"""The one confirmation check every task that changes something shares (``commands.require_confirmation``):
without a terminal and without --yes or --check each task stops before anything is sent, with its own one line and
exit 2; ``commands.ask`` reads the answer. No case reaches a host or Azure."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commands import ask, require_confirmation
from remediation.core.errors import UsageError
from remediation.core.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = "all:\n  children:\n    gpu:\n      hosts:\n        gpu-1:\n          ansible_host: 127.0.0.1\n"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["harden"], "harden changes hosts and there is no terminal to confirm on: pass --yes, or --check to preview"),
        (["driver-restore", "--inventory", "{inv}"],
         "driver-restore changes hosts and there is no terminal to confirm on: pass --yes, or --check to see the plan"),
        (["kernel-update", "--inventory", "{inv}"],
         "kernel-update changes hosts and there is no terminal to confirm on: pass --yes, or --check to see the plan"),
        (["quota.request", "--location", "eastus", "--family", "standardNCADSA100v4Family", "--vcpus", "96"],
         "quota.request asks Azure for more quota and there is no terminal to confirm on: pass --yes, or --check"
         " to see the request"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_no_terminal_is_one_line_and_bad_input(argv: list[str], line: str, tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    args = [a.replace("{inv}", str(inventory)) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, check=False, env={**os.environ})
    assert proc.returncode == ExitCode.BAD_INPUT == 2, proc.stderr
    assert proc.stderr == f"error: {line}\n"


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str, tty: bool) -> None:
    stream = io.StringIO(text)
    stream.isatty = lambda: tty  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdin", stream)


def test_require_confirmation_passes_with_check_yes_or_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    _stdin(monkeypatch, "", tty=False)
    require_confirmation("x changes hosts", check=True, yes=False, preview="to preview")
    require_confirmation("x changes hosts", check=False, yes=True, preview="to preview")
    with pytest.raises(UsageError, match=r"^x changes hosts and there is no terminal to confirm on: pass --yes, "
                                         r"or --check to preview$") as exc:
        require_confirmation("x changes hosts", check=False, yes=False, preview="to preview")
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(UsageError):
        require_confirmation("x changes hosts", check=False, yes=False, preview="to preview")
    _stdin(monkeypatch, "", tty=True)
    require_confirmation("x changes hosts", check=False, yes=False, preview="to preview")


@pytest.mark.parametrize(("answer", "expected"), [("y\n", True), (" YES \n", True), ("Yes\n", True), ("\n", False),
                                                  ("n\n", False), ("yes please\n", False)])
def test_ask(answer: str, expected: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _stdin(monkeypatch, answer, tty=True)
    assert ask("apply to 2 host(s): gpu-1, gpu-2") is expected
    assert capsys.readouterr().out == "apply to 2 host(s): gpu-1, gpu-2? [y/N] "
