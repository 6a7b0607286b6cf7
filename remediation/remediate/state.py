"""What the closed loop remembers between runs, per fleet: ``<state dir>/remediate/<fleet>.json``.

- ``attempts``: every action taken on a host (finding, boot id, action, when, and its outcome once known), which the
  attempt budget counts and the dedupe on (host, finding ID, boot id) reads;
- ``seen``: the findings each run decided on, keyed by (host, finding ID, boot id), with when they were first and
  last seen and the decision (an escalation is paged once per key);
- ``observations``: what each run saw of the fleet's health, which the circuit breaker reads;
- ``breaker``: set when the breaker trips, kept until ``invoke remediate.reset``.

The file is written whole (a temporary file, fsynced, renamed: :mod:`remediation.core.durable`), under an exclusive
``flock`` of ``<file>.lock`` taken for the whole load-change-save (:func:`locked`), so two runs never interleave. A file
that cannot be read, is not JSON, or does not have this shape stops the run with one line naming the file and the
fix: it is never reset silently, since a forgotten budget lets a failing fix loop.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from remediation.core.durable import write_atomic
from remediation.remediate.errors import StateError, StateLockedError
from remediation.remediate.guards import Observation, Outcome

__all__ = ["SCHEMA", "Attempt", "RemediateState", "Seen", "Trip", "load", "locked", "save", "state_path"]

SCHEMA = "gpufleet.remediate-state/1"
LOCK_WAIT_S = 10.0
_FLEET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Attempt:
    """One action on one host for one finding. ``outcome`` None: no verdict recorded (in flight, or cut short)."""

    host: str
    finding: str
    boot_id: str | None
    action: str
    at: _dt.datetime
    outcome: Outcome | None = None
    ok: bool | None = None  # the action fixed the finding (then ``outcome`` stays None)

    @property
    def in_flight(self) -> bool:
        return self.ok is None and self.outcome is None


@dataclass(frozen=True)
class Seen:
    """A finding a run decided on, per (host, finding ID, boot id)."""

    host: str
    finding: str
    boot_id: str | None
    first_seen: _dt.datetime
    last_seen: _dt.datetime
    decision: str
    detail: str = ""  # what else tells this record apart (AZ-SE-001: the Scheduled Events' IDs, paged once each)

    @property
    def key(self) -> tuple[str, str, str | None]:
        return (self.host, self.finding, self.boot_id)


@dataclass(frozen=True)
class Trip:
    """The circuit breaker tripped: when, and what it saw."""

    at: _dt.datetime
    why: str
    unhealthy: tuple[str, ...]


@dataclass(frozen=True)
class RemediateState:
    fleet: str
    attempts: tuple[Attempt, ...] = ()
    seen: tuple[Seen, ...] = ()
    observations: tuple[Observation, ...] = ()
    breaker: Trip | None = None

    def attempts_on(self, host: str) -> tuple[Attempt, ...]:
        return tuple(a for a in self.attempts if a.host == host)

    def attempt_for(self, host: str, finding: str, boot_id: str | None) -> Attempt | None:
        """The latest attempt on (host, finding ID, boot id), or None: the dedupe key."""
        same = [a for a in self.attempts if (a.host, a.finding, a.boot_id) == (host, finding, boot_id)]
        return max(same, key=lambda a: a.at) if same else None

    def seen_as(self, host: str, finding: str, boot_id: str | None) -> Seen | None:
        return next((s for s in self.seen if s.key == (host, finding, boot_id)), None)

    def with_attempt(self, attempt: Attempt) -> RemediateState:
        return replace(self, attempts=(*self.attempts, attempt))

    def with_observation(self, observation: Observation) -> RemediateState:
        return replace(self, observations=(*self.observations, observation))

    def tripped(self, trip: Trip) -> RemediateState:
        """The breaker set (a breaker already tripped keeps its first trip)."""
        return self if self.breaker is not None else replace(self, breaker=trip)

    def reset(self) -> RemediateState:
        """A person's reset: the breaker cleared, and the findings and observations recorded before it discarded
        (stale now: the next run starts from a fresh audit). The attempts stay: a reset does not refill a budget."""
        return replace(self, breaker=None, seen=(), observations=())

    def pruned(self, now: _dt.datetime, keep_s: float) -> RemediateState:
        """Without the records older than ``keep_s`` seconds (the largest of the budget and breaker windows and the
        finding TTL): what no guard reads any more. Attempts without a verdict are kept."""
        since = now - _dt.timedelta(seconds=keep_s)
        return replace(
            self,
            attempts=tuple(a for a in self.attempts if a.at > since or a.in_flight),
            seen=tuple(s for s in self.seen if s.last_seen > since),
            observations=tuple(o for o in self.observations if o.at > since),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "fleet": self.fleet,
            "breaker": None if self.breaker is None else {
                "at": self.breaker.at.isoformat(), "why": self.breaker.why, "unhealthy": list(self.breaker.unhealthy)},
            "attempts": [
                {"host": a.host, "finding": a.finding, "boot_id": a.boot_id, "action": a.action,
                 "at": a.at.isoformat(), "outcome": a.outcome.value if a.outcome else None, "ok": a.ok}
                for a in self.attempts
            ],
            "seen": [
                {"host": s.host, "finding": s.finding, "boot_id": s.boot_id, "first_seen": s.first_seen.isoformat(),
                 "last_seen": s.last_seen.isoformat(), "decision": s.decision,
                 **({"detail": s.detail} if s.detail else {})}
                for s in self.seen
            ],
            "observations": [
                {"at": o.at.isoformat(), "fleet_size": o.fleet_size, "unhealthy": list(o.unhealthy)}
                for o in self.observations
            ],
        }

    @classmethod
    def from_dict(cls, data: Any, fleet: str) -> RemediateState:
        """Inverse of :meth:`to_dict`; ``ValueError`` (with what is wrong) for any other shape."""
        if not isinstance(data, Mapping):
            raise ValueError("the top level is not a JSON object")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema is {data.get('schema')!r}, not {SCHEMA!r}")
        if data.get("fleet") != fleet:
            raise ValueError(f"it is the state of fleet {data.get('fleet')!r}, not {fleet!r}")
        breaker = data.get("breaker")
        return cls(
            fleet=fleet,
            attempts=tuple(
                Attempt(_str(a, "host"), _str(a, "finding"), _opt_str(a, "boot_id"), _str(a, "action"), _time(a, "at"),
                        Outcome(a["outcome"]) if a.get("outcome") is not None else None, _opt_bool(a, "ok"))
                for a in _list(data, "attempts")
            ),
            seen=tuple(
                Seen(_str(s, "host"), _str(s, "finding"), _opt_str(s, "boot_id"), _time(s, "first_seen"),
                     _time(s, "last_seen"), _str(s, "decision"), _str(s, "detail") if "detail" in s else "")
                for s in _list(data, "seen")
            ),
            observations=tuple(
                Observation(_time(o, "at"), _int(o, "fleet_size"), tuple(_strs(o, "unhealthy")))
                for o in _list(data, "observations")
            ),
            breaker=None if breaker is None else Trip(_time(breaker, "at"), _str(breaker, "why"),
                                                      tuple(_strs(breaker, "unhealthy"))),
        )


def _item(data: Any, key: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"an entry is not a JSON object: {data!r:.60}")
    if key not in data:
        raise ValueError(f"an entry has no {key!r}")
    return data[key]


def _str(data: Any, key: str) -> str:
    value = _item(data, key)
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string: {value!r:.60}")
    return value


def _opt_str(data: Any, key: str) -> str | None:
    return None if _item(data, key) is None else _str(data, key)


def _opt_bool(data: Any, key: str) -> bool | None:
    value = data.get(key) if isinstance(data, Mapping) else None
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{key} is not true, false or null: {value!r:.60}")
    return value


def _int(data: Any, key: str) -> int:
    value = _item(data, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is not a count: {value!r:.60}")
    return value


def _time(data: Any, key: str) -> _dt.datetime:
    value = _str(data, key)
    try:
        when = _dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{key} is not an ISO time: {value!r:.60}") from None
    if when.tzinfo is None:
        raise ValueError(f"{key} has no time zone: {value!r:.60}")
    return when


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key} is not a list")
    return value


def _strs(data: Any, key: str) -> list[str]:
    value = _item(data, key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} is not a list of host names")
    return value


def state_path(state_dir: Path, fleet: str) -> Path:
    """``<state_dir>/remediate/<fleet>.json``; a fleet name that is not a plain file name is refused."""
    if not _FLEET_NAME.match(fleet):
        raise StateError(f"fleet name {fleet!r} cannot name a state file: use letters, digits, '.', '_' and '-'")
    return state_dir / "remediate" / f"{fleet}.json"


def _fix(path: Path) -> str:
    return (f"move it aside (mv {path} {path}.bad) to start a new state, which forgets the attempt budget and the "
            "circuit breaker, or restore it from a backup")


def load(path: Path, fleet: str) -> RemediateState:
    """The state in ``path``; an empty state when the file does not exist. :class:`StateError` (one line naming the
    file and the fix) when it cannot be read or is not a state of ``fleet``."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return RemediateState(fleet)
    except OSError as exc:
        raise StateError(f"remediate state file {path} cannot be read ({exc.strerror}): fix its permissions, or "
                         f"{_fix(path)}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise StateError(f"remediate state file {path} is not UTF-8 text: {_fix(path)}") from None
    except json.JSONDecodeError as exc:
        raise StateError(f"remediate state file {path} is not valid JSON (line {exc.lineno}, column {exc.colno}): "
                         f"{_fix(path)}") from None
    except RecursionError:
        raise StateError(f"remediate state file {path} is nested too deep to be a state: {_fix(path)}") from None
    try:
        return RemediateState.from_dict(data, fleet)
    except (ValueError, KeyError, TypeError) as exc:
        reason = " ".join(str(exc).split())
        raise StateError(f"remediate state file {path} is not a remediate state ({reason}): {_fix(path)}") from None


def save(path: Path, state: RemediateState) -> Path:
    """Write ``state`` to ``path`` whole (the directory is created); hold :func:`locked` around load and save."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, json.dumps(state.to_dict(), indent=1) + "\n")
    except OSError as exc:
        raise StateError(f"remediate state file {path} cannot be written ({exc.strerror}): fix the permissions of "
                         f"{path.parent}") from None


@contextmanager
def locked(path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the exclusive ``flock`` of ``<path>.lock`` (created once, never removed) for one load-change-save.

    Waits up to ``wait_s`` seconds for another run to finish, then raises :class:`StateLockedError` (exit 4)."""
    lock = path.with_name(path.name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StateError(f"remediate state lock {lock} cannot be opened ({exc.strerror}): fix the permissions of "
                         f"{lock.parent}") from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise StateLockedError(
                        f"another remediate run holds {lock} (waited {wait_s:g} s): let it finish, then run again"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
