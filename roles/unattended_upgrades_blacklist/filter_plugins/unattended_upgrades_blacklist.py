"""Filters of the unattended_upgrades_blacklist role: check Package-Blacklist entries before they are written."""

from __future__ import annotations

import re
from typing import Any

# Characters apt.conf cannot carry inside a quoted string, or that make no sense in a package name pattern.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def pattern_problems(patterns: Any, variable: str = "patterns") -> list[str]:
    """One message per bad entry of ``patterns``; empty when every entry is a usable Package-Blacklist entry.

    unattended-upgrades applies each entry with Python's ``re.match`` to package names, so an entry must
    compile as a Python regular expression (an invalid one crashes unattended-upgrade), must be anchored
    with ``^`` (the anchor re.match implies, written out), and must not match every name (``""``, ``"^"`` and
    ``"^.*"`` would stop all updates, security ones included).
    """
    if not isinstance(patterns, (list, tuple)):
        return [f"{variable} must be a list of regular expressions, not {type(patterns).__name__}"]
    problems = []
    for index, entry in enumerate(patterns):
        where = f"{variable}[{index}] {entry!r}"
        if not isinstance(entry, str):
            problems.append(f"{where}: not a string")
            continue
        try:
            compiled = re.compile(entry)
        except re.error as exc:
            problems.append(f"{where}: not a valid Python regular expression ({exc})")
            continue
        if _CONTROL.search(entry):
            problems.append(f"{where}: contains a control character")
        elif not entry.startswith("^"):
            problems.append(f"{where}: not anchored; write it as {'^' + entry!r} (entries match from the start)")
        elif compiled.match(""):
            problems.append(f"{where}: matches every package name (it would block all updates)")
    return problems


def patterns_problems(lists: Any) -> list[str]:
    """``pattern_problems`` for each ``{variable name: list of entries}`` of ``lists``."""
    return [problem for variable, patterns in dict(lists).items() for problem in pattern_problems(patterns, variable)]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"unattended_upgrades_blacklist_pattern_problems": patterns_problems}
