"""``invoke kernel-update``: move GPU hosts to a newer kernel of their flavour, gated before and after the reboot."""

from __future__ import annotations

from typing import Any

from invoke import Collection, task

from commands import CHECK_HELP, FLEET_HELP, edge, with_collections
from commands.rollout import ROLLOUT_HELP, rollout_options, run_rollout_task


def kernel_options(c: Any, **flags: Any) -> Any:
    """:class:`~remediation.kernelupdate.api.KernelUpdateOptions` from ``kernel_update:`` and the flags."""
    from remediation.config import KernelUpdateSettings
    from remediation.kernelupdate.api import KernelUpdateError, KernelUpdateOptions

    return rollout_options(c, "kernel-update", KernelUpdateOptions, KernelUpdateSettings, KernelUpdateError,
                           "--batch/--max-failures/--reboot-timeout take numbers",
                           lambda pick: {"kernel": flags.get("kernel")}, **flags)


@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        **ROLLOUT_HELP,
        "kernel": "target release of the booted flavour (e.g. 6.5.0-1025-azure); default: the newest apt offers",
        "module_source": "auto | dkms | signed: the target's NVIDIA module (auto: signed when Secure Boot is on)",
        "allow_reboot": "trial-boot the target and promote it (without it: install, gate 1, hold; no reboot)",
        "check": CHECK_HELP,
        "batch": "hosts per batch (default 1); each batch passes gate 2 before the next",
        "force": "update even on hosts with running GPU work",
        "report": "write the incident report here (default .audit/kernel-update-<fleet>-<run>.md)",
    },
)
@edge
@with_collections
def kernel_update(  # type: ignore[no-untyped-def]
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    kernel=None,
    module_source=None,
    allow_reboot=False,
    check=False,
    dry_run=False,
    yes=False,
    batch=None,
    max_failures=None,
    force=False,
    reboot_timeout=None,
    report=None,
):
    """Move GPU hosts to a newer kernel of their flavour: module proven before the reboot, NVML after, fall back.

    Exit codes: 0 every host moved or current (or --check); 1 a host did not move; 2 bad input; 4 lock held.
    """
    from remediation.kernelupdate.api import kernel_update as run
    from remediation.report.kernel_update_view import print_kernel_plan, print_kernel_result, render_kernel_report

    check = bool(check or dry_run)
    options = kernel_options(
        c, kernel=kernel, module_source=module_source, allow_reboot=allow_reboot, dry_run=check, batch=batch,
        max_failures=max_failures, force=force, reboot_timeout=reboot_timeout,
    )
    run_rollout_task(c, "kernel-update", run, options, fleet=fleet, inventory=inventory, limit=limit, check=check,
                     yes=yes, question="update the kernel", show_plan=print_kernel_plan,
                     show_result=print_kernel_result, render_report=render_kernel_report, report=report)


ns: Any = Collection("kernel-update", kernel_update)
