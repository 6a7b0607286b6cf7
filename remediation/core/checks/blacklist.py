"""unattended-upgrades' ``Package-Blacklist`` semantics, exactly as the program applies them.

Checked against unattended-upgrades 2.9.1 (Debian 12; ``/usr/bin/unattended-upgrade``,
``is_pkgname_in_blacklist``): every entry is a Python regular expression applied with ``re.match`` to the package
name, i.e. anchored at the start and not at the end (``"linux-image"`` covers ``linux-image-6.5.0-46-generic``;
``"$"`` anchors the end).  There is no fnmatch/glob matching for package names (fnmatch is used only for
``Origins-Pattern`` fields): ``"linux-image*"`` is the regex "linux-imag" followed by any number of "e" and still
matches by prefix, while ``"*nvidia*"`` is not a valid regex and makes unattended-upgrade crash with
``re.error`` the first time it checks a package.  A package is protected when any entry matches it.

The entries come from the host (its ``50unattended-upgrades``), so the controller evaluates only those whose
matching time is bounded: an entry with a repeat inside a repeat (``(a+)+``, ``(a|aa)*``), a back-reference, more
than a few unbounded repeats or more than 256 characters is never evaluated here (it protects nothing in our
reading, so the audit errs towards "not protected"); such entries are not what anyone writes for package names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from re import _parser as _sre_parse  # type: ignore[attr-defined]  # the parser the re module itself uses (3.11+)

__all__ = ["blacklist_match", "invalid_entries", "matches_any", "next_kernel_packages"]

_RELEASE = re.compile(r"^(?P<base>\d+\.\d+\.\d+)-(?P<abi>\d+)(?P<flavour>-[a-z0-9][a-z0-9.+-]*)?$")


MAX_ENTRY_CHARS = 256
MAX_UNBOUNDED_REPEATS = 3
_REPEATS = {_sre_parse.MAX_REPEAT, _sre_parse.MIN_REPEAT, getattr(_sre_parse, "POSSESSIVE_REPEAT", None)} - {None}


def _walk(items: object, inside_repeat: bool, counts: list[int]) -> bool:
    """False when the parsed pattern can backtrack without bound: a repeat, an alternation or a back-reference
    inside a repeat of more than one; counts[0] collects unbounded repeats."""
    for op, arg in items:  # type: ignore[attr-defined]
        if op in _REPEATS:
            _low, high, body = arg
            many = high is _sre_parse.MAXREPEAT or high > 1
            if many and inside_repeat:
                return False
            if high is _sre_parse.MAXREPEAT:
                counts[0] += 1
            if not _walk(body, inside_repeat or many, counts):
                return False
        elif op is _sre_parse.BRANCH:
            if inside_repeat:
                return False
            if not all(_walk(alt, inside_repeat, counts) for alt in arg[1]):
                return False
        elif op is _sre_parse.SUBPATTERN:
            if not _walk(arg[-1], inside_repeat, counts):
                return False
        elif op in (_sre_parse.ASSERT, _sre_parse.ASSERT_NOT):
            if not _walk(arg[1], inside_repeat, counts):
                return False
        elif op is _sre_parse.GROUPREF or op is _sre_parse.GROUPREF_EXISTS:
            return False
    return True


@lru_cache(maxsize=1024)
def bounded(entry: str) -> bool:
    """True when ``entry`` is a valid regular expression whose matching time on a package name is bounded (no
    nested or alternated repeats, no back-references, at most a few unbounded repeats, at most 256 characters)."""
    if len(entry) > MAX_ENTRY_CHARS:
        return False
    try:
        parsed = _sre_parse.parse(entry)
    except (re.error, RecursionError, OverflowError):
        return False
    counts = [0]
    return _walk(parsed, False, counts) and counts[0] <= MAX_UNBOUNDED_REPEATS


def blacklist_match(package: str, blacklist: Iterable[str]) -> str | None:
    """The first entry of ``blacklist`` that protects ``package`` (``re.match``), or None.

    Invalid regular expressions never match here; :func:`invalid_entries` names them. Entries whose matching time
    is not :func:`bounded` are not evaluated (they come from the host) and protect nothing here.
    """
    for entry in blacklist:
        if not bounded(entry):
            continue
        try:
            if re.match(entry, package):
                return entry
        except re.error:
            continue
    return None


def invalid_entries(blacklist: Iterable[str]) -> tuple[str, ...]:
    """Entries that are not valid Python regular expressions (unattended-upgrade crashes on them)."""
    bad = []
    for entry in blacklist:
        try:
            re.compile(entry)
        except re.error:
            bad.append(entry)
    return tuple(bad)


def matches_any(package: str, prefixes: Sequence[str]) -> bool:
    """``package`` re.match-es one of ``prefixes`` (the policy's notion of a kernel / NVIDIA package)."""
    return blacklist_match(package, prefixes) is not None


def next_kernel_packages(release: str) -> tuple[str, ...]:
    """The package names the next kernel ABI after ``release`` would bring.

    ``6.5.0-45-generic`` -> ``linux-image-6.5.0-46-generic``, ``linux-headers-6.5.0-46-generic``,
    ``linux-headers-6.5.0-46``, ``linux-modules-6.5.0-46-generic``, ``linux-modules-extra-6.5.0-46-generic``,
    ``linux-image-unsigned-6.5.0-46-generic``.  Empty for a release that does not look like ``X.Y.Z-ABI[-flavour]``.
    """
    match = _RELEASE.match(release)
    if not match:
        return ()
    nxt = f"{match.group('base')}-{int(match.group('abi')) + 1}"
    flavour = match.group("flavour") or ""
    names = [
        f"linux-image-{nxt}{flavour}",
        f"linux-image-unsigned-{nxt}{flavour}",
        f"linux-headers-{nxt}{flavour}",
        f"linux-modules-{nxt}{flavour}",
        f"linux-modules-extra-{nxt}{flavour}",
    ]
    if flavour:
        names.insert(3, f"linux-headers-{nxt}")
    return tuple(names)
