"""The body of ``invoke driver-restore`` (tasks.py stays a thin shell: it calls :func:`driver_restore_task`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .errors import RestoreError

__all__ = ["driver_restore_task"]


def driver_restore_task(
    c: Any,
    *,
    root: Path,
    fleet: str = "gpu",
    inventory: str | None = None,
    limit: str | None = None,
    method: str | None = None,
    allow_reboot: bool = False,
    dry_run: bool = False,
    yes: bool = False,
    batch: int | str | None = None,
    max_failures: int | str | None = None,
    force: bool = False,
    prefer: str | None = None,
    reboot_timeout: int | str | None = None,
    report: str | None = None,
) -> int:
    """Parse flags (flag > ``driver_restore:`` config > default), run the flow, print; return the exit code."""
    from remediation.inventory import load
    from remediation.report.console import console
    from remediation.report.restore_view import print_restore_plan, print_restore_result, render_restore_report

    from .flow import RestoreOptions, driver_restore
    from .rules import Prefer

    cfg = c.config.get("driver_restore", {}) or {}
    audit_cfg = c.config.get("audit", {}) or {}
    fleets = c.config.get("fleets", {}) or {}
    if fleet not in fleets and inventory is None:
        raise RestoreError(f"fleet {fleet!r} is not configured (fleets: {', '.join(fleets) or 'none'}); "
                           "add it under fleets: in invoke.yaml or pass --inventory")
    spec = fleets.get(fleet, {})
    path = inventory or str(root / spec.get("inventory", "inventories/lab/hosts.yml"))
    hosts = load(path, spec.get("group", fleet), limit)
    try:
        options = RestoreOptions(
            method=str(method or cfg.get("method", "auto")),
            prefer=Prefer(prefer or cfg.get("prefer", "rebuild")),
            allow_reboot=bool(allow_reboot),
            dry_run=bool(dry_run),
            batch=int(batch if batch is not None else cfg.get("batch", 1)),
            max_failures=int(max_failures if max_failures is not None else cfg.get("max_failures", 1)),
            force=bool(force),
            reboot_timeout=int(reboot_timeout if reboot_timeout is not None else cfg.get("reboot_timeout", 600)),
            apt_lock_timeout=int(cfg.get("apt_lock_timeout", 60)),
            state_dir=root / str(cfg.get("state_dir", audit_cfg.get("history_dir", ".audit"))),
            lock_ttl_s=float(cfg.get("lock_ttl_s", 6 * 3600)),
        ).validate()
    except ValueError as exc:
        raise RestoreError(f"bad driver-restore setting: {exc}; --prefer takes rebuild or previous-kernel, "
                           "--batch/--max-failures/--reboot-timeout take numbers") from None
    if not (dry_run or yes or sys.stdin.isatty()):
        raise RestoreError("driver-restore changes hosts and there is no terminal to confirm on: pass --yes, or "
                           "--dry-run to see the plan")
    from remediation.audit import AuditOptions

    audit_options = AuditOptions(
        concurrency=int(audit_cfg.get("concurrency", 32)),
        connect_timeout=float(audit_cfg.get("connect_timeout", 10)),
        timeout=float(audit_cfg.get("timeout", 60)),
        nvml_timeout=float(audit_cfg.get("nvml_timeout", 10)),
        expected_driver_version=audit_cfg.get("expected_driver_version"),
    )

    def confirm(plan: Any) -> bool:
        if yes:
            return True
        names = [d.host for d in plan if d.changes_host]
        answer = input(f"restore the driver on {len(names)} host(s): {', '.join(names)}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    result = driver_restore(
        hosts, path, audit_options, options, fleet=fleet, confirm=confirm,
        show_plan=lambda plan: print_restore_plan(console, plan),
    )
    print_restore_result(console, result)
    if result.stopped not in ("dry-run", "declined", "nothing to do"):
        text = render_restore_report(result)
        out = Path(report) if report else options.state_dir / f"driver-restore-{fleet}-{result.run_id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        console.print(f"incident report: {out}")
    return result.exit_code
