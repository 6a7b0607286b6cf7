"""``invoke driver-restore``: the emergency S1 restore, rolling and NVML-gated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invoke import Collection, Exit, task

from commands import (
    CHECK_HELP,
    FLEET_HELP,
    ask,
    audit_options,
    edge,
    fleet_hosts,
    require_confirmation,
    settings,
    under_project,
    with_collections,
)


def restore_options(c: Any, **flags: Any) -> Any:
    """:class:`~remediation.restore.flow.RestoreOptions` from ``driver_restore:`` and the flags (flag wins)."""
    from remediation.config import AuditSettings, RestoreSettings
    from remediation.restore.api import Prefer, RestoreError, RestoreOptions

    cfg = settings(c, RestoreSettings, "driver_restore")
    history_dir = settings(c, AuditSettings, "audit").history_dir

    def pick(name: str) -> Any:
        value = flags.get(name)
        return getattr(cfg, name) if value is None else value

    try:
        return RestoreOptions(
            method=str(pick("method")),
            prefer=Prefer(pick("prefer")),
            allow_reboot=bool(flags.get("allow_reboot")),
            dry_run=bool(flags.get("dry_run")),
            batch=int(pick("batch")),
            max_failures=int(pick("max_failures")),
            force=bool(flags.get("force")),
            reboot_timeout=int(pick("reboot_timeout")),
            apt_lock_timeout=cfg.apt_lock_timeout,
            state_dir=under_project(c, cfg.state_dir or history_dir),
            lock_ttl_s=cfg.lock_ttl_s,
            playbook_timeout=cfg.playbook_timeout,
            module_source=str(pick("module_source")),
        ).validate()
    except ValueError as exc:
        raise RestoreError(
            f"bad driver-restore setting: {exc}; --prefer takes rebuild or previous-kernel, "
            "--batch/--max-failures/--reboot-timeout take numbers"
        ) from None


@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        "method": "auto | apt | azure-extension (auto: inventory var driver_restore_method)",
        "allow_reboot": "reboot hosts whose restore needs it (never without this flag)",
        "check": CHECK_HELP,
        "dry_run": "alias of --check",
        "yes": "apply without asking",
        "batch": "hosts per batch (default 1); each batch must pass the NVML gate before the next",
        "max_failures": "stop after this many failed hosts (default 1); later hosts are not touched",
        "force": "restore even on hosts with running GPU compute processes",
        "prefer": "rebuild | previous-kernel: for a booted kernel without module",
        "module_source": "auto | dkms | signed: where a rebuilt module comes from (auto: signed under Secure Boot)",
        "reboot_timeout": "seconds a rebooting host has to come back (default 600)",
        "report": "write the incident report here (default .audit/driver-restore-<fleet>-<run>.md)",
    },
)
@edge
@with_collections
def driver_restore(  # type: ignore[no-untyped-def]
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    method=None,
    allow_reboot=False,
    check=False,
    dry_run=False,
    yes=False,
    batch=None,
    max_failures=None,
    force=False,
    prefer=None,
    reboot_timeout=None,
    report=None,
    module_source=None,
):
    """Restore the NVIDIA driver after a kernel update: rolling, NVML-gated, undo on failure.

    Exit codes: 0 every host restored or healthy (or --check); 1 a host not restored; 2 bad input; 4 lock held.
    """
    from remediation.report.console import console
    from remediation.report.restore_view import print_restore_plan, print_restore_result, render_restore_report
    from remediation.restore.api import driver_restore as run
    from remediation.transport.inventory import load

    check = bool(check or dry_run)
    options = restore_options(
        c,
        method=method,
        prefer=prefer,
        module_source=module_source,
        allow_reboot=allow_reboot,
        dry_run=check,
        batch=batch,
        max_failures=max_failures,
        force=force,
        reboot_timeout=reboot_timeout,
    )
    hosts, path, group = fleet_hosts(c, fleet, inventory, limit)
    require_confirmation("driver-restore changes hosts", check=check, yes=yes, preview="to see the plan")

    def confirm(plan: Any) -> bool:
        if yes:
            return True
        names = [d.host for d in plan if d.changes_host]
        return ask(f"restore the driver on {len(names)} host(s): {', '.join(names)}")

    result = run(
        hosts,
        path,
        audit_options(c),
        options,
        fleet=fleet,
        confirm=confirm,
        show_plan=lambda plan: print_restore_plan(console, plan),
        lease_hosts=load(path, group),  # the whole fleet carries the lease, whatever --limit says
    )
    print_restore_result(console, result)
    if result.stopped is None or not result.stopped.changed_nothing:
        text = render_restore_report(result)
        out = Path(report) if report else options.state_dir / f"driver-restore-{fleet}-{result.run_id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        console.print(f"incident report: {out}", markup=False)
    raise Exit(code=result.exit_code)


ns: Any = Collection("driver-restore", driver_restore)
