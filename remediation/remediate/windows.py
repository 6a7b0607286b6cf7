"""Weekly maintenance windows: the times a policy lets the loop reboot a host without ``--allow-reboot``.

A window is a set of weekdays, a start and an end (``HH:MM``, wall-clock time) in a zone (``UTC`` or an IANA name such
as ``Europe/Berlin``, through :mod:`zoneinfo`, so daylight saving time moves it with the clock on the wall). It opens
on each of its days at ``start``; an ``end`` at or before ``start`` means the window runs past midnight and closes
at ``end`` on the next day (``sat 22:00 -> 04:00`` covers Saturday night into Sunday morning, not Sunday night).
Start included, end excluded.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from remediation.core.errors import UsageError

__all__ = ["DAYS", "MaintenanceWindow", "any_open", "parse_window", "parse_windows"]

#: Weekday names as a window's ``days`` takes them (Monday is 0, as :meth:`datetime.date.weekday`).
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_LONG = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_EVERY_DAY = ("daily", "every day", "*")
_KEYS = ("days", "start", "end", "zone")


@dataclass(frozen=True)
class MaintenanceWindow:
    """One weekly window: ``days`` (0 = Monday), ``start``/``end`` in ``zone``."""

    days: frozenset[int]
    start: _dt.time
    end: _dt.time
    zone: str = "UTC"

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start

    def contains(self, now: _dt.datetime) -> bool:
        """Whether ``now`` (timezone-aware) falls inside the window."""
        local = _aware(now).astimezone(ZoneInfo(self.zone))
        day, clock = local.weekday(), local.time().replace(tzinfo=None)
        if not self.crosses_midnight:
            return day in self.days and self.start <= clock < self.end
        return (day in self.days and clock >= self.start) or ((day - 1) % 7 in self.days and clock < self.end)

    def next_start(self, now: _dt.datetime) -> _dt.datetime:
        """When the window opens next after ``now`` (in its zone); ``now`` itself when it opens exactly then."""
        zone = ZoneInfo(self.zone)
        local = _aware(now).astimezone(zone)
        for ahead in range(8):
            date = local.date() + _dt.timedelta(days=ahead)
            if date.weekday() not in self.days:
                continue
            opens = _dt.datetime.combine(date, self.start, tzinfo=zone)
            if opens >= local:
                return opens
        raise AssertionError("a window with days opens within 8 days")  # pragma: no cover

    def describe(self) -> str:
        """``sat,sun 02:00-06:00 Europe/Berlin``."""
        days = "daily" if len(self.days) == 7 else ",".join(DAYS[d] for d in sorted(self.days))
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.zone}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "days": [DAYS[d] for d in sorted(self.days)],
            "start": f"{self.start:%H:%M}",
            "end": f"{self.end:%H:%M}",
            "zone": self.zone,
        }


def any_open(windows: Iterable[MaintenanceWindow], now: _dt.datetime) -> MaintenanceWindow | None:
    """The first of ``windows`` that contains ``now``, or None."""
    return next((w for w in windows if w.contains(now)), None)


def _aware(now: _dt.datetime) -> _dt.datetime:
    if now.tzinfo is None:
        raise ValueError(f"a window needs an aware time (with a zone), got {now.isoformat()}")
    return now


def parse_windows(value: Any, where: str) -> tuple[MaintenanceWindow, ...]:
    """A list of window mappings (``where``: the setting, for messages) as windows; :class:`UsageError` otherwise."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise UsageError(f"setting {where} must be a list of windows (days, start, end, zone), got {value!r:.60}")
    return tuple(parse_window(item, f"{where}[{i}]") for i, item in enumerate(value))


def parse_window(value: Any, where: str) -> MaintenanceWindow:
    """One window from ``{days: [sat, sun], start: "02:00", end: "06:00", zone: Europe/Berlin}``."""
    if not isinstance(value, Mapping):
        raise UsageError(f"setting {where} must be a mapping with days, start, end and zone, got {value!r:.60}")
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise UsageError(f"unknown setting {where}.{unknown[0]}; a window takes {', '.join(_KEYS)}")
    for key in ("days", "start", "end"):
        if key not in value:
            raise UsageError(f"setting {where} has no {key}: give days, start and end (zone defaults to UTC)")
    zone = _zone(value.get("zone", "UTC"), f"{where}.zone")
    return MaintenanceWindow(
        days=_days(value["days"], f"{where}.days"),
        start=_clock(value["start"], f"{where}.start"),
        end=_clock(value["end"], f"{where}.end"),
        zone=zone,
    )


def _days(value: Any, where: str) -> frozenset[int]:
    items = [p.strip() for p in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise UsageError(f"setting {where} must list weekdays (mon ... sun) or say daily, got {value!r:.60}")
    out: set[int] = set()
    for item in items:
        name = str(item).strip().lower()
        if name in _EVERY_DAY:
            return frozenset(range(7))
        if name in DAYS:
            out.add(DAYS.index(name))
        elif name in _LONG:
            out.add(_LONG.index(name))
        else:
            raise UsageError(f"setting {where}: {item!r} is not a weekday; write mon, tue, wed, thu, fri, sat, sun "
                             "or daily")
    return frozenset(out)


def _clock(value: Any, where: str) -> _dt.time:
    if isinstance(value, int) and not isinstance(value, bool):
        # YAML 1.1 reads an unquoted 02:00 as the sexagesimal number 120
        raise UsageError(f"setting {where} {value!r} is a number: quote the time in the YAML (\"HH:MM\")")
    text = str(value).strip()
    try:
        hours, minutes = text.split(":")
        if len(minutes) != 2 or not hours.isdigit() or not minutes.isdigit():
            raise ValueError(text)
        return _dt.time(int(hours), int(minutes))
    except ValueError:
        raise UsageError(f"setting {where} {value!r} is not a time of day: write \"HH:MM\" (00:00 to 23:59)") from None


def _zone(value: Any, where: str) -> str:
    name = str(value).strip()
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise UsageError(f"setting {where} {value!r} is not a time zone: write UTC or an IANA name such as "
                         "Europe/Berlin") from None
    return name
