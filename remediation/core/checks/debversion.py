"""Debian version ordering (``dpkg --compare-versions``), as a pure function.

Implements deb-version(7): ``[epoch:]upstream_version[-debian_revision]``; epochs compare numerically, the
other two parts with dpkg's ``verrevcmp``: alternate non-digit runs (compared character by character, where
``~`` sorts before everything, even the end of the string, and letters sort before non-letters) and digit runs
(compared numerically).
"""

from __future__ import annotations

import functools

__all__ = ["compare_versions", "split_version", "version_key"]


def split_version(version: str) -> tuple[int, str, str]:
    """``'1:2.0-3'`` -> ``(1, '2.0', '3')``; a missing epoch is 0, a missing revision is ``''``.

    Raises ``ValueError`` for an empty version or a non-numeric epoch.
    """
    text = version.strip()
    if not text:
        raise ValueError("empty version")
    epoch = 0
    if ":" in text:
        head, text = text.split(":", 1)
        if not head.isdigit():
            raise ValueError(f"epoch of {version!r} is not a number")
        epoch = int(head)
    upstream, sep, revision = text.rpartition("-")
    if not sep:
        upstream, revision = text, ""
    return epoch, upstream, revision


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isdigit():
        return 0
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def compare_versions(a: str, b: str) -> int:
    """Negative, zero or positive as Debian version ``a`` sorts before, equal to or after ``b``."""
    ea, ua, ra = split_version(a)
    eb, ub, rb = split_version(b)
    if ea != eb:
        return -1 if ea < eb else 1
    result = _verrevcmp(ua, ub)
    if result == 0:
        result = _verrevcmp(ra, rb)
    return (result > 0) - (result < 0)


version_key = functools.cmp_to_key(compare_versions)
"""``sorted(versions, key=version_key)`` sorts Debian versions in dpkg order."""
