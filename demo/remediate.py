"""Scene: a weekend of faults on ten hosts, and the closed loop (``invoke remediate``) that meets them at 3 a.m.

On ten of the demo's generic lab hosts (the fleet of this scene; the lab grows to ten when it has fewer), with the
scene's policy: at most 4 hosts (40 %) in flight, the breaker at 50 % of the fleet, pages to a webhook receiver and
the VMs' Scheduled Events from an IMDS stand-in, both on loopback:

1. Friday night: the ten hosts come back fresh from a rebuild (unhardened: the harden findings, ``auto`` by policy);
   one then logs uncorrectable ECC errors (hardware: never ``auto``, escalated); Azure schedules a Reboot of another's
   VM in ten minutes (host maintenance);
2. ``invoke remediate --check``: the plan, the budget arithmetic, nothing changed;
3. ``invoke remediate --yes`` once: eight hosts hardened and gated (re-audit, NVML, the gate under load on the lab
   NVML's load hook) in batches of four; the ECC finding escalated with an evidence packet and a page; the host with
   the Reboot due left to the platform and escalated (AZ-SE-001) with a page;
4. Saturday: five GPUs fall off the bus (Xid 79): six of ten hosts unhealthy, beyond the breaker's 50 %. The next
   run trips the circuit breaker and acts on nothing; the GPUs replaced (the hosts rebooted with them back), the
   breaker stays tripped; ``invoke remediate.reset`` clears it: the next plan is no longer halted.

The scene returns whether every step showed what it should.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.rule import Rule

from demo import Scene, SceneContext
from lab import hardware
from lab.control import Lab
from lab.faults import inject
from lab.services.alert_webhook import AlertReceiver
from lab.services.imds import FakeImds
from remediation.host.audit import AuditOptions
from remediation.transport.inventory import load

if TYPE_CHECKING:
    from remediation.remediate.act import ActResult
    from remediation.remediate.plan import Plan


SIZE = 10  # the scene's fleet


def _generic(lab: Lab) -> list[str]:
    """The first SIZE generic hosts, in host order."""
    hosts = [h for h in lab.existing_hosts() if lab.flavour(h) == "generic"]
    return sorted(hosts, key=lambda name: int(name.rsplit("-", 1)[-1]))[:SIZE]


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
    fleet = _generic(lab)
    if lab.supervisor_pid() is None or len(fleet) < SIZE:  # earlier scenes' hosts of other flavours are kept
        others = len(lab.existing_hosts()) - len(fleet) if lab.supervisor_pid() is not None else 0
        lab.up(max(ctx.hosts, SIZE + others), flavour="generic")
        fleet = _generic(lab)
    ecc_host, event_host, *rest = fleet
    lost = rest[:5]
    inv = str(lab.cfg.inventory_path)
    # each host is its own Azure VM (the Scheduled Events stand-in serves them all and names the VM an event is for)
    hosts = [replace(h, vars={**h.vars, "azure_vm_name": f"vm-{h.name}"})
             for h in load(inv, "gpu", limit=",".join(fleet))]
    options = AuditOptions(nvml_timeout=5, timeout=60)
    state_dir = root / ".audit" / "demo-remediate"
    shutil.rmtree(state_dir, ignore_errors=True)  # the scene's own state: every demo starts with a fresh budget
    prefix = lab.cfg.address_prefix
    with FakeImds(host=f"{prefix}.250") as imds, AlertReceiver(host=f"{prefix}.251") as receiver:
        cfg = RemediateSettings(state_dir=str(state_dir), imds_endpoint=imds.endpoint, webhook_url=receiver.webhook_url,
                                load_gate_seconds=3, max_in_flight=4, max_in_flight_pct=40.0)
        ok = True

        def expect(condition: bool, what: str) -> bool:
            if not condition:
                console.print(f"not as expected: {what}", style="red", markup=False)
            return bool(condition)

        def plan_now() -> Plan:
            plan, _ = check(hosts, inv, options, cfg, fleet="gpu", state_dir=state_dir, fleet_size=len(hosts))
            return plan

        def act_now() -> ActResult:
            result = act(hosts, inv, options, cfg, fleet="gpu", state_dir=state_dir, fleet_size=len(hosts))
            print_result(console, result)
            return result

        console.print(Rule(f"1. Friday night: {SIZE} hosts rebuilt (unhardened); ECC errors on {ecc_host}; "
                           f"Azure schedules a Reboot of {event_host}'s VM"))
        for h in fleet:
            lab.clear(h)
        console.print(inject(lab, ecc_host, "ecc").detail)
        event = imds.schedule("Reboot", [f"vm-{event_host}"], in_seconds=600, description="Host OS update")
        console.print(f"Scheduled Event {event}: Reboot of vm-{event_host} in 10 minutes", markup=False)

        console.print(Rule(f"2. 03:00 Saturday: invoke remediate --fleet gpu --check ({SIZE} hosts)"))
        plan = plan_now()
        print_plan(console, plan)
        auto = {h.host for h in plan.hosts if h.auto}
        ecc = {d.finding: d.verdict.value for h in plan.hosts if h.host == ecc_host for d in h.decisions}
        # auto: the first batch's hosts (the cap: 4); the others wait for the next batches of the same run
        ok &= expect(0 < len(auto) <= 4 and auto <= set(fleet) and ecc.get("GPU-HW-003") == "escalate"
                     and not plan.breaker_open,
                     "the plan: the first batch auto, the ECC finding escalated, the breaker closed")

        console.print(Rule("3. invoke remediate --yes: fix what is safe in batches of 4, gate it under load, "
                           "escalate the rest"))
        first = act_now()
        out = first.outcomes
        fixed = sorted((h for h, o in out.items() if o.status is HostStatus.FIXED),
                       key=lambda name: int(name.rsplit("-", 1)[-1]))
        escalated = {(e.host, e.finding): e for e in first.escalations}
        ok &= expect(set(fixed) == set(fleet) - {event_host} and first.halted is None,
                     "every host but the one with the Reboot due fixed, the loop not halted")
        ok &= expect(all("load gate passed" in out[h].why for h in fixed if h != ecc_host),
                     "every hardened host gated under load")
        ok &= expect((ecc_host, "GPU-HW-003") in escalated and (event_host, "AZ-SE-001") in escalated,
                     "the ECC finding and the Scheduled Event escalated")
        ok &= expect(all(e.packet and e.page == "sent" for e in first.escalations),
                     "every escalation with a packet and a page sent")
        ok &= expect(out[event_host].status is HostStatus.ESCALATED and event in out[event_host].why,
                     "the host with the Reboot due escalated as AZ-SE-001")
        ok &= expect(sorted((p.labels["host"], p.labels["finding_id"]) for p in receiver.pages) == sorted(escalated),
                     "the receiver got exactly the escalations' pages")
        console.print(f"fixed (hardened, gated under load): {', '.join(fixed)}; escalated with a packet and a page: "
                      + ", ".join(f"{h} {f}" for h, f in sorted(escalated)), markup=False)
        imds.complete_event(event)  # the platform's reboot came and went

        console.print(Rule(f"4. Saturday afternoon: Xid 79 on {', '.join(lost)}; the next runs meet the breaker"))
        for h in lost:
            console.print(f"{h}: {inject(lab, h, 'xid-79').detail}", markup=False)
        tripped = act_now()
        ok &= expect(tripped.plan.breaker_open and not any(o.status is HostStatus.FIXED
                                                            for o in tripped.outcomes.values()),
                     "the breaker tripped and nothing was fixed")
        console.print(Rule(f"GPUs replaced on {', '.join(lost)} (hosts rebooted); the breaker stays tripped"))
        for h in lost:
            _replace_gpus(lab, h)
        still = plan_now()
        ok &= expect(still.breaker_open and still.breaker_tripped_at is not None,
                     "the breaker still tripped after the GPUs came back")
        print_plan(console, still)

        console.print(Rule("5. a person looked: invoke remediate.reset --fleet gpu --yes"))
        cleared = reset(state_dir, "gpu")
        print_reset(console, cleared, applied=True)
        after = plan_now()
        print_plan(console, after)
        ok &= expect(cleared.before.breaker is not None and not after.breaker_open,
                     "the reset cleared the breaker")
    return bool(ok)


SCENE = Scene("remediate", "a weekend of faults on ten hosts: remediate fixes, gates under load, escalates, trips "
              "the breaker",
              run)
