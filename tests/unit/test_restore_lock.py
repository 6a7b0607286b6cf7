"""The fleet lock: one restore per fleet, the holder named, stale locks expire."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import pytest

from remediation.rollout.errors import LockHeldError
from remediation.rollout.lock import LockInfo, fleet_lock, lock_path, read_lock, stale_reason

NOW = _dt.datetime(2024, 7, 15, 8, 0, tzinfo=_dt.UTC)


def _info(pid: int = 123, host: str = "ctl", age_s: float = 10) -> LockInfo:
    return LockInfo(pid, host, "oncall", NOW - _dt.timedelta(seconds=age_s), "gpu", ("gpu-2",))


def test_stale_when_old_or_dead_pid_on_this_controller() -> None:
    alive = lambda pid: True  # noqa: E731
    dead = lambda pid: False  # noqa: E731
    assert stale_reason(_info(), now=NOW, ttl_s=3600, this_host="ctl", pid_alive=alive) is None
    assert "not running" in (stale_reason(_info(), now=NOW, ttl_s=3600, this_host="ctl", pid_alive=dead) or "")
    # A pid on another controller cannot be checked: only the TTL expires it.
    assert stale_reason(_info(host="other"), now=NOW, ttl_s=3600, this_host="ctl", pid_alive=dead) is None
    assert "TTL" in (stale_reason(_info(age_s=7200, host="other"), now=NOW, ttl_s=3600, this_host="ctl") or "")


def test_second_restore_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with fleet_lock(tmp_path, "gpu", ["gpu-2"]) as me:
        assert read_lock(lock_path(tmp_path, "gpu")) == me
        with pytest.raises(LockHeldError, match=rf"pid {os.getpid()} on .*hosts gpu-2"), fleet_lock(tmp_path, "gpu"):
            pass
        with fleet_lock(tmp_path, "other-fleet"):  # another fleet is not blocked
            pass
    assert not lock_path(tmp_path, "gpu").exists()


def test_dead_holder_is_taken_over(tmp_path: Path) -> None:
    path = lock_path(tmp_path, "gpu")
    path.parent.mkdir(parents=True)
    import socket

    stale = {"pid": 2**22 + 7, "host": socket.gethostname(), "user": "x",
             "started_at": _dt.datetime.now(_dt.UTC).isoformat(), "fleet": "gpu", "hosts": []}
    path.write_text(json.dumps(stale))
    seen = []
    with fleet_lock(tmp_path, "gpu", on_stale=lambda info, why: seen.append(why)) as me:
        assert me.pid == os.getpid()
    assert seen and "not running" in seen[0]
