"""Scene: kernel upgrades as planned maintenance (runbook S1's last prevention line), after ``s1-driver``.

The fleet gets one more host beside the scene before's generic ones: an Azure Trusted Launch VM (azure kernel
flavour, Secure Boot on, the signed precompiled NVIDIA module).

1. ``invoke kernel-update --check`` on the fleet: per host the booted flavour, Secure Boot, the target kernel, the
   module source and every step (nothing changes);
2. the rolling update of two hosts still on the old kernel, one batch at a time: a generic host (install with headers,
   DKMS builds the module) and the Trusted Launch host (the signed module package, as DKMS's unsigned build would be
   refused); gate 1, one-shot trial boot, gate 2 (NVML), the new kernel made the default, held;
3. the audit afterwards: both run their new kernel with NVML answering.

The scene returns whether every step showed what it should.
"""

from __future__ import annotations

from rich.rule import Rule

from demo import Scene, SceneContext
from remediation.host.audit import AuditOptions, run_audit
from remediation.transport.inventory import load

NEW = {"generic": "6.5.0-45-generic", "azure": "6.5.0-1025-azure"}
SOURCE = {"generic": "dkms", "azure": "signed"}


def run(ctx: SceneContext) -> bool:
    from remediation.kernelupdate.flow import KernelStatus, KernelUpdateOptions, kernel_update
    from remediation.report.kernel_update_view import print_kernel_plan, print_kernel_result
    from remediation.rollout.engine import StopReason

    lab, console, root = ctx.lab, ctx.console, ctx.root
    if lab.supervisor_pid() is None or len(lab.existing_hosts()) < 3:
        lab.up(max(ctx.hosts, 3), flavour="generic")
    azure = [h for h in lab.existing_hosts() if lab.flavour(h) == "azure"]
    if azure:
        lab.clear(azure[0])  # a demo starts from a fresh host
    else:
        lab.up(len(lab.existing_hosts()) + 1, flavour="azure", secure_boot=True)
        azure = [h for h in lab.existing_hosts() if lab.flavour(h) == "azure"]
    console.print(f"{azure[0]}: an Azure Trusted Launch VM (flavour azure, Secure Boot on, signed NVIDIA module)")
    inv = str(lab.cfg.inventory_path)
    audit_options = AuditOptions(nvml_timeout=5, timeout=60)
    ok = True

    console.print(Rule("1. invoke kernel-update --fleet gpu --check"))
    check = kernel_update(load(inv, "gpu"), inv, audit_options,
                          KernelUpdateOptions(dry_run=True, state_dir=root / ".audit"),
                          show_plan=lambda plan: print_kernel_plan(console, plan))
    generic = [p.host for p in check.plan if p.changes_host and p.host not in azure][:1]
    movers = generic + [p.host for p in check.plan if p.changes_host and p.host == azure[0]]
    flavour = {h: ("azure" if h in azure else "generic") for h in movers}
    ok &= check.stopped is StopReason.PREVIEW and len(movers) == 2
    ok &= all(p.target_kernel == NEW[flavour[p.host]] and p.module_source == SOURCE[flavour[p.host]]
              for p in check.plan if p.host in movers)

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
        moved = facts is not None and facts.system.kernel == NEW[flavour[h.host]] and facts.nvml.ok
        console.print(f"{h.host}: kernel {facts.system.kernel if facts else '?'}, Secure Boot "
                      f"{facts.secure_boot.state if facts else '?'}, "
                      f"NVML {'ok' if facts and facts.nvml.ok else 'failed'}")
        ok &= h.host not in azure or (facts is not None and facts.secure_boot.enabled is True)
        ok &= moved
    return ok


SCENE = Scene("kernel-update", "S1 prevention: kernels move as planned maintenance, gated before and after the reboot",
              run)
