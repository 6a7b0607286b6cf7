"""A broken history file never stops the next audit: it is skipped with one warning, and saving works again.

Saving is atomic (a unique temporary file, fsynced, renamed) so a crash never leaves half a history file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_report_common import STARTED, build_result

from remediation.host.history import load_previous, save

ROOT = Path(__file__).resolve().parents[2]
CORRUPT = {
    "not json": "{not json",
    "other schema": json.dumps({"schema": "gpufleet.audit/2", "hosts": []}),
    "unreadable finding": json.dumps({"schema": "gpufleet.audit/1", "fleet": "gpu",
                                      "hosts": [{"host": "a", "status": "ok", "findings": [{"id": "X"}]}]}),
    "not an object": "[]",
}


@pytest.mark.parametrize("what", sorted(CORRUPT))
def test_a_corrupt_newest_file_is_skipped_with_a_warning(what: str, tmp_path: Path) -> None:
    good = save(build_result({"gpu-1": "healthy"}), tmp_path)
    bad = tmp_path / "audit-gpu-20991231T000000000000Z.json"
    bad.write_text(CORRUPT[what])
    warnings: list[str] = []
    doc = load_previous(tmp_path, "gpu", warn=warnings.append)
    assert doc is not None and doc == json.loads(good.read_text())
    assert len(warnings) == 1 and bad.name in warnings[0] and "skipped" in warnings[0]
    assert "\n" not in warnings[0]


def test_only_corrupt_files_is_a_first_run(tmp_path: Path) -> None:
    (tmp_path / "audit-gpu-20991231T000000000000Z.json").write_bytes(b"\xff\xfe")
    warnings: list[str] = []
    assert load_previous(tmp_path, "gpu", warn=warnings.append) is None
    assert len(warnings) == 1


def test_save_is_atomic_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    result = build_result({"gpu-1": "healthy"}, started=STARTED)
    path = save(result, tmp_path / "new")
    assert [p.name for p in (tmp_path / "new").iterdir()] == [path.name]
    assert json.loads(path.read_text())["schema"].startswith("gpufleet.audit/1")
    assert load_previous(tmp_path / "new", "gpu") == json.loads(path.read_text())


def _audit_history(inventory: Path, history: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INVOKE_AUDIT_HISTORY_DIR": str(history)}
    return subprocess.run(
        [sys.executable, "-m", "invoke", "audit", "--inventory", str(inventory), "--history", "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=120,
    )


def test_audit_history_with_a_corrupt_file_exits_with_the_findings_code_and_saves(tmp_path: Path) -> None:
    """The real CLI: a host nobody answers on (exit 3, unreachable) and a corrupt newest history file."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    gpu:\n      hosts:\n        gpu-down:\n"
        "          ansible_host: 127.0.0.1\n          ansible_port: 9\n"
    )
    history = tmp_path / "history"
    history.mkdir()
    bad = history / "audit-gpu-20991231T000000000000Z.json"
    bad.write_text("{not json")
    first = _audit_history(inventory, history)
    assert first.returncode == 3, first.stderr
    warning = [line for line in first.stderr.splitlines() if bad.name in line]
    assert len(warning) == 1 and warning[0].startswith("warning:"), first.stderr
    saved = sorted(p.name for p in history.iterdir() if p != bad)
    assert len(saved) == 1 and saved[0].startswith("audit-gpu-"), saved
    assert json.loads((history / saved[0]).read_text())["hosts"][0]["host"] == "gpu-down"
    second = _audit_history(inventory, history)  # and again: still the findings' code, another run saved
    assert second.returncode == 3, second.stderr
    assert len([p for p in history.iterdir() if p != bad]) == 2
