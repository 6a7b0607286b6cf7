"""Scene: a weekend of faults, and the closed loop (``invoke remediate``) that meets them at 3 a.m.

On three of the demo's generic lab hosts (the fleet of this scene):

1. Friday night: two hosts come back fresh from a rebuild (unhardened: the harden findings, ``auto`` by policy), one
   of them then logs uncorrectable ECC errors (hardware: never ``auto``, escalated);
2. ``invoke remediate --check``: the plan, the budget arithmetic, nothing changed;
3. ``invoke remediate --yes`` once: the fresh hosts hardened and gated (re-audit, NVML, the gate under load on the lab
   NVML's load hook), the ECC finding escalated with an evidence packet;
4. Saturday: two more GPUs fall off the bus (Xid 79): three of three hosts unhealthy, beyond the breaker's 50 %. The
   next run trips the circuit breaker and acts on nothing; the run after it is still halted (a tripped breaker stays
   tripped); the GPUs replaced (the hosts rebooted with them back), ``invoke remediate.reset`` clears the breaker: the
   next plan is no longer halted.

The scene returns whether every step showed what it should.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from rich.rule import Rule

from demo import Scene, SceneContext
from lab import hardware
from lab.control import Lab
from lab.faults import inject
from remediation.host.audit import AuditOptions
from remediation.transport.inventory import load

if TYPE_CHECKING:
    from remediation.remediate.act import ActResult
    from remediation.remediate.plan import Plan


def _replace_gpus(lab: Lab, host: str) -> None:
    """What the platform's repair does for a GPU that fell off the bus: the GPU back, the host rebooted."""
    path = lab.paths.host(host) / "hw/gpus"
    state = hardware.read_state(path)
    for key in [k for k in state if k.endswith(".lost")]:
        state[key] = "0"
    hardware.write_state(path, state)
    lab.reboot(host, wait=True)


def run(ctx: SceneContext) -> bool:
    from remediation.config import RemediateSettings
    from remediation.remediate.act import HostStatus, act
    from remediation.remediate.flow import check, reset
    from remediation.report.remediate_view import print_plan, print_reset, print_result

    lab, console, root = ctx.lab, ctx.console, ctx.root
    if lab.supervisor_pid() is None or len(lab.existing_hosts()) < 3:
        lab.up(max(ctx.hosts, 3), flavour="generic")
    fleet = sorted(h for h in lab.existing_hosts() if lab.flavour(h) == "generic")[:3]
    ecc_host, fresh, third = fleet
    inv = str(lab.cfg.inventory_path)
    hosts = load(inv, "gpu", limit=",".join(fleet))
    options = AuditOptions(nvml_timeout=5, timeout=60)
    state_dir = root / ".audit" / "demo-remediate"
    shutil.rmtree(state_dir, ignore_errors=True)  # the scene's own state: every demo starts with a fresh budget
    cfg = RemediateSettings(state_dir=str(state_dir), imds_endpoint="", webhook_url="", load_gate_seconds=3)
    ok = True

    def plan_now() -> Plan:
        plan, _ = check(hosts, inv, options, cfg, fleet="gpu", state_dir=state_dir, fleet_size=len(hosts))
        return plan

    def act_now() -> ActResult:
        result = act(hosts, inv, options, cfg, fleet="gpu", state_dir=state_dir, fleet_size=len(hosts))
        print_result(console, result)
        return result

    console.print(Rule(f"1. Friday night: {ecc_host} and {fresh} rebuilt (unhardened), then ECC errors on {ecc_host}"))
    for h in (fresh, ecc_host):
        lab.clear(h)
    console.print(inject(lab, ecc_host, "ecc").detail)

    console.print(Rule(f"2. 03:00 Saturday: invoke remediate --fleet gpu --limit {','.join(fleet)} --check"))
    plan = plan_now()
    print_plan(console, plan)
    auto = sorted(h.host for h in plan.hosts if h.auto)
    ecc = {d.finding: d.verdict.value for h in plan.hosts if h.host == ecc_host for d in h.decisions}
    # auto: the first batch's host (cap 1); the other rebuilt host waits for the next batch of the same run
    ok &= bool(auto) and set(auto) <= {ecc_host, fresh} and ecc.get("GPU-HW-003") == "escalate"
    ok &= not plan.breaker_open

    console.print(Rule("3. invoke remediate --yes: fix what is safe, gate it under load, escalate the rest"))
    first = act_now()
    out = first.outcomes
    fixed = sorted(h for h, o in out.items() if o.status is HostStatus.FIXED)
    escalated = sorted({(e.host, e.finding) for e in first.escalations})
    ok &= fresh in fixed and "load gate passed" in out[fresh].why and first.halted is None
    ok &= (ecc_host, "GPU-HW-003") in escalated and all(e.packet for e in first.escalations)
    console.print(f"fixed (hardened, gated under load): {', '.join(fixed)}; escalated with a packet: "
                  + ", ".join(f"{h} {f}" for h, f in escalated), markup=False)

    console.print(Rule(f"4. Saturday afternoon: Xid 79 on {fresh} and {third}; the next runs meet the breaker"))
    for h in (fresh, third):
        console.print(f"{h}: {inject(lab, h, 'xid-79').detail}", markup=False)
    tripped = act_now()
    ok &= tripped.plan.breaker_open and not any(
        o.status is HostStatus.FIXED for o in tripped.outcomes.values())
    console.print(Rule(f"GPUs replaced on {fresh} and {third} (hosts rebooted); the breaker stays tripped"))
    for h in (fresh, third):
        _replace_gpus(lab, h)
    still = plan_now()
    ok &= still.breaker_open and still.breaker_tripped_at is not None
    print_plan(console, still)

    console.print(Rule("5. a person looked: invoke remediate.reset --fleet gpu --yes"))
    cleared = reset(state_dir, "gpu")
    print_reset(console, cleared, applied=True)
    after = plan_now()
    print_plan(console, after)
    ok &= cleared.before.breaker is not None and not after.breaker_open
    return bool(ok)


SCENE = Scene("remediate", "a weekend of faults: remediate fixes, gates under load, escalates, trips the breaker",
              run)
