"""How long Azure OpenAI asks a client to wait after a 429, from the response's headers and body.

Precedence (the issue's, and what Azure sends most precisely first):

1. ``retry-after-ms``: milliseconds, may carry a fraction;
2. ``retry-after``: seconds (integer by the standard; a fraction is accepted, as openai-python does);
3. ``retry-after`` as an HTTP-date: the seconds from ``now`` (or from the response's ``Date``) to that date;
4. the body's wording: "Please retry after N seconds", "Try again in N seconds" (also milliseconds/minutes).

Headers that are not a retry hint (``x-ratelimit-reset-tokens``, ``x-rate-limit-reset-tokens``) are never taken for
one. Every function here is pure and never raises: a value it cannot read is no hint.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BODY_HINT", "RetryHint", "hint_from_body", "hint_from_headers", "http_date_seconds", "retry_hint"]

SOURCES = ("retry-after-ms", "retry-after", "http-date", "body")

#: "retry after N seconds", "Try again in N seconds", "retry after 1500 milliseconds" (any case, any spacing).
BODY_HINT = re.compile(
    r"(?:retry|try(?:\s+again)?)\s+(?:after|in)\s+([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*"
    r"(milliseconds?|ms|seconds?|secs?|s|minutes?|mins?)\b",
    re.IGNORECASE,
)


def _unit_seconds(unit: str) -> float:
    unit = unit.lower()
    if unit == "ms" or unit.startswith("milli"):
        return 0.001
    if unit.startswith("min"):
        return 60.0
    return 1.0


@dataclass(frozen=True)
class RetryHint:
    """A server's retry hint: how many seconds, and where it was read (one of :data:`SOURCES`)."""

    seconds: float
    source: str


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return number


def http_date_seconds(value: str | None, now: float | None) -> float | None:
    """Seconds from ``now`` (epoch seconds) to the HTTP-date ``value``; ``None`` when either is missing or bad."""
    if value is None or now is None:
        return None
    try:
        parsed = email.utils.parsedate_tz(value.strip())
        if parsed is None:
            return None
        stamp = email.utils.mktime_tz(parsed)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return max(0.0, float(stamp) - now)


def _get(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lowered = {str(k).lower(): v for k, v in headers.items()}
        value = lowered.get(name)
    return None if value is None else str(value)


def hint_from_headers(headers: Mapping[str, str], now: float | None = None) -> RetryHint | None:
    """The hint of ``retry-after-ms``, else ``retry-after`` (seconds, then HTTP-date relative to ``now``).

    ``now`` is epoch seconds; without it an HTTP-date is measured from the response's own ``Date`` header.
    """
    ms = _number(_get(headers, "retry-after-ms"))
    if ms is not None:
        return RetryHint(ms / 1000.0, "retry-after-ms")
    raw = _get(headers, "retry-after")
    seconds = _number(raw)
    if seconds is not None:
        return RetryHint(seconds, "retry-after")
    if raw is not None:
        base = now
        if base is None:
            date = _get(headers, "date")
            try:
                base = email.utils.mktime_tz(email.utils.parsedate_tz(date)) if date else None  # type: ignore[arg-type]
            except (TypeError, ValueError, OverflowError, OSError):
                base = None
        dated = http_date_seconds(raw, base)
        if dated is not None:
            return RetryHint(dated, "http-date")
    return None


def hint_from_body(text: str) -> RetryHint | None:
    """The first "retry after N seconds" / "try again in N seconds" of ``text``."""
    match = BODY_HINT.search(text or "")
    if match is None:
        return None
    number = _number(match.group(1))
    if number is None:
        return None
    return RetryHint(number * _unit_seconds(match.group(2)), "body")


def retry_hint(
    headers: Mapping[str, str], body: str | bytes | None = None, now: float | None = None
) -> RetryHint | None:
    """The server's hint by the precedence above, or ``None`` when it gave none."""
    found = hint_from_headers(headers, now)
    if found is not None:
        return found
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    return hint_from_body(body or "")
