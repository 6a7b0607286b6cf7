"""An unfinished journal on a host (a run cut short, or whose undo failed) keeps a new change off that host."""

from __future__ import annotations

import json

import pytest

from remediation.rollout.journal import FINISHED, JOURNAL_PATH, JOURNAL_SCHEMA, unfinished_journal

ARGS = {"path": JOURNAL_PATH, "host": "gpu-2", "inventory": "inventories/lab/hosts.yml",
        "playbook": "playbooks/driver_restore.yml", "operation_var": "nvidia_driver_restore_operation",
        "run_id_var": "nvidia_driver_restore_run_id"}


def _journal(status: str | None, run_id: str = "20261204T010203Z-abc123") -> str:
    doc = {"schema": JOURNAL_SCHEMA, "run_id": run_id, "host": "gpu-2", "changes": [], "undone": []}
    if status is not None:
        doc["status"] = status
    return json.dumps(doc)


@pytest.mark.parametrize("status", sorted(FINISHED))
def test_a_finished_or_undone_journal_lets_the_host_change(status: str) -> None:
    assert unfinished_journal(_journal(status), **ARGS) is None


def test_no_journal_lets_the_host_change() -> None:
    assert unfinished_journal("", **ARGS) is None
    assert unfinished_journal("\n", **ARGS) is None


@pytest.mark.parametrize("status", ["running", "failed", None])
def test_an_unfinished_journal_blocks_with_one_line_naming_the_journal_and_the_undo(status: str | None) -> None:
    why = unfinished_journal(_journal(status), **ARGS)
    assert why is not None and "\n" not in why
    assert JOURNAL_PATH in why and f"still '{status or 'running'}'" in why
    assert ("ansible-playbook -i inventories/lab/hosts.yml playbooks/driver_restore.yml --limit gpu-2 "
            "-e nvidia_driver_restore_operation=undo -e nvidia_driver_restore_run_id=20261204T010203Z-abc123") in why


def test_host_text_in_the_undo_command_is_quoted_and_bounded() -> None:
    why = unfinished_journal(_journal("running", run_id="x; rm -rf / " + "y" * 500), **ARGS)
    assert why is not None
    assert "nvidia_driver_restore_run_id='x; rm -rf / " in why and "y" * 101 not in why


@pytest.mark.parametrize("text", ["{half", "[]", "null"])
def test_an_unreadable_journal_blocks(text: str) -> None:
    why = unfinished_journal(text, **ARGS)
    assert why is not None and "unreadable" in why and JOURNAL_PATH in why
