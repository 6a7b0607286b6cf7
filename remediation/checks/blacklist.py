"""unattended-upgrades' ``Package-Blacklist`` semantics, exactly as the program applies them.

Checked against unattended-upgrades 2.9.1 (Debian 12; ``/usr/bin/unattended-upgrade``,
``is_pkgname_in_blacklist``): every entry is a Python regular expression applied with ``re.match`` to the package
name, i.e. anchored at the start and not at the end (``"linux-image"`` covers ``linux-image-6.5.0-46-generic``;
``"$"`` anchors the end).  There is no fnmatch/glob matching for package names (fnmatch is used only for
``Origins-Pattern`` fields): ``"linux-image*"`` is the regex "linux-imag" followed by any number of "e" and still
matches by prefix, while ``"*nvidia*"`` is not a valid regex and makes unattended-upgrade crash with
``re.error`` the first time it checks a package.  A package is protected when any entry matches it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["blacklist_match", "invalid_entries", "matches_any", "next_kernel_packages"]

_RELEASE = re.compile(r"^(?P<base>\d+\.\d+\.\d+)-(?P<abi>\d+)(?P<flavour>-[a-z0-9][a-z0-9.+-]*)?$")


def blacklist_match(package: str, blacklist: Iterable[str]) -> str | None:
    """The first entry of ``blacklist`` that protects ``package`` (``re.match``), or None.

    Invalid regular expressions never match here; :func:`invalid_entries` names them.
    """
    for entry in blacklist:
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
