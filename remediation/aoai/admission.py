"""Admission windows: what a deployment will accept now, the way Azure OpenAI counts it.

Azure charges every request against the deployment's tokens-per-minute limit when it admits it (prompt tokens +
``max_tokens``) over a rolling minute, and checks requests per minute over short windows: RPM/6 per 10 seconds. A
:class:`SlidingWindow` holds the charges of one such window; :class:`Admission` holds a deployment's two windows and
says how long a request must wait before both would accept it. Pure: time is passed in (seconds on any monotonic
clock), so tests drive minute windows with a virtual clock.

The client's view of a window is kept a little stricter than the server's: a charge is released ``lag_s`` after
its window (the server admits a request some time after the client sends it: network, load balancers, a busy
machine; a charge released exactly one window after sending would be released before the server releases it), and
``headroom`` (< 1) leaves a share of the limit for estimate errors.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = ["Admission", "SlidingWindow", "default_rpm"]


def default_rpm(tpm: int) -> int:
    """Requests per minute at 6 RPM per 1,000 TPM: Azure's "older chat models" (per model: ``limits.rpm_for``)."""
    return max(1, (tpm * 6) // 1000)


class SlidingWindow:
    """Charges made in the last ``window`` seconds (plus ``margin``), against ``capacity``. Not thread-safe."""

    def __init__(self, capacity: float, window: float, margin: float = 0.0) -> None:
        if capacity <= 0 or window <= 0 or margin < 0:
            raise ValueError(f"capacity {capacity}, window {window} and margin {margin} must be positive")
        self.capacity = float(capacity)
        self.hold = float(window) + float(margin)
        self._charges: deque[tuple[float, float]] = deque()
        self._used = 0.0

    def _expire(self, now: float) -> None:
        while self._charges and self._charges[0][0] + self.hold <= now:
            self._used -= self._charges.popleft()[1]
        if not self._charges:
            self._used = 0.0  # no float drift once empty

    def used(self, now: float) -> float:
        self._expire(now)
        return self._used

    def wait(self, amount: float, now: float) -> float:
        """Seconds from ``now`` until ``amount`` fits (0 when it fits now; ``inf`` when it never can)."""
        if amount > self.capacity:
            return math.inf
        self._expire(now)
        excess = self._used + amount - self.capacity
        if excess <= 1e-9:
            return 0.0
        for at, charged in self._charges:
            excess -= charged
            if excess <= 1e-9:
                return max(0.0, at + self.hold - now)
        return math.inf  # pragma: no cover - unreachable: amount <= capacity frees once every charge expires

    def charge(self, amount: float, now: float) -> None:
        self._expire(now)
        if amount > 0:
            if self._charges and now < self._charges[-1][0]:
                now = self._charges[-1][0]  # keep the deque ordered if a caller's clock stepped back
            self._charges.append((now, float(amount)))
            self._used += amount


@dataclass(frozen=True)
class Limits:
    """A deployment's limits and how strictly the client keeps under them."""

    tpm: int
    rpm: int
    tpm_window_s: float = 60.0
    rpm_window_s: float = 10.0  # Azure checks RPM/6 per 10 seconds
    headroom: float = 1.0
    lag_s: float = 0.0  # seconds a charge is held past each window


class Admission:
    """A deployment's TPM and RPM windows. Not thread-safe (the client holds a lock)."""

    def __init__(self, limits: Limits) -> None:
        rpm_share = limits.rpm * limits.rpm_window_s / limits.tpm_window_s  # RPM/6 for 10 s of a 60 s minute
        self.limits = limits
        self.tokens = SlidingWindow(
            limits.tpm * limits.headroom, limits.tpm_window_s, limits.lag_s
        )
        self.requests = SlidingWindow(
            max(1.0, math.floor(rpm_share * limits.headroom + 1e-9)),
            limits.rpm_window_s,
            limits.lag_s,
        )

    def fits_ever(self, tokens: float) -> bool:
        return tokens <= self.tokens.capacity

    def wait(self, tokens: float, now: float) -> float:
        """Seconds until a request charging ``tokens`` fits both windows."""
        return max(self.tokens.wait(tokens, now), self.requests.wait(1, now))

    def charge(self, tokens: float, now: float) -> None:
        self.tokens.charge(tokens, now)
        self.requests.charge(1, now)

    def sync(self, server_used_tokens: float, now: float) -> float:
        """Add what the server has counted and we have not (other clients of the deployment); the amount added."""
        missing = server_used_tokens - self.tokens.used(now)
        if missing > 0:
            self.tokens.charge(missing, now)
            return missing
        return 0.0
