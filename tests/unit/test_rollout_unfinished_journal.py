"""The rollout engine never reports a host with an unfinished journal as unchanged.

A controller killed after its own work took effect on a host (the restored driver loaded after the reboot) but
before the journal said so leaves a host that needs nothing now and a ``running`` journal. The next run leaves that
host alone with the journal's one line (naming the undo), as it does a host it would change; a host with no such
journal is reported as the change says (nothing to do). The audit and the hosts' journals are stand-ins here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from remediation.host.audit import AuditOptions
from remediation.rollout import engine
from remediation.rollout.engine import Applied, ChangeKind, ChangeSpec, Outcome, RolloutSettings, StopReason, Verdict
from remediation.transport.inventory import Host

LINE = "the journal /var/lib/gpufleet/driver-restore/journal.json of run 'r1' is still 'running' ...: undo it with `x`"


class _Nothing:
    """A change with nothing to do on any host (every host healthy now)."""

    spec = ChangeSpec(ChangeKind.DRIVER_RESTORE, "/var/lib/gpufleet/driver-restore/journal.json",
                      "gpufleet.remediation.driver_restore", "nvidia_driver_restore")

    def plan(self, before: Any, hosts: Sequence[Host], cordon: Mapping[str, str | None], blocks: Mapping[str, str],
             run_id: str) -> tuple[str, ...]:
        return tuple(h.name for h in hosts)

    def host_of(self, item: str) -> str:
        return item

    def changes(self, item: str) -> bool:
        return False

    def unchanged(self, item: str) -> Verdict:
        return Verdict.UNCHANGED

    def reason(self, item: str) -> str:
        return "NVML answers: nothing to restore"

    def apply(self, batch: Sequence[str], run_id: str) -> Applied:
        raise AssertionError("nothing is applied")

    def judge(self, item: str, after: Any, journal: Any) -> tuple[Verdict, str, str]:
        raise AssertionError("nothing is judged")

    def undo(self, hosts: Sequence[str], run_id: str) -> Any:
        raise AssertionError("nothing is undone")

    def outcome(self, o: Outcome[str]) -> Outcome[str]:
        return o


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_host_with_an_unfinished_journal_and_nothing_to_do_is_left_alone_with_the_journal_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dry_run: bool
) -> None:
    probed = SimpleNamespace(host=lambda name: SimpleNamespace(probed=True))
    monkeypatch.setattr(engine, "run_audit", lambda *a, **k: probed)
    monkeypatch.setattr(engine, "cordon_markers", lambda *a, **k: {})
    monkeypatch.setattr(engine, "journal_blocks", lambda *a, **k: {"gpu-2": LINE})
    hosts = [Host("gpu-1", "127.0.0.1"), Host("gpu-2", "127.0.0.2")]
    result = engine.run_rollout(_Nothing(), hosts, "inventory.yml", AuditOptions(),
                                RolloutSettings(dry_run=dry_run, state_dir=tmp_path), None)
    assert result.stopped is StopReason.NOTHING_TO_DO
    assert result.verdicts == {"gpu-1": Verdict.UNCHANGED, "gpu-2": Verdict.LEFT_ALONE}
    assert result.outcome("gpu-1").detail == "NVML answers: nothing to restore"
    assert result.outcome("gpu-2").detail == LINE
    assert result.exit_code == 1  # not every host is done: gpu-2's journal waits for its undo
    assert not (tmp_path / "locks").exists()  # nothing was locked, leased or changed
