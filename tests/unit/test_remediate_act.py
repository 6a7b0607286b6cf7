"""Acting on the plan: the blockers, the batch sizes, the gate, the attempts and their outcomes in the state, the page
dedupe; and the whole run wired to stand-ins for the audit, the flows, IMDS and the webhook."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from remediation.config import RemediateSettings
from remediation.core.facts import facts_from_dict
from remediation.core.findings import make_finding
from remediation.host.audit import AuditResult, HostAudit
from remediation.remediate.act import (
    HostStatus,
    Ports,
    act,
    batches,
    blocker,
    gate,
    page_due,
    refresh,
    settled,
    started,
)
from remediation.remediate.guards import Outcome
from remediation.remediate.hold import NoHold
from remediation.remediate.plan import Decision, Verdict
from remediation.remediate.policy import Action
from remediation.remediate.state import RemediateState, load, state_path
from remediation.transport.fanout import Status
from remediation.transport.inventory import Host

NOW = _dt.datetime(2025, 6, 4, 12, 0, tzinfo=_dt.UTC)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def facts(name: str = "healthy", host: str = "gpu-1", boot: str = "boot-1", **system: Any) -> Any:
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    doc["host"] = host
    doc.setdefault("system", {})["boot_id"] = boot
    doc["collected_at"] = NOW.isoformat()
    return facts_from_dict(doc)


def audit_of(host: str, *ids: str, name: str = "healthy", boot: str = "boot-1") -> HostAudit:
    return HostAudit(host, Status.OK, facts(name, host, boot),
                     tuple(make_finding(i, f"{i} on {host}", [f"evidence {i}"], host=host) for i in ids), None, 1.0)


def decision(finding: str, action: Action = Action.HARDEN, host: str = "gpu-1") -> Decision:
    return Decision(host, finding, Verdict.AUTO, "auto", action=action)


def events(verdict: str, reason: str = "") -> Any:
    return SimpleNamespace(verdict=SimpleNamespace(value=verdict), reason=reason)


def test_batches_are_no_larger_than_the_free_slots_of_the_cap() -> None:
    assert batches(["a", "b", "c"], 1) == [["a"], ["b"], ["c"]]
    assert batches(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
    assert batches(["a", "b", "c"], 3, busy=1) == [["a", "b"], ["c"]]
    assert batches(["a", "b"], 1, busy=1) == []  # an earlier run's host still in flight holds the only slot
    assert batches([], 2) == []


def test_refresh_drops_the_decisions_whose_finding_is_gone() -> None:
    ds = [decision("GPU-KRN-002"), decision("GPU-KRN-003")]
    kept, gone = refresh(ds, audit_of("gpu-1", "GPU-KRN-003"))
    assert [d.finding for d in kept] == ["GPU-KRN-003"] and gone == ("GPU-KRN-002",)


def test_blockers_in_their_order() -> None:
    harden = [decision("GPU-KRN-002")]
    clear = events("clear")
    assert blocker(harden, audit_of("gpu-1", "GPU-KRN-002"), clear) is None
    assert "re-probe failed" in (blocker(harden, None, clear) or "")
    unreachable = HostAudit("gpu-1", Status.UNREACHABLE, None, (), "no route", 1.0)
    assert "re-probe failed (unreachable: no route)" in (blocker(harden, unreachable, clear) or "")
    assert "dpkg lock held" in (blocker(harden, audit_of("gpu-1", "GPU-KRN-002", "GPU-APT-001"), clear) or "")
    why = blocker(harden, audit_of("gpu-1", "GPU-KRN-002"), events("wait", "Scheduled Event Redeploy ... pending"))
    assert why == "Azure Scheduled Events: wait: Scheduled Event Redeploy ... pending"
    assert "escalate" in (blocker(harden, audit_of("gpu-1"), events("escalate", "due")) or "")
    assert "were not read" in (blocker(harden, audit_of("gpu-1"), None) or "")
    assert blocker(harden, audit_of("gpu-1"), None, events_checked=False) is None  # imds_endpoint "": not on Azure


def test_a_hardware_finding_that_arose_after_the_plan_blocks_the_host() -> None:
    harden = [decision("GPU-KRN-002")]
    now = audit_of("gpu-1", "GPU-KRN-002", "GPU-HW-001")  # a GPU fell off the bus while the run was busy elsewhere
    why = blocker(harden, now, events("clear"), planned=["GPU-KRN-002"])
    assert why is not None and why.startswith("new since the plan: GPU-HW-001 (") and "next run" in why
    assert blocker(harden, now, events("clear"), planned=["GPU-KRN-002", "GPU-HW-001"]) is None  # weighed by the plan
    assert blocker(harden, audit_of("gpu-1", "GPU-KRN-002", "GPU-KRN-003"), events("clear"),
                   planned=["GPU-KRN-002"]) is None  # a new harden finding is no reason to stop


def test_gpu_work_blocks_a_driver_restore_but_not_a_harden_run() -> None:
    busy = audit_of("gpu-1", "GPU-DRV-001", name="memory_full")  # NVML lists compute processes
    why = blocker([decision("GPU-DRV-001", Action.DRIVER_RESTORE)], busy, events("clear"))
    assert why is not None and why.startswith("protected GPU work running (GPU 0: pid")
    assert blocker([decision("GPU-KRN-002")], busy, events("clear")) is None


def test_the_gate() -> None:
    ok, why = gate({}, audit_of("gpu-1"), ["GPU-KRN-002"])
    assert ok is True and why.startswith("gate passed: GPU-KRN-002 gone, NVML answers")
    ok, why = gate({}, audit_of("gpu-1", "GPU-KRN-002"), ["GPU-KRN-002"])
    assert ok is False and why == "gate: GPU-KRN-002 still present after the action"
    driver = audit_of("gpu-1").facts
    assert driver is not None
    ok, why = gate({"nvidia_driver_expected_version": "1.2.3"}, audit_of("gpu-1"), ["GPU-DRV-001"])
    assert ok is False and why == f"gate: driver {driver.nvml.driver_version} loaded, 1.2.3 expected"
    ok, why = gate({}, HostAudit("gpu-1", Status.TIMED_OUT, None, (), "slow", 1.0), ["GPU-KRN-002"])
    assert ok is None and "could not probe" in why  # no verdict: ambiguous


def test_attempts_are_recorded_in_flight_then_settled_and_share_one_budget_slot() -> None:
    ds = [decision("GPU-KRN-002"), decision("GPU-KRN-003")]
    state, attempts = started(RemediateState("gpu"), "gpu-1", "boot-1", ds, NOW)
    assert len(state.attempts) == 2 and all(a.in_flight for a in state.attempts)
    done = settled(state, attempts, ok=True)
    assert all(a.ok and a.outcome is None for a in done.attempts)
    failed = settled(state, attempts[:1], ok=False, outcome=Outcome.PERMANENT)
    assert failed.attempts[0].outcome is Outcome.PERMANENT and failed.attempts[1].in_flight
    # one action on two findings is one attempt of the budget
    from remediation.remediate.guards import Budget

    assert Budget(3, 86400.0).used(sorted({a.at for a in done.attempts}), NOW) == 1


def test_page_due_once_per_host_finding_and_boot() -> None:
    assert page_due(None)  # first seen
    assert not page_due("escalate")  # an earlier run escalated (and paged) it
    assert page_due("auto")  # it was acted on before, now it escalates (dedupe, budget spent)
    assert page_due("escalate", gate_failed=True)


# --- the whole run, wired to stand-ins ----------------------------------------------------------------------------


class Fleet:
    """Hosts whose findings the stand-in flows change: harden clears GPU-KRN-*, unless ``stubborn``."""

    def __init__(self, findings: dict[str, list[str]], stubborn: tuple[str, ...] = ()) -> None:
        self.findings = findings
        self.stubborn = stubborn
        self.hardened: list[list[str]] = []
        self.pages: list[dict[str, Any]] = []
        self.events: dict[str, str] = {}
        self.load_fails: dict[str, str] = {}  # host -> the NVML error its GPU 0 shows under load
        self.loaded: list[list[str]] = []

    def audit(self, hosts: Any, options: Any, **kw: Any) -> AuditResult:
        audits = tuple(audit_of(h.name, *self.findings[h.name], boot=f"boot-{h.name}") for h in hosts)
        return AuditResult("gpu", "inv.yml", NOW, 1.0, audits)

    def harden(self, hosts: Any, inventory: Any, options: Any) -> Any:
        self.hardened.append([h.name for h in hosts])
        for h in hosts:
            if h.name not in self.stubborn:
                self.findings[h.name] = [i for i in self.findings[h.name] if not i.startswith("GPU-KRN")]
        return SimpleNamespace(plan=SimpleNamespace(blocked=[]))

    def read_events(self, hosts: Any, endpoint: str) -> Any:
        return {h.name: h.name for h in hosts}

    def send(self, url: str, payload: Any, token: Any = None) -> Any:
        self.pages.append(payload)
        return SimpleNamespace(delivered=True, status=200, error=None)

    def load(self, hosts: Any, mode: Any, seconds: float) -> Any:
        from remediation.remediate.loadgate import judge

        self.loaded.append([h.name for h in hosts])
        sample = {"t": 0.5, "util_gpu": 100, "error": None}
        docs = {h.name: {"tool": "lab", "seconds": seconds, "gpus": [{"index": 0, "samples": [
            {**sample, "util_gpu": None, "error": self.load_fails[h.name]} if h.name in self.load_fails else sample]}]}
            for h in hosts}
        return {name: judge(name, doc, mode) for name, doc in docs.items()}

    def ports(self) -> Ports:
        return Ports(self.audit, self.harden, None, self.read_events, self.send, clock=lambda: NOW,
                     hold=lambda *a, **kw: NoHold(), load=self.load)


def run(fleet: Fleet, tmp: Path, **cfg: Any) -> Any:
    import remediation.azure.scheduled_events as se

    hosts = [Host(n, "127.0.0.1", vars={}) for n in fleet.findings]
    settings = RemediateSettings(imds_endpoint="http://127.0.0.1:9/metadata/scheduledevents",
                                 webhook_url="http://127.0.0.1:9/hook", **cfg)
    real = se.decide_all
    se.decide_all = lambda read, **kw: {h: _decision(fleet.events.get(h, "clear")) for h in read}
    try:
        return act(hosts, "inv.yml", None, settings, fleet="gpu", state_dir=tmp,  # type: ignore[arg-type]
                   ports=fleet.ports())
    finally:
        se.decide_all = real


def _decision(value: Any) -> Any:
    return value if not isinstance(value, str) else events(value, "pending")


def _platform_event(host: str, event_id: str, started: bool = False) -> Any:
    from remediation.azure import scheduled_events as se

    status = "Started" if started else "Scheduled"
    event = se.ScheduledEvent(event_id, "Reboot", status, (host,), None if started else NOW, "Host OS update",
                              "Platform")
    return se.decide(se.HostEvents(host, se.EventsDocument(1, (event,)), None, False), now=NOW, vm_name=host)


def test_a_scheduled_event_due_now_leaves_the_host_to_the_platform_and_pages_once_per_event(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"], "gpu-2": ["GPU-KRN-002"]})
    fleet.events["gpu-2"] = _platform_event("gpu-2", "A1B2C3D4-0000-4000-8000-000000000001")
    first = run(fleet, tmp_path)
    assert fleet.hardened == [["gpu-1"]]  # gpu-2 is not touched
    o = first.outcomes["gpu-2"]
    assert o.status is HostStatus.ESCALATED and "AZ-SE-001" in o.why and "Reboot" in o.why
    (esc,) = first.escalations
    assert (esc.host, esc.finding, esc.page) == ("gpu-2", "AZ-SE-001", "sent")
    packet = json.loads(Path(esc.packet, "packet.json").read_text())
    assert any("the loop was to fix: GPU-KRN-002" in line for line in packet["finding"]["evidence"])
    assert packet["guest_health_report"]["file_with_azure"] is False  # the platform is already acting
    assert [p["alerts"][0]["labels"]["finding_id"] for p in fleet.pages] == ["AZ-SE-001"]

    again = run(fleet, tmp_path)  # the same event, the same boot: no second page
    assert [(e.finding, e.page[:12]) for e in again.escalations] == [("AZ-SE-001", "already page")]
    assert len(fleet.pages) == 1 and again.outcomes["gpu-2"].status is HostStatus.ESCALATED

    fleet.events["gpu-2"] = _platform_event("gpu-2", "A1B2C3D4-0000-4000-8000-000000000002", started=True)
    third = run(fleet, tmp_path)  # another event in the same boot: a new page, another dedupe key
    assert [e.page for e in third.escalations] == ["sent"] and len(fleet.pages) == 2
    assert third.escalations[0].key != first.escalations[0].key
    assert fleet.hardened == [["gpu-1"]]  # still never touched

    fleet.events.pop("gpu-2")  # the event is over: the loop fixes the host
    run(fleet, tmp_path)
    assert fleet.hardened == [["gpu-1"], ["gpu-2"]] and len(fleet.pages) == 2


def test_a_wait_verdict_blocks_without_a_page(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"]})
    fleet.events["gpu-1"] = "wait"
    result = run(fleet, tmp_path)
    assert result.outcomes["gpu-1"].status is HostStatus.BLOCKED and not result.escalations and not fleet.pages


def test_a_run_fixes_in_batches_escalates_pages_once_and_keeps_the_budget(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"], "gpu-2": ["GPU-KRN-003", "GPU-HW-003"], "gpu-3": ["GPU-KRN-002"],
                   "gpu-4": []})
    fleet.events["gpu-3"] = "wait"
    first = run(fleet, tmp_path)
    assert fleet.hardened == [["gpu-1"], ["gpu-2"]]  # cap 1: one host per batch; gpu-3 blocked by its event
    out = {h: o.status for h, o in first.outcomes.items()}
    assert out == {"gpu-1": HostStatus.FIXED, "gpu-2": HostStatus.FIXED, "gpu-3": HostStatus.BLOCKED,
                   "gpu-4": HostStatus.NOTHING}
    assert "Azure Scheduled Events: wait" in first.outcomes["gpu-3"].why
    (esc,) = first.escalations
    assert esc.finding == "GPU-HW-003" and esc.page == "sent" and Path(esc.packet, "packet.json").is_file()
    assert "GPU-HW-003" in (Path(esc.packet) / "incident.md").read_text()  # the incident report travels with it
    assert [p["alerts"][0]["labels"]["finding_id"] for p in fleet.pages] == ["GPU-HW-003"]
    assert first.exit_code == 1
    state = load(state_path(tmp_path, "gpu"), "gpu")
    assert sorted((a.host, a.finding, a.ok) for a in state.attempts) == [
        ("gpu-1", "GPU-KRN-002", True), ("gpu-2", "GPU-KRN-003", True)]

    second = run(fleet, tmp_path)
    assert second.escalations[0].page.startswith("already paged") and len(fleet.pages) == 1
    assert second.outcomes["gpu-1"].status is HostStatus.NOTHING


def test_a_failed_gate_halts_the_loop_records_a_permanent_failure_and_escalates(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"], "gpu-2": ["GPU-KRN-002"]}, stubborn=("gpu-1",))
    result = run(fleet, tmp_path)
    assert fleet.hardened == [["gpu-1"]]  # gpu-2's batch never ran
    assert result.outcomes["gpu-1"].status is HostStatus.FAILED and result.outcomes["gpu-1"].attempt == "permanent"
    assert result.outcomes["gpu-2"].status is HostStatus.NOT_STARTED and result.halted
    assert [(e.host, e.finding, e.page) for e in result.escalations] == [("gpu-1", "GPU-KRN-002", "sent")]
    # the next run: dedupe escalates it (same boot), without a second page; the budget is not spent on it again
    again = run(fleet, tmp_path)
    assert [e.page[:12] for e in again.escalations if e.host == "gpu-1"] == ["already page"]
    assert len(fleet.pages) == 1 and fleet.hardened == [["gpu-1"], ["gpu-2"]]


def test_the_budget_holds_across_runs(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"]})
    for _ in range(2):  # each run fixes it; it comes back in a new boot each time
        fleet.findings["gpu-1"] = ["GPU-KRN-002"]
        result = run(fleet, tmp_path, attempts=1)
        fleet.audit = _new_boot(fleet.audit)
    assert [o.status for o in (result.outcomes["gpu-1"],)] == [HostStatus.ESCALATED]
    assert "attempt budget spent" in result.escalations[0].why and len(fleet.hardened) == 1


def _new_boot(audit: Any) -> Any:
    def audit2(hosts: Any, options: Any, **kw: Any) -> AuditResult:
        r = audit(hosts, options, **kw)
        return AuditResult(r.fleet, r.inventory, r.started_at, r.seconds, tuple(
            HostAudit(h.host, h.status, facts("healthy", h.host, "boot-2"), h.findings, None, 1.0) for h in r.hosts))
    return audit2


def test_the_evidence_is_written_before_a_restore_that_may_reboot(tmp_path: Path) -> None:
    """GPU-DRV-001 with the reboot allowed: a packet (facts, kernel log, the incident report) exists before the
    restore is called, is not paged, and the host's outcome names it; a harden run (no reboot) writes none."""
    fleet = Fleet({"gpu-1": ["GPU-DRV-001"], "gpu-2": ["GPU-KRN-002"]})
    seen_at_restore: list[list[str]] = []

    def restore(hosts: Any, inventory: Any, options: Any, opts: Any, **kw: Any) -> Any:
        from remediation.restore.flow import HostStatus as RS

        evidence = tmp_path / "remediate" / "evidence" / "gpu"
        seen_at_restore.append(sorted(p.name for p in evidence.iterdir()) if evidence.is_dir() else [])
        assert opts.allow_reboot
        for h in hosts:
            fleet.findings[h.name] = []
        return SimpleNamespace(outcome=lambda n: SimpleNamespace(status=RS.RESTORED, where="", detail=""))

    ports = fleet.ports()
    ports.restore = restore
    hosts = [Host(n, "127.0.0.1", vars={}) for n in fleet.findings]
    settings = RemediateSettings(imds_endpoint="", webhook_url="http://127.0.0.1:9/hook", max_in_flight=2,
                                 max_in_flight_pct=100)
    result = act(hosts, "inv.yml", None, settings, fleet="gpu", state_dir=tmp_path,  # type: ignore[arg-type]
                 allow_reboot=True, ports=ports)
    assert result.outcomes["gpu-1"].status is HostStatus.FIXED, result.outcomes["gpu-1"]
    (names,) = seen_at_restore
    assert len(names) == 1 and names[0].startswith("gpu-1-GPU-DRV-001-")  # written before the restore ran
    packet = json.loads((Path(result.outcomes["gpu-1"].evidence) / "packet.json").read_text())
    assert packet["finding"]["id"] == "GPU-DRV-001" and packet["evidence"] is not None
    assert packet["incident_report"] and "GPU-DRV-001" in packet["incident_report"]
    assert "not an escalation" in packet["purpose"]
    assert result.outcomes["gpu-2"].evidence == "" and not fleet.pages  # nothing paged for a fix
