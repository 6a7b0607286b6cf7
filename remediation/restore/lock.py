"""One driver restore per fleet at a time: a lock file with who holds it.

``<state dir>/locks/driver-restore-<fleet>.lock`` holds JSON: pid, controller host name, user, start time, the
hosts asked for. It is created with ``O_CREAT | O_EXCL`` (atomic on a local file system). A lock is *stale* and
taken over when its pid is dead on this controller, or when it is older than the TTL (a controller that died
elsewhere, a crashed run). A second restore is refused with a message naming the holder.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import LockHeldError, RestoreError

__all__ = ["DEFAULT_TTL_S", "LockInfo", "fleet_lock", "lock_path", "read_lock", "stale_reason"]

DEFAULT_TTL_S = 6 * 3600.0


@dataclass(frozen=True)
class LockInfo:
    pid: int
    host: str
    user: str
    started_at: _dt.datetime
    fleet: str
    hosts: tuple[str, ...] = ()

    def describe(self) -> str:
        return (
            f"pid {self.pid} on {self.host} (user {self.user}), started {self.started_at.isoformat(timespec='seconds')}"
            + (f", hosts {','.join(self.hosts)}" if self.hosts else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "host": self.host,
            "user": self.user,
            "started_at": self.started_at.isoformat(),
            "fleet": self.fleet,
            "hosts": list(self.hosts),
        }


def lock_info_from_dict(d: dict[str, Any]) -> LockInfo:
    started = _dt.datetime.fromisoformat(str(d["started_at"]))
    if started.tzinfo is None:
        started = started.replace(tzinfo=_dt.UTC)
    return LockInfo(
        pid=int(d["pid"]),
        host=str(d["host"]),
        user=str(d.get("user", "?")),
        started_at=started,
        fleet=str(d.get("fleet", "?")),
        hosts=tuple(str(h) for h in d.get("hosts", ())),
    )


def lock_path(state_dir: Path, fleet: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in fleet)
    return state_dir / "locks" / f"driver-restore-{safe}.lock"


def read_lock(path: Path) -> LockInfo | None:
    """The holder recorded in ``path``; None when there is no lock file. Unreadable content: a holder of pid 0."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return lock_info_from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError):
        mtime = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.UTC)
        return LockInfo(0, "?", "?", mtime, "?")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_reason(
    info: LockInfo,
    *,
    now: _dt.datetime,
    ttl_s: float,
    this_host: str,
    pid_alive: Callable[[int], bool] = _pid_alive,
) -> str | None:
    """Why the lock can be taken over, or None when its holder may still be running (pure but for ``pid_alive``)."""
    age = (now - info.started_at).total_seconds()
    if age > ttl_s:
        return f"older than the TTL ({age:.0f} s > {ttl_s:.0f} s)"
    if info.host == this_host and not pid_alive(info.pid):
        return f"pid {info.pid} is not running on {this_host}"
    return None


@contextmanager
def fleet_lock(
    state_dir: Path,
    fleet: str,
    hosts: Sequence[str] = (),
    *,
    ttl_s: float = DEFAULT_TTL_S,
    on_stale: Callable[[LockInfo, str], None] | None = None,
) -> Iterator[LockInfo]:
    """Hold the fleet's restore lock for the ``with`` block; ``LockHeldError`` naming the holder otherwise."""
    path = lock_path(state_dir, fleet)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = LockInfo(
        pid=os.getpid(),
        host=socket.gethostname(),
        user=getpass.getuser(),
        started_at=_dt.datetime.now(_dt.UTC),
        fleet=fleet,
        hosts=tuple(hosts),
    )
    for _attempt in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_lock(path)
            if holder is None:
                continue  # released between our two calls
            why = stale_reason(holder, now=me.started_at, ttl_s=ttl_s, this_host=me.host)
            if why is None:
                raise LockHeldError(
                    f"another driver restore holds fleet {fleet!r}: {holder.describe()} (lock {path}); wait for it,"
                    " or remove the lock file if that run is gone"
                ) from None
            if on_stale is not None:
                on_stale(holder, why)
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(me.to_dict(), fh)
        break
    else:
        raise RestoreError(f"could not take the restore lock {path}: it keeps reappearing")
    try:
        yield me
    finally:
        current = read_lock(path)
        if current is not None and current.pid == me.pid and current.started_at == me.started_at:
            path.unlink(missing_ok=True)
