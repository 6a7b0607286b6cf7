"""``invoke driver-restore``: the emergency S1 restore, rolling and NVML-gated."""

from __future__ import annotations

from typing import Any

from invoke import Collection, task

from commands import CHECK_HELP, FLEET_HELP, edge, with_collections
from commands.rollout import ROLLOUT_HELP, rollout_options, run_rollout_task


def restore_options(c: Any, **flags: Any) -> Any:
    """:class:`~remediation.restore.api.RestoreOptions` from ``driver_restore:`` and the flags (flag wins)."""
    from remediation.config import RestoreSettings
    from remediation.restore.api import Prefer, RestoreError, RestoreOptions

    return rollout_options(c, "driver-restore", RestoreOptions, RestoreSettings, RestoreError,
                           "--prefer takes rebuild or previous-kernel, --batch/--max-failures/--reboot-timeout take"
                           " numbers", lambda pick: {"method": str(pick("method")), "prefer": Prefer(pick("prefer"))},
                           **flags)


@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        **ROLLOUT_HELP,
        "method": "auto | apt | azure-extension (auto: inventory var driver_restore_method)",
        "allow_reboot": "reboot hosts whose restore needs it (never without this flag)",
        "check": CHECK_HELP,
        "batch": "hosts per batch (default 1); each batch must pass the NVML gate before the next",
        "force": "restore even on hosts with running GPU compute processes",
        "prefer": "rebuild | previous-kernel: for a booted kernel without module",
        "module_source": "auto | dkms | signed: where a rebuilt module comes from (auto: signed under Secure Boot)",
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
    from remediation.report.restore_view import print_restore_plan, print_restore_result, render_restore_report
    from remediation.restore.api import driver_restore as run

    check = bool(check or dry_run)
    options = restore_options(
        c, method=method, prefer=prefer, module_source=module_source, allow_reboot=allow_reboot, dry_run=check,
        batch=batch, max_failures=max_failures, force=force, reboot_timeout=reboot_timeout,
    )
    run_rollout_task(c, "driver-restore", run, options, fleet=fleet, inventory=inventory, limit=limit, check=check,
                     yes=yes, question="restore the driver", show_plan=print_restore_plan,
                     show_result=print_restore_result, render_report=render_restore_report, report=report)


ns: Any = Collection("driver-restore", driver_restore)
