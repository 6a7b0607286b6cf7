"""The local fleet lock and the lock settings: a stale lock has exactly one taker; a TTL must be sane."""

from __future__ import annotations

import datetime as _dt
import json
import os
import threading
from pathlib import Path

import pytest

from remediation.config import KernelUpdateSettings, RestoreSettings, load_section
from remediation.core.errors import UsageError
from remediation.kernelupdate.errors import KernelUpdateError
from remediation.kernelupdate.flow import KernelUpdateOptions
from remediation.restore.errors import RestoreError
from remediation.restore.flow import RestoreOptions
from remediation.rollout.errors import LockHeldError
from remediation.rollout.lock import LockInfo, fleet_lock, lock_path, read_lock

TAKERS = 6
ROUNDS = 40


def _stale(path: Path) -> LockInfo:
    """A lock left by a crashed run: started a day ago (past any TTL)."""
    info = LockInfo(pid=999_999_999, host="elsewhere", user="ops",
                    started_at=_dt.datetime.now(_dt.UTC) - _dt.timedelta(days=1), fleet="gpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info.to_dict()))
    return info


def _race(state_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """TAKERS threads take over the same stale lock at once; each winner holds it until every taker has tried."""
    start = threading.Barrier(TAKERS)
    all_tried = threading.Barrier(TAKERS)
    winners: list[str] = []
    refused: list[str] = []
    other: list[str] = []
    took_over: list[str] = []

    def taker(i: int) -> None:
        name = f"taker-{i}"
        start.wait()
        try:
            with fleet_lock(state_dir, "gpu", (name,), ttl_s=3600,
                            on_stale=lambda holder, why: took_over.append(name)):
                winners.append(name)
                all_tried.wait()
                return
        except LockHeldError:
            refused.append(name)
        except Exception as exc:  # any other outcome is a failure of the test
            other.append(f"{name}: {type(exc).__name__}: {exc}")
        all_tried.wait()

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(TAKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a taker hung"
    return winners, refused, other + [f"took over: {n}" for n in took_over if n not in winners]


def test_racing_takeovers_of_a_stale_lock_have_exactly_one_winner(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        state_dir = tmp_path / f"r{round_}"
        _stale(lock_path(state_dir, "gpu"))
        winners, refused, other = _race(state_dir)
        assert other == [], f"round {round_}: {other}"
        assert len(winners) == 1, f"round {round_}: {len(winners)} runs believe they hold the lock: {winners}"
        assert len(refused) == TAKERS - 1
        assert read_lock(lock_path(state_dir, "gpu")) is None  # the winner released it


def test_a_live_lock_is_refused_naming_the_holder_and_released_after(tmp_path: Path) -> None:
    with fleet_lock(tmp_path, "gpu", ("gpu-1",)) as me:
        with pytest.raises(LockHeldError, match=f"pid {os.getpid()}"), fleet_lock(tmp_path, "gpu"):
            pass
        assert read_lock(lock_path(tmp_path, "gpu")) == me
    assert read_lock(lock_path(tmp_path, "gpu")) is None
    with fleet_lock(tmp_path, "gpu"):  # free again
        pass


def test_a_stale_lock_is_taken_over_and_reported(tmp_path: Path) -> None:
    stale = _stale(lock_path(tmp_path, "gpu"))
    seen: list[tuple[LockInfo, str]] = []
    with fleet_lock(tmp_path, "gpu", ttl_s=3600, on_stale=lambda h, why: seen.append((h, why))) as me:
        assert read_lock(lock_path(tmp_path, "gpu")) == me
    assert seen and seen[0][0] == stale and "older than the TTL" in seen[0][1]


@pytest.mark.parametrize("ttl", ["0", "-5", "29", 0.5])
@pytest.mark.parametrize(("cls", "section"), [(RestoreSettings, "driver_restore"),
                                              (KernelUpdateSettings, "kernel_update")])
def test_a_lock_ttl_under_30_s_is_refused_at_config_load(cls: type, section: str, ttl: object) -> None:
    with pytest.raises(UsageError) as err:
        load_section(cls, {"lock_ttl_s": ttl}, section)
    message = str(err.value)
    assert f"setting {section}.lock_ttl_s" in message and "at least 30" in message
    assert "\n" not in message


def test_a_sane_lock_ttl_loads() -> None:
    assert load_section(RestoreSettings, {"lock_ttl_s": "30"}, "driver_restore").lock_ttl_s == 30.0
    assert load_section(KernelUpdateSettings, {"lock_ttl_s": 7200}, "kernel_update").lock_ttl_s == 7200.0


def test_the_flows_refuse_a_bad_lock_ttl_too() -> None:
    with pytest.raises(RestoreError, match="lock_ttl_s"):
        RestoreOptions(lock_ttl_s=0).validate()
    with pytest.raises(KernelUpdateError, match="lock_ttl_s"):
        KernelUpdateOptions(lock_ttl_s=-1).validate()


@pytest.mark.parametrize(("task", "section"),
                         [("driver-restore", "DRIVER_RESTORE"), ("kernel-update", "KERNEL_UPDATE")])
def test_the_cli_refuses_a_zero_lock_ttl_with_one_line_and_exit_2(task: str, section: str) -> None:
    """The real CLI: the setting is refused at config load, before any host is looked at."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-m", "invoke", task, "--check"],
        capture_output=True, text=True, cwd=root, timeout=120, check=False,
        env={**os.environ, f"INVOKE_{section}_LOCK_TTL_S": "0"},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert f"setting {section.lower()}.lock_ttl_s 0.0 must be at least 30 seconds" in r.stderr
