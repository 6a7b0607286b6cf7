"""One rolling change per fleet at a time, whichever controller runs it: a local lock and leases on the hosts.

A driver restore and a kernel update never run at once on one fleet or one host: both take the same lock and the
same leases, and each records its change kind, so a refusal names what holds the fleet or the host.

The local lock: ``<state dir>/locks/rollout-<fleet>.lock`` holds JSON: pid, controller host name, user, start time,
the change kind, the hosts asked for. A lock is *stale* when its pid is dead on this controller, or when it is older
than the TTL (a crashed run). Taking, taking over and releasing the lock are each one step under an exclusive
``flock`` of ``<lock>.guard``, a file that is never renamed or removed: "is it free or stale? then it is mine" reads
the holder, judges it and writes the new one while no other taker can look, so two runs can never both believe they
hold it. The content is written to a temporary file, fsynced and renamed over the lock, so a reader never sees half a
holder.

The host leases (:func:`host_leases`): the local lock cannot see a second controller or a second clone, so every
reachable host of the fleet also carries a lease (``/var/lib/gpufleet/rollout.lease``, see
:mod:`remediation.hostside.hostlease`) with the run id, controller, user, pid and an expiry in the host's clock. A
run takes every lease or none; a lease held by another run that has not expired refuses the run with exit 4 and
names the holder; an expired one, or one whose run's process is gone from this controller (``kill -9``, a crash), is
taken over atomically on the host (under ``flock``). Leases are renewed before
every batch (a lease another run holds by then is *lost*: the engine stops before the batch) and released at the
end, whatever happened.
"""

from __future__ import annotations

import base64
import datetime as _dt
import fcntl
import getpass
import json
import os
import shlex
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remediation.core.durable import write_atomic
from remediation.hostside import HOSTLEASE_PATH
from remediation.rollout.errors import LockHeldError, RolloutError

if TYPE_CHECKING:
    from remediation.transport.inventory import Host

__all__ = [
    "DEFAULT_TTL_S",
    "MIN_TTL_S",
    "HostLeases",
    "LockInfo",
    "check_ttl",
    "fleet_lock",
    "host_leases",
    "lock_path",
    "read_lock",
    "stale_reason",
]

DEFAULT_TTL_S = 6 * 3600.0


@dataclass(frozen=True)
class LockInfo:
    pid: int
    host: str
    user: str
    started_at: _dt.datetime
    fleet: str
    hosts: tuple[str, ...] = ()
    change: str = ""  # driver-restore | kernel-update

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
            "change": self.change,
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
        change=str(d.get("change", "")),
    )


def lock_path(state_dir: Path, fleet: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in fleet)
    return state_dir / "locks" / f"rollout-{safe}.lock"


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


GUARD_WAIT_S = 30.0
MIN_TTL_S = 30.0


def check_ttl(ttl_s: float, setting: str) -> str | None:
    """Why ``ttl_s`` is not a usable lock/lease TTL (None when it is): below 30 s a live run's lock is "stale"."""
    if not ttl_s >= MIN_TTL_S:  # also NaN
        return (f"{setting} {ttl_s!r} must be at least {MIN_TTL_S:.0f} seconds (the default is "
                f"{DEFAULT_TTL_S:.0f}): a shorter TTL lets a second run take over a live run's lock and leases")
    return None


