"""``invoke kernel-update``: move GPU hosts to a newer kernel of their flavour, gated before and after the reboot."""

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


def kernel_options(c: Any, **flags: Any) -> Any:
    """:class:`~remediation.kernelupdate.flow.KernelUpdateOptions` from ``kernel_update:`` and the flags."""
    from remediation.config import AuditSettings, KernelUpdateSettings
    from remediation.kernelupdate.api import KernelUpdateError, KernelUpdateOptions

    cfg = settings(c, KernelUpdateSettings, "kernel_update")
    history_dir = settings(c, AuditSettings, "audit").history_dir

    def pick(name: str) -> Any:
        value = flags.get(name)
        return getattr(cfg, name) if value is None else value

    try:
        return KernelUpdateOptions(
            kernel=flags.get("kernel"),
            module_source=str(pick("module_source")),
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
        ).validate()
    except ValueError as exc:
        raise KernelUpdateError(
            f"bad kernel-update setting: {exc}; --batch/--max-failures/--reboot-timeout take numbers"
        ) from None


@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        "kernel": "target release of the booted flavour (e.g. 6.5.0-1025-azure); default: the newest apt offers",
        "module_source": "auto | dkms | signed: the target's NVIDIA module (auto: signed when Secure Boot is on)",
        "allow_reboot": "trial-boot the target and promote it (without it: install, gate 1, hold; no reboot)",
        "check": CHECK_HELP,
        "dry_run": "alias of --check",
        "yes": "apply without asking",
        "batch": "hosts per batch (default 1); each batch passes gate 2 before the next",
        "max_failures": "stop after this many failed hosts (default 1); later hosts are not touched",
        "force": "update even on hosts with running GPU work",
        "reboot_timeout": "seconds a rebooting host has to come back (default 600)",
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
    from remediation.report.console import console
    from remediation.report.kernel_update_view import (
        print_kernel_plan,
        print_kernel_result,
        render_kernel_report,
    )
    from remediation.transport.inventory import load

    check = bool(check or dry_run)
    options = kernel_options(
        c, kernel=kernel, module_source=module_source, allow_reboot=allow_reboot, dry_run=check, batch=batch,
        max_failures=max_failures, force=force, reboot_timeout=reboot_timeout,
    )
    hosts, path, group = fleet_hosts(c, fleet, inventory, limit)
    require_confirmation("kernel-update changes hosts", check=check, yes=yes, preview="to see the plan")

    def confirm(plan: Any) -> bool:
        if yes:
            return True
        names = [p.host for p in plan if p.changes_host]
        return ask(f"update the kernel on {len(names)} host(s): {', '.join(names)}")

    result = run(
        hosts, path, audit_options(c), options, fleet=fleet, confirm=confirm,
        show_plan=lambda plan: print_kernel_plan(console, plan),
        lease_hosts=load(path, group),
    )
    print_kernel_result(console, result)
    if result.stopped is None or not result.stopped.changed_nothing:
        out = Path(report) if report else options.state_dir / f"kernel-update-{fleet}-{result.run_id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_kernel_report(result))
        console.print(f"incident report: {out}", markup=False)
    raise Exit(code=result.exit_code)


ns: Any = Collection("kernel-update", kernel_update)
