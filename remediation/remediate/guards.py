"""The fleet guards of the closed loop: how many hosts may change at once, when the whole loop halts, how often one
host may be acted on, and how a failed action is classed (whether it may be retried).

- :class:`InFlightCap`: at most ``max_hosts`` hosts or ``max_pct`` % of the fleet in flight, whichever is smaller, and
  never fewer than one (a cap of zero would stop the loop for good on a small fleet).
- :class:`Breaker`: trips when more than ``threshold_pct`` % of the fleet, and at least ``min_hosts`` hosts, were seen
  unhealthy (a critical finding) by the runs within the last ``window_s`` seconds. Many hosts failing at once is a
  fleet-wide cause (a bad update, a platform incident) that fixing host by host would hide or make worse. Once
  tripped it stays tripped, whatever later runs see, until a person resets it (``invoke remediate.reset``).
- :class:`Budget`: at most ``attempts`` actions per host within ``window_s`` seconds (a rolling window), so a fix
  that does not hold cannot loop.
- :class:`Outcome`: how a failed action is classed; only a transient failure is retried (:func:`classify_failure`).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Breaker", "BreakerVerdict", "Budget", "Guards", "InFlightCap", "Observation", "Outcome",
           "classify_failure"]


class Outcome(StrEnum):
    """A failed action's class. The rule (:func:`classify_failure`): *transient* when the action did not start because
    of a condition that clears by itself (the dpkg lock held, the host unreachable before any change, another run's
    lease); *permanent* when it ran to its end and the gate after it failed; *ambiguous* when it started and no verdict
    came (cut short, the gate could not tell). Only transient failures are retried; the others are escalated."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    AMBIGUOUS = "ambiguous"

    @property
    def retried(self) -> bool:
        return self is Outcome.TRANSIENT


def classify_failure(*, started: bool, finished: bool) -> Outcome:
    """The :class:`Outcome` of a failed action: did it change anything (``started``), did it reach a verdict."""
    if not started:
        return Outcome.TRANSIENT
    return Outcome.PERMANENT if finished else Outcome.AMBIGUOUS


@dataclass(frozen=True)
class InFlightCap:
    max_hosts: int = 1
    max_pct: float = 10.0

    def limit(self, fleet_size: int) -> int:
        """Hosts that may be in flight at once in a fleet of ``fleet_size``."""
        by_share = math.floor(fleet_size * self.max_pct / 100.0)
        return max(1, min(self.max_hosts, by_share))

    def describe(self, fleet_size: int) -> str:
        """``cap 1 = min(2 hosts, 10% of 12 hosts = 1)`` (the arithmetic ``--check`` shows)."""
        by_share = math.floor(fleet_size * self.max_pct / 100.0)
        floor = " raised to 1" if min(self.max_hosts, by_share) < 1 else ""
        return (f"cap {self.limit(fleet_size)} = min({self.max_hosts} hosts, {self.max_pct:g}% of {fleet_size} "
                f"hosts = {by_share}){floor}")


@dataclass(frozen=True)
class Observation:
    """What one run saw: when, how many hosts the fleet had, which were unhealthy."""

    at: _dt.datetime
    fleet_size: int
    unhealthy: tuple[str, ...]


@dataclass(frozen=True)
class BreakerVerdict:
    tripped: bool
    share_pct: float
    unhealthy: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Breaker:
    threshold_pct: float = 50.0
    window_s: float = 3600.0
    min_hosts: int = 2

    def evaluate(self, observations: Iterable[Observation], now: _dt.datetime) -> BreakerVerdict:
        """Whether the runs within the window (``now`` - ``window_s`` .. ``now``) saw enough of the fleet unhealthy.

        The share is the hosts seen unhealthy by any of those runs over the largest fleet size among them."""
        since = now - _dt.timedelta(seconds=self.window_s)
        recent = [o for o in observations if since <= o.at <= now]
        if not recent:
            return BreakerVerdict(False, 0.0, (), "no run within the window")
        unhealthy = tuple(sorted({h for o in recent for h in o.unhealthy}))
        size = max(o.fleet_size for o in recent)
        share = 100.0 * len(unhealthy) / size if size else 0.0
        tripped = share > self.threshold_pct and len(unhealthy) >= self.min_hosts
        arithmetic = (f"{len(unhealthy)} of {size} hosts unhealthy ({share:.0f}%) within {self.window_s:g} s; "
                      f"trips above {self.threshold_pct:g}% with at least {self.min_hosts} hosts")
        return BreakerVerdict(tripped, share, unhealthy, arithmetic)


@dataclass(frozen=True)
class Budget:
    attempts: int = 3
    window_s: float = 24 * 3600.0

    def used(self, times: Sequence[_dt.datetime], now: _dt.datetime) -> int:
        """Attempts at ``times`` that count now (within the rolling window)."""
        since = now - _dt.timedelta(seconds=self.window_s)
        return sum(1 for t in times if since < t <= now)

    def left(self, times: Sequence[_dt.datetime], now: _dt.datetime) -> int:
        return max(0, self.attempts - self.used(times, now))

    def next_free(self, times: Sequence[_dt.datetime], now: _dt.datetime) -> _dt.datetime | None:
        """When the oldest counted attempt leaves the window (None when an attempt is left now)."""
        if self.left(times, now) > 0:
            return None
        since = now - _dt.timedelta(seconds=self.window_s)
        counted = sorted(t for t in times if since < t <= now)
        return counted[len(counted) - self.attempts] + _dt.timedelta(seconds=self.window_s)

    def describe(self, times: Sequence[_dt.datetime], now: _dt.datetime) -> str:
        """``1 of 3 attempts used in 24 h, 2 left``."""
        return (f"{self.used(times, now)} of {self.attempts} attempts used in {self.window_s / 3600:g} h, "
                f"{self.left(times, now)} left")


@dataclass(frozen=True)
class Guards:
    """Every guard of one fleet, and how old a finding may be before it is ignored."""

    in_flight: InFlightCap = InFlightCap()
    breaker: Breaker = Breaker()
    budget: Budget = Budget()
    finding_ttl_s: float = 3600.0
