"""Filters of the gpu_kernel_hold role: check the package patterns before any package is held."""

from __future__ import annotations

import re
from typing import Any


def pattern_problems(lists: Any) -> list[str]:
    """One message per bad entry of ``{variable name: list of regexes}``; empty when all are usable.

    Each entry is applied with ``re.match`` to the installed package names: it must compile as a Python regular
    expression, start with ``^`` (the anchor re.match implies, written out) and not match every name (``^``,
    ``^.*`` would hold every installed package).
    """
    problems = []
    for variable, patterns in dict(lists).items():
        if not isinstance(patterns, (list, tuple)):
            problems.append(f"{variable} must be a list of regular expressions, not {type(patterns).__name__}")
            continue
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
            if not entry.startswith("^"):
                problems.append(f"{where}: not anchored; write it as {'^' + entry!r} (entries match from the start)")
            elif compiled.match(""):
                problems.append(f"{where}: matches every package name")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpu_kernel_hold_pattern_problems": pattern_problems}
