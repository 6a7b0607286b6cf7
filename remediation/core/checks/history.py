"""apt history as evidence: who installed what, when (dry runs never count)."""

from __future__ import annotations

from collections.abc import Iterable

from remediation.core.parsers.apt_history import AptAction, AptHistory, AptTransaction

__all__ = ["describe", "last_change_of", "who"]

_VERB = {
    "Install": "installed",
    "Upgrade": "upgraded",
    "Downgrade": "downgraded",
    "Reinstall": "reinstalled",
    "Remove": "removed",
    "Purge": "purged",
}


def who(tx: AptTransaction) -> str:
    """``unattended-upgrade``, or the person and tool: ``alice (1000) via apt-get``; dpkg.log names no one."""
    if tx.actor == "unattended-upgrade":
        return "unattended-upgrade"
    if tx.source == "dpkg.log":
        return "dpkg (dpkg.log names no actor)"
    tool = tx.actor if tx.actor != "unknown" else (tx.commandline or "unknown command")
    if tx.requested_by:
        return f"{tx.requested_by} via {tool}"
    return f"root via {tool}"


def describe(tx: AptTransaction, action: AptAction) -> str:
    """``history.log 2026-12-02 03:14:07: unattended-upgrade installed linux-image-6.5.0-45-generic (6.5.0-45.45)``."""
    if action.old_version and action.version:
        versions = f"{action.old_version} -> {action.version}"
    else:
        versions = action.version or "?"
    verb = _VERB.get(action.action, action.action.lower())
    return f"{tx.source} {tx.start or '?'}: {who(tx)} {verb} {action.package} ({versions})"


def last_change_of(
    history: AptHistory, packages: Iterable[str], actions: tuple[str, ...] = ("Install", "Upgrade", "Reinstall")
) -> tuple[AptTransaction, AptAction] | None:
    """The newest real (not dry-run) transaction that did one of ``actions`` to one of ``packages``."""
    wanted = set(packages)
    found: tuple[AptTransaction, AptAction] | None = None
    for tx in history.transactions:
        if tx.dry_run:
            continue
        for action in tx.actions:
            if action.package in wanted and action.action in actions:
                found = (tx, action)
    return found