@contextmanager
def _guarded(path: Path) -> Iterator[None]:
    """Hold the exclusive ``flock`` of ``<path>.guard`` (created once, never renamed) for one read-judge-write."""
    guard = os.open(path.with_name(path.name + ".guard"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + GUARD_WAIT_S
        while True:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RolloutError(
                        f"could not take the rollout lock {path}: its guard stayed busy for {GUARD_WAIT_S:.0f} s"
                    ) from None
                time.sleep(0.01)
        yield
    finally:
        os.close(guard)  # releases the flock


def _write_lock(path: Path, info: LockInfo) -> None:
    """``info`` into ``path``: a temporary file, fsynced, renamed over it, then the directory fsynced."""
    write_atomic(path, json.dumps(info.to_dict()))


@contextmanager
def fleet_lock(
    state_dir: Path,
    fleet: str,
    hosts: Sequence[str] = (),
    *,
    ttl_s: float = DEFAULT_TTL_S,
    on_stale: Callable[[LockInfo, str], None] | None = None,
    change: str = "",
) -> Iterator[LockInfo]:
    """Hold the fleet's rollout lock for the ``with`` block; ``LockHeldError`` naming the holder otherwise."""
    if (bad := check_ttl(ttl_s, "lock_ttl_s")) is not None:
        raise RolloutError(bad)
    path = lock_path(state_dir, fleet)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = LockInfo(
        pid=os.getpid(),
        host=socket.gethostname(),
        user=getpass.getuser(),
        started_at=_dt.datetime.now(_dt.UTC),
        fleet=fleet,
        hosts=tuple(hosts),
        change=change,
    )
    stale: tuple[LockInfo, str] | None = None
    with _guarded(path):
        holder = read_lock(path)
        if holder is not None:
            why = stale_reason(holder, now=me.started_at, ttl_s=ttl_s, this_host=me.host)
            if why is None:
                raise LockHeldError(
                    f"another {holder.change or 'rolling change'} holds fleet {fleet!r}: {holder.describe()}"
                    f" (lock {path}); wait for it,"
                    " or remove the lock file if that run is gone"
                )
            stale = (holder, why)
        _write_lock(path, me)
    if stale is not None and on_stale is not None:
        on_stale(*stale)
    try:
        yield me
    finally:
        with _guarded(path):
            if read_lock(path) == me:
                path.unlink(missing_ok=True)


# --- leases on the hosts ------------------------------------------------------------------------------------------

_LEASE_SCRIPT = HOSTLEASE_PATH  # sent as it is, on the stdin of the host's python3


@dataclass
class HostLeases:
    """The leases one run holds: on which hosts, and which hosts could not be asked (unreachable: not connected or
    timed out; a host that answered but could not take the lease, e.g. sudo refused, refuses the run instead)."""

    run_id: str
    held: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    took_over: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> the expired lease replaced
    # Renew every held lease; host -> why its lease is no longer this run's (another run holds it now). A host that
    # does not answer the renewal keeps its lease until its expiry: it is not lost.
    renew: Callable[[], dict[str, str]] = field(default=dict, repr=False)
    lost: dict[str, str] = field(default_factory=dict)  # every lease found lost at a renewal


def _lease_request(op: str, **fields: Any) -> str:
    payload = base64.b64encode(json.dumps({"op": op, **fields}).encode()).decode()
    return "python3 - " + shlex.quote(payload)


def _lease_answers(
    hosts: Sequence[Host], command: str, connect_timeout: float, concurrency: int | None
) -> dict[str, Any]:
    from remediation.transport.fanout import Status, fan_out

    runs = fan_out(
        hosts,
        command,
        stdin=_LEASE_SCRIPT.read_bytes(),
        concurrency=concurrency,
        connect_timeout=connect_timeout,
        timeout=60,
    )
    out: dict[str, Any] = {}
    for name, run in runs.runs.items():
        if run.status in (Status.UNREACHABLE, Status.TIMED_OUT):
            out[name] = None
            continue
        if run.status is not Status.OK:  # reached, but the lease program did not run (sudo refused, no python3)
            last = (run.stderr.strip().splitlines() or [f"exit {run.exit_code}"])[-1][-300:]
            out[name] = {"result": "error", "error": run.error or last}
            continue
        try:
            out[name] = json.loads(run.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out[name] = {"result": "error", "error": (run.stderr or run.stdout).strip()[-300:]}
    return out


def describe_lease(lease: dict[str, Any]) -> str:
    until = lease.get("expires_at")
    when = (
        _dt.datetime.fromtimestamp(float(until), _dt.UTC).isoformat(timespec="seconds")
        if isinstance(until, int | float)
        else "?"
    )
    return (
        f"run {lease.get('run_id', '?')} of fleet {lease.get('fleet', '?')!r} from {lease.get('controller', '?')} "
        f"(user {lease.get('user', '?')}, pid {lease.get('pid', '?')}), until {when}"
    )


@contextmanager
def host_leases(
    hosts: Sequence[Host],
    *,
    run_id: str,
    fleet: str,
    planned: Sequence[str] = (),
    ttl_s: float = DEFAULT_TTL_S,
    connect_timeout: float = 10.0,
    concurrency: int | None = None,
    change: str = "",
) -> Iterator[HostLeases]:
    """Hold the rollout lease on every reachable host of ``hosts`` for the ``with`` block (all or none).

    Raises :class:`LockHeldError` (exit 4) naming a host and its holder when another run's lease has not expired;
    the leases this call took are released first. Unreachable hosts are listed, not leased: nobody can change them.
    A host that was reached but could not take its lease (sudo refused, ``/var/lib/gpufleet`` not writable) is
    :class:`RestoreError` naming the host and why: it can be changed, so it is never run on without a lease.
    The lease program runs with the host's privilege escalation (``sudo -n``, see :mod:`remediation.transport.fanout`).
    """
    me = {
        "run_id": run_id,
        "fleet": fleet,
        "controller": socket.gethostname(),
        "user": getpass.getuser(),
        "pid": os.getpid(),
        "ttl_s": ttl_s,
        "hosts": list(planned),
        "change": change,
    }
    by_name = {h.name: h for h in hosts}
    answers = _lease_answers(hosts, _lease_request("acquire", **me), connect_timeout, concurrency)
    leases = HostLeases(run_id)
    # A lease of a run whose process is gone from this very controller (killed, crashed) is stale now, not at its
    # expiry: ask for it again naming that run, and the host hands it over under its flock.
    here = socket.gethostname()
    for name, answer in sorted(answers.items()):
        holder = (answer or {}).get("holder") or {}
        if ((answer or {}).get("result") == "held" and holder.get("controller") == here
                and isinstance(holder.get("pid"), int) and holder.get("pid") != os.getpid()
                and not _pid_alive(holder["pid"])):
            retry = _lease_answers([by_name[name]], _lease_request("acquire", stale_run_id=holder.get("run_id"), **me),
                                   connect_timeout, concurrency)
            answers[name] = retry.get(name)
    refused: list[tuple[str, dict[str, Any]]] = []
    for name, answer in sorted(answers.items()):
        if answer is None:
            leases.unreachable.append(name)
        elif answer.get("result") in ("acquired", "renewed", "took-over"):
            leases.held.append(name)
            if answer.get("result") == "took-over":
                leases.took_over[name] = answer.get("stale") or {}
        else:
            refused.append((name, answer))

    def release() -> None:
        if leases.held:
            held = [by_name[n] for n in leases.held]
            _lease_answers(held, _lease_request("release", run_id=run_id), connect_timeout, concurrency)

    if refused:
        release()
        name, answer = refused[0]
        if answer.get("result") == "held":
            other = (answer.get("holder") or {}).get("change") or "rolling change"
            raise LockHeldError(
                f"another {other} holds host {name}: {describe_lease(answer.get('holder') or {})}"
                f"{f' (and {len(refused) - 1} more host(s))' if len(refused) > 1 else ''}; wait for it to finish or"
                " its lease to expire"
            )
        raise RolloutError(f"could not take the rollout lease on host {name}: {answer.get('error', answer)}")

    def renew() -> dict[str, str]:
        answers = _lease_answers(
            [by_name[n] for n in leases.held], _lease_request("acquire", **me), connect_timeout, concurrency
        )
        lost: dict[str, str] = {}
        for name, answer in sorted(answers.items()):
            if answer is None or answer.get("result") in ("acquired", "renewed", "took-over"):
                continue  # unreachable now: the lease stays until it expires; re-acquired: still ours
            if answer.get("result") == "held":
                lost[name] = f"its lease is held by {describe_lease(answer.get('holder') or {})}"
            else:
                lost[name] = f"its lease could not be renewed: {answer.get('error', answer)}"
        leases.lost.update(lost)
        return lost

    leases.renew = renew
    try:
        yield leases
    finally:
        release()
