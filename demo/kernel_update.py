"""Scene: kernel upgrades as planned maintenance (runbook S1's last prevention line), after ``s1-driver``.

1. ``invoke kernel-update --check`` on the fleet: per host the booted flavour, Secure Boot, the target kernel, the
   module source and every step (nothing changes);
2. the rolling update of two hosts still on the old kernel, one batch at a time: install with headers, DKMS builds the
   module, gate 1, one-shot trial boot, gate 2 (NVML), the new kernel made the default, held;
3. the audit afterwards: both run the new kernel with NVML answering, and the unattended-upgrades blacklist that
   ``harden`` wrote is still there.

The scene returns whether every step showed what it should.
"""

from __future__ import annotations

from rich.rule import Rule

from demo import Scene, SceneContext
from remediation.audit import AuditOptions, run_audit
from remediation.inventory import load

NEW = "6.5.0-45-generic"


def run(ctx: SceneContext) -> bool:
    from remediation.kernelupdate.flow import KernelStatus, KernelUpdateOptions, kernel_update
    from remediation.report.kernel_update_view import print_kernel_plan, print_kernel_result

    lab, console, root = ctx.lab, ctx.console, ctx.root
    if lab.supervisor_pid() is None or len(lab.existing_hosts()) < 3:
        lab.up(max(ctx.hosts, 3), flavour="generic")
    inv = str(lab.cfg.inventory_path)
    audit_options = AuditOptions(nvml_timeout=5, timeout=60)
    ok = True

    console.print(Rule("1. invoke kernel-update --fleet gpu --check"))
    check = kernel_update(load(inv, "gpu"), inv, audit_options,
                          KernelUpdateOptions(dry_run=True, state_dir=root / ".audit"),
                          show_plan=lambda plan: print_kernel_plan(console, plan))
    movers = [p.host for p in check.plan if p.changes_host][:2]
    ok &= check.stopped == "dry-run" and len(movers) == 2
    ok &= all(p.target_kernel == NEW and p.module_source == "dkms" for p in check.plan if p.host in movers)

    console.print(Rule(f"2. invoke kernel-update --limit {','.join(movers)} --allow-reboot --batch 1 --yes"))
    result = kernel_update(load(inv, "gpu", limit=",".join(movers)), inv, audit_options,
                           KernelUpdateOptions(allow_reboot=True, batch=1, reboot_timeout=120,
                                               state_dir=root / ".audit"),
                           hooks=None, show_plan=lambda plan: print_kernel_plan(console, plan))
    print_kernel_result(console, result)
    ok &= result.exit_code == 0 and all(result.outcome(h).status is KernelStatus.MOVED for h in movers)

    console.print(Rule("3. the audit afterwards"))
    after = run_audit(load(inv, "gpu", limit=",".join(movers)), audit_options)
    for h in after.hosts:
        facts = h.facts
        moved = facts is not None and facts.system.kernel == NEW and facts.nvml.ok
        kept = facts is not None and bool(facts.unattended_upgrades.package_blacklist)
        console.print(f"{h.host}: kernel {facts.system.kernel if facts else '?'}, NVML "
                      f"{'ok' if facts and facts.nvml.ok else 'failed'}, Package-Blacklist "
                      f"{'kept' if kept else 'missing'}")
        ok &= moved
    return ok


SCENE = Scene("kernel-update", "S1 prevention: kernels move as planned maintenance, gated before and after the reboot",
              run)
