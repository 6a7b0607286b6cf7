# Apache-2.0 (see the project's pyproject.toml)
"""Package name patterns checked before any is written or held (roles unattended_upgrades_blacklist, gpu_kernel_hold).

Both roles apply their entries the way unattended-upgrades applies ``Package-Blacklist``: Python's ``re.match``
against package names. One check for both, so an entry one role accepts the other accepts too.
"""

from __future__ import annotations

import re
from typing import Any

# Characters apt.conf cannot carry inside a quoted string, or that make no sense in a package name pattern.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def pattern_problems(patterns: Any, variable: str = "patterns") -> list[str]:
    """One message per bad entry of ``patterns``; empty when every entry is a usable package name pattern.

    unattended-upgrades applies each Package-Blacklist entry with Python's ``re.match`` to package names (and
    gpu_kernel_hold applies its own the same way), so an entry must compile as a Python regular expression (an
    invalid one crashes unattended-upgrade), must be anchored with ``^`` (the anchor re.match implies, written out),
    and must not match every name (``""``, ``"^"`` and ``"^.*"`` would stop all updates, security ones included,
    or hold every installed package).
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
            problems.append(f"{where}: matches every package name")
    return problems


def patterns_problems(lists: Any) -> list[str]:
    """``pattern_problems`` for each ``{variable name: list of entries}`` of ``lists``."""
    return [problem for variable, patterns in dict(lists).items() for problem in pattern_problems(patterns, variable)]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"package_pattern_problems": patterns_problems}
