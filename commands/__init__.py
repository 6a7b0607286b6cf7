"""Invoke task modules, one per area; ``tasks.py`` at the top of the repository assembles them.

Each module holds the thin tasks of one namespace: parse the flags, load the area's typed settings
(:mod:`remediation.config`), call one ``remediation.*`` function, render, ``raise Exit(code=...)``. What every area
shares lives here: :func:`edge` (the library's errors become one line on stderr and an exit code, here and nowhere
else), the fleet flags and the fleet lookup. Heavy imports stay inside the tasks, so ``invoke --list`` is instant.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke import Exit

ROOT = Path(__file__).resolve().parent.parent
F = TypeVar("F", bound=Callable[..., Any])

#: Help for the flags every fleet task takes.
FLEET_HELP = {
    "fleet": "fleet name from invoke.yaml (fleets:), default gpu",
    "inventory": "Ansible inventory to use instead of the fleet's",
    "limit": "comma-separated host names or glob patterns",
}
#: Help for the one word every mutating task uses for "show the plan, change nothing".
CHECK_HELP = "show the per-host plan and diff, then stop: nothing changes on any host (--dry-run is an alias)"


def edge(func: F) -> F:
    """Turn the library's errors into one line and an exit code (2 unless the error says otherwise)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from remediation.errors import RemediationError

        try:
            return func(*args, **kwargs)
        except RemediationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def settings(c: Any, cls: type[Any], name: str) -> Any:
    """The ``name:`` config section as its typed settings class."""
    from remediation.config import load_section

    return load_section(cls, c.config.get(name, {}), name)


def fleet_hosts(c: Any, fleet: str, inventory: str | None, limit: str | None) -> tuple[list[Any], str, str]:
    """The fleet's hosts (after ``--limit``), the inventory path and the group, from ``fleets:`` or ``--inventory``."""
    from remediation.config import fleets_from_mapping
    from remediation.errors import InventoryError
    from remediation.inventory import load

    fleets = fleets_from_mapping(c.config.get("fleets", {}))
    if fleet not in fleets and inventory is None:
        raise InventoryError(
            f"fleet {fleet!r} is not configured (fleets: {', '.join(fleets) or 'none'}); "
            "add it under fleets: in invoke.yaml or pass --inventory"
        )
    spec = fleets.get(fleet)
    group = spec.group_name if spec is not None else fleet
    path = inventory or str(ROOT / (spec.inventory if spec is not None else "inventories/lab/hosts.yml"))
    return load(path, group, limit), path, group


def audit_options(c: Any, concurrency: Any = None, timeout: Any = None) -> Any:
    """:class:`~remediation.audit.AuditOptions` from ``audit:``, with the flags that override it."""
    from remediation.audit import AuditOptions
    from remediation.config import AuditSettings
    from remediation.errors import UsageError

    cfg = settings(c, AuditSettings, "audit")
    try:
        return AuditOptions(
            concurrency=int(concurrency or cfg.concurrency),
            connect_timeout=cfg.connect_timeout,
            timeout=float(timeout or cfg.timeout),
            nvml_timeout=cfg.nvml_timeout,
            temp_alert_c=cfg.temp_alert_c,
            memory_full_pct=cfg.memory_full_pct,
            expected_driver_version=cfg.expected_driver_version,
        )
    except (TypeError, ValueError):
        raise UsageError(
            f"--concurrency {concurrency!r} / --timeout {timeout!r}: both take numbers"
        ) from None


def read_input(file: str) -> tuple[str, str]:
    """The text of ``file`` (``-`` for stdin) and a name for it in messages."""
    from remediation.errors import ParseError

    if file == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(file).read_text(errors="replace"), file
    except OSError as exc:
        raise ParseError(f"cannot read {file}: {exc.strerror}; pass a readable file or - for stdin") from None
