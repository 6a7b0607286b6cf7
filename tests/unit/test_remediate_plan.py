"""The closed loop's plan (remediation.remediate.plan): one decision per host and finding, every rule in its order,
with the budget and cap arithmetic; and the state an acting run would save from it."""

from __future__ import annotations

import datetime as _dt
import json

from remediation.core.findings import Finding, make_finding
from remediation.remediate.guards import Breaker, Budget, Guards, InFlightCap, Observation, Outcome
from remediation.remediate.plan import HostInput, Plan, Verdict, make_plan, state_after
from remediation.remediate.policy import Action, FleetPolicy, parse_policy
from remediation.remediate.state import Attempt, RemediateState, Trip

NOW = _dt.datetime(2025, 6, 4, 12, 0, tzinfo=_dt.UTC)  # a Wednesday
H = _dt.timedelta(hours=1)
GUARDS = Guards(InFlightCap(10, 100.0), Breaker(50.0, 3600.0, 2), Budget(3, 24 * 3600.0), finding_ttl_s=3600.0)
POLICY = FleetPolicy("gpu")


def f(finding_id: str, host: str = "gpu-1") -> Finding:
    return make_finding(finding_id, f"{finding_id} on {host}", [f"evidence of {finding_id}"], host=host)


def host(name: str, *ids: str, boot: str = "boot-1", age_s: float = 60, groups: tuple[str, ...] = (),
         now: _dt.datetime = NOW) -> HostInput:
    """A probed host with findings ``ids``, collected ``age_s`` seconds before ``now``."""
    return HostInput(name, tuple(f(i, name) for i in ids), boot, now - _dt.timedelta(seconds=age_s), groups)


def healthy(n: int) -> list[HostInput]:
    return [host(f"ok-{i}") for i in range(n)]


def plan(hosts: list[HostInput], policy: FleetPolicy = POLICY, state: RemediateState | None = None,
         guards: Guards = GUARDS, allow_reboot: bool = False, now: _dt.datetime = NOW) -> Plan:
    return make_plan(hosts, policy, state or RemediateState("gpu"), now, guards, allow_reboot)


def one(p: Plan, host_name: str, finding: str) -> tuple[Verdict, str]:
    d = next(d for h in p.hosts if h.host == host_name for d in h.decisions if d.finding == finding)
    return d.verdict, d.why


def test_harden_findings_are_auto_and_share_one_attempt() -> None:
    p = plan([host("gpu-1", "GPU-KRN-002", "GPU-KRN-003", "GPU-KRN-004"), *healthy(3)])
    verdicts = [(d.finding, d.verdict, d.action) for d in p.hosts[0].decisions]
    assert verdicts == [("GPU-KRN-002", Verdict.AUTO, Action.HARDEN), ("GPU-KRN-003", Verdict.AUTO, Action.HARDEN),
                        ("GPU-KRN-004", Verdict.AUTO, Action.HARDEN)]
    assert "attempt 1 of 3, 2 left after it" in p.hosts[0].decisions[0].why
    assert p.hosts[0].decisions[1].why == "with GPU-KRN-002: the same harden run, one attempt"
    assert [h.decisions for h in p.hosts[1:]] == [(), (), ()]


def test_driver_not_loaded_is_auto_only_inside_a_window_or_with_allow_reboot() -> None:
    hosts = [host("gpu-1", "GPU-DRV-001"), *healthy(3)]
    verdict, why = one(plan(hosts), "gpu-1", "GPU-DRV-001")
    assert verdict is Verdict.BLOCKED
    assert "driver-restore reboots: allowed only inside a maintenance window or with --allow-reboot" in why
    assert "the policy has no maintenance window" in why
    verdict, why = one(plan(hosts, allow_reboot=True), "gpu-1", "GPU-DRV-001")
    assert verdict is Verdict.AUTO and "reboot with --allow-reboot" in why
    windowed = parse_policy({"gpu": {"windows": [{"days": ["wed"], "start": "11:00", "end": "13:00"}]}}, "gpu")
    verdict, why = one(plan(hosts, windowed), "gpu-1", "GPU-DRV-001")
    assert verdict is Verdict.AUTO and "reboot in window wed 11:00-13:00 UTC" in why
    later = [host("gpu-1", "GPU-DRV-001", now=NOW + 2 * H), *healthy(3)]
    verdict, why = one(plan(later, windowed, now=NOW + 2 * H), "gpu-1", "GPU-DRV-001")
    assert verdict is Verdict.BLOCKED and "next window 2025-06-11T11:00+00:00" in why


def test_hardware_findings_escalate_whatever_the_level_but_observe() -> None:
    hosts = [host("gpu-1", "GPU-HW-001", "GPU-HW-003", "GPU-HW-004", "GPU-HW-002", "GPU-HW-005"), *healthy(9)]
    p = plan(hosts, allow_reboot=True)
    assert {d.verdict for d in p.hosts[0].decisions} == {Verdict.ESCALATE}
    assert all(d.action is Action.ESCALATE and "never fixed automatically" in d.why for d in p.hosts[0].decisions)
    quiet = parse_policy({"gpu": {"levels": {"GPU-HW-005": "observe"}}}, "gpu")
    assert one(plan(hosts, quiet), "gpu-1", "GPU-HW-005")[0] is Verdict.OBSERVE


def test_levels_observe_and_propose() -> None:
    policy = parse_policy({"gpu": {"levels": {"GPU-KRN-002": "propose", "GPU-KRN-003": "observe"}}}, "gpu")
    p = plan([host("gpu-1", "GPU-KRN-002", "GPU-KRN-003", "GPU-THM-001", "GPU-KRN-006"), *healthy(3)], policy)
    assert one(p, "gpu-1", "GPU-KRN-002") == (Verdict.PROPOSE, "level propose (policy gpu): a person runs harden "
                                                               "(invoke harden)")
    assert one(p, "gpu-1", "GPU-KRN-003")[0] is Verdict.OBSERVE
    verdict, why = one(p, "gpu-1", "GPU-THM-001")
    assert verdict is Verdict.PROPOSE and "lower sustained load" in why  # no task: the catalog's remedy
    assert one(p, "gpu-1", "GPU-KRN-006")[0] is Verdict.OBSERVE  # info findings are observed by default


def test_a_group_override_applies_to_its_hosts_only() -> None:
    policy = parse_policy({"gpu": {"groups": {"canary": {"levels": {"GPU-KRN-002": "propose"}}}}}, "gpu")
    p = plan([host("gpu-1", "GPU-KRN-002", groups=("gpu", "canary")), host("gpu-2", "GPU-KRN-002", groups=("gpu",)),
              *healthy(2)], policy)
    assert one(p, "gpu-1", "GPU-KRN-002")[0] is Verdict.PROPOSE
    assert one(p, "gpu-2", "GPU-KRN-002")[0] is Verdict.AUTO


def test_stale_findings_are_ignored() -> None:
    p = plan([host("gpu-1", "GPU-KRN-002", "GPU-HW-001", age_s=3601), *healthy(3)])
    assert {d.verdict for d in p.hosts[0].decisions} == {Verdict.OBSERVE}
    assert all(d.stale and "ignored: stale (collected 3601 s ago, TTL 3600 s)" in d.why for d in p.hosts[0].decisions)
    assert p.observation.unhealthy == ()  # a stale critical finding does not feed the breaker either
    fresh = plan([host("gpu-1", "GPU-KRN-002", age_s=3600), *healthy(3)])
    assert one(fresh, "gpu-1", "GPU-KRN-002")[0] is Verdict.AUTO
    unknown = plan([HostInput("gpu-1", (f("GPU-KRN-002"),), "b", None), *healthy(3)])
    assert "collected at an unknown time" in one(unknown, "gpu-1", "GPU-KRN-002")[1]


def test_a_host_not_probed_is_blocked_with_its_reason() -> None:
    p = plan([HostInput("gpu-1", probed=False, status="unreachable", error="connection refused"), *healthy(3)])
    assert one(p, "gpu-1", "-") == (Verdict.BLOCKED, "not probed (unreachable: connection refused): nothing is "
                                                     "decided without a fresh probe")


def test_dedupe_on_host_finding_and_boot_id() -> None:
    state = RemediateState("gpu", attempts=(
        Attempt("gpu-1", "GPU-DRV-001", "boot-1", "driver-restore", NOW - H, Outcome.PERMANENT, False),
    ))
    hosts = [host("gpu-1", "GPU-DRV-001", boot="boot-1"), *healthy(3)]
    verdict, why = one(plan(hosts, state=state, allow_reboot=True), "gpu-1", "GPU-DRV-001")
    assert verdict is Verdict.ESCALATE
    assert "dedupe: driver-restore already ran for this finding in this boot (boot-1)" in why
    assert "outcome permanent: not retried" in why
    # a new boot is a new key: tried again, within the budget
    rebooted = [host("gpu-1", "GPU-DRV-001", boot="boot-2"), *healthy(3)]
    verdict, why = one(plan(rebooted, state=state, allow_reboot=True), "gpu-1", "GPU-DRV-001")
    assert verdict is Verdict.AUTO and "attempt 2 of 3, 1 left after it" in why
    # a transient failure in the same boot is retried
    transient = RemediateState("gpu", attempts=(
        Attempt("gpu-1", "GPU-DRV-001", "boot-1", "driver-restore", NOW - H, Outcome.TRANSIENT, False),
    ))
    assert one(plan(hosts, state=transient, allow_reboot=True), "gpu-1", "GPU-DRV-001")[0] is Verdict.AUTO
    # a fix that "worked" but the finding is back in the same boot: not retried
    held = RemediateState("gpu", attempts=(
        Attempt("gpu-1", "GPU-KRN-002", "boot-1", "harden", NOW - H, ok=True),
    ))
    verdict, why = one(plan([host("gpu-1", "GPU-KRN-002"), *healthy(3)], state=held), "gpu-1", "GPU-KRN-002")
    assert verdict is Verdict.ESCALATE and "reported success but the finding is back" in why


def test_an_attempt_without_a_verdict_is_ambiguous_and_holds_the_host() -> None:
    state = RemediateState("gpu", attempts=(Attempt("gpu-1", "GPU-DRV-001", "boot-1", "driver-restore", NOW - H),))
    p = plan([host("gpu-1", "GPU-DRV-001", "GPU-KRN-002"), *healthy(3)], state=state, allow_reboot=True)
    assert one(p, "gpu-1", "GPU-DRV-001")[0] is Verdict.ESCALATE
    assert "no verdict recorded: ambiguous" in one(p, "gpu-1", "GPU-DRV-001")[1]
    assert one(p, "gpu-1", "GPU-KRN-002") == (Verdict.BLOCKED, "an action of an earlier run on this host has no "
                                                               "verdict yet: nothing more until it has one")
    assert p.in_flight_before == ("gpu-1",)


def test_the_budget_escalates_when_spent_and_shows_when_it_frees() -> None:
    attempts = tuple(Attempt("gpu-1", "GPU-KRN-002", f"b{i}", "harden", NOW - (i + 1) * H, ok=True) for i in range(3))
    state = RemediateState("gpu", attempts=attempts)
    p = plan([host("gpu-1", "GPU-KRN-002", boot="b9"), *healthy(3)], state=state)
    verdict, why = one(p, "gpu-1", "GPU-KRN-002")
    assert verdict is Verdict.ESCALATE
    assert why == ("attempt budget spent: 3 of 3 attempts used in 24 h, 0 left; the next attempt frees at "
                   "2025-06-05T09:00:00+00:00")
    assert (p.hosts[0].attempts_used, p.hosts[0].attempts_left) == (3, 0)
    # one attempt left, two different actions on the host: the worst finding gets it
    state2 = RemediateState("gpu", attempts=attempts[:2])
    p2 = plan([host("gpu-1", "GPU-KRN-002", "GPU-DRV-001", boot="b9"), *healthy(3)], state=state2, allow_reboot=True)
    assert one(p2, "gpu-1", "GPU-DRV-001")[0] is Verdict.AUTO
    verdict, why = one(p2, "gpu-1", "GPU-KRN-002")
    assert verdict is Verdict.ESCALATE and "(and this run)" in why


def test_the_in_flight_cap_blocks_the_hosts_past_it() -> None:
    guards = Guards(InFlightCap(2, 50.0), GUARDS.breaker, GUARDS.budget, 3600.0)
    hosts = [host(f"gpu-{i}", "GPU-KRN-002") for i in range(1, 4)] + healthy(7)
    p = plan(hosts, guards=guards)
    assert [one(p, f"gpu-{i}", "GPU-KRN-002")[0] for i in range(1, 4)] == [Verdict.AUTO, Verdict.AUTO,
                                                                            Verdict.BLOCKED]
    assert "in-flight cap reached (2 hosts, cap 2 = min(2 hosts, 50% of 10 hosts = 5))" in one(p, "gpu-3",
                                                                                               "GPU-KRN-002")[1]
    assert p.in_flight_cap == 2 and p.in_flight.startswith("2 of 10 hosts in flight (0 from earlier runs)")
    # a part of the fleet (--limit): the cap and the breaker count the whole fleet
    part = make_plan(hosts[:3], POLICY, RemediateState("gpu"), NOW, guards, fleet_size=10)
    assert part.in_flight_cap == 2 and part.observation.fleet_size == 10
    assert make_plan(hosts[:3], POLICY, RemediateState("gpu"), NOW, guards).in_flight_cap == 1


def test_the_breaker_trips_blocks_auto_and_stays_tripped_across_runs() -> None:
    # 3 of 4 hosts with a critical finding: trips in this run
    hosts = [host("gpu-1", "GPU-DRV-001", "GPU-KRN-002"), host("gpu-2", "GPU-HW-001"), host("gpu-3", "GPU-DRV-001"),
             host("gpu-4")]
    p = plan(hosts, allow_reboot=True)
    assert p.breaker.tripped and p.breaker_open and p.breaker.unhealthy == ("gpu-1", "gpu-2", "gpu-3")
    verdict, why = one(p, "gpu-1", "GPU-KRN-002")
    assert (verdict, why) == (Verdict.BLOCKED, "circuit breaker trips in this run; a person resets it: invoke "
                                               "remediate.reset --fleet gpu")
    assert p.breaker.why.startswith("3 of 4 hosts unhealthy (75%) within 3600 s")
    assert one(p, "gpu-2", "GPU-HW-001")[0] is Verdict.ESCALATE  # escalations still go out
    # the next run sees a healthy fleet: still tripped, from the state
    saved = state_after(p, RemediateState("gpu"))
    assert saved.breaker is not None and saved.breaker.unhealthy == ("gpu-1", "gpu-2", "gpu-3")
    next_run = [host("gpu-1", "GPU-KRN-002", now=NOW + 3 * H), *healthy(3)]
    later = plan(next_run, state=saved, now=NOW + 3 * H)
    verdict, why = one(later, "gpu-1", "GPU-KRN-002")
    assert verdict is Verdict.BLOCKED and why.startswith("circuit breaker tripped at 2025-06-04T12:00:00+00:00; a")
    assert not later.breaker.tripped and later.breaker_open
    # a person resets it: the loop acts again
    assert one(plan(next_run, state=saved.reset(), now=NOW + 3 * H), "gpu-1", "GPU-KRN-002")[0] is Verdict.AUTO


def test_the_breaker_reads_earlier_runs_within_its_window() -> None:
    state = RemediateState("gpu", observations=(Observation(NOW - 0.5 * H, 4, ("gpu-3", "gpu-4")),))
    p = plan([host("gpu-1", "GPU-DRV-001"), host("gpu-2", "GPU-KRN-002"), host("gpu-3"), host("gpu-4")],
             state=state, allow_reboot=True)
    assert p.breaker.tripped and one(p, "gpu-2", "GPU-KRN-002")[0] is Verdict.BLOCKED
    old = RemediateState("gpu", observations=(Observation(NOW - 2 * H, 4, ("gpu-3", "gpu-4")),))
    assert not plan([host("gpu-1", "GPU-DRV-001"), host("gpu-2", "GPU-KRN-002"), host("gpu-3"), host("gpu-4")],
                    state=old).breaker.tripped


def test_a_dpkg_lock_blocks_auto_as_transient() -> None:
    p = plan([host("gpu-1", "GPU-KRN-002", "GPU-APT-001"), *healthy(3)])
    assert one(p, "gpu-1", "GPU-KRN-002") == (Verdict.BLOCKED, "dpkg lock held (GPU-APT-001): transient, the next "
                                                               "run retries")


def test_the_document_has_per_host_findings_decision_why_and_action() -> None:
    p = plan([host("gpu-1", "GPU-KRN-002", "GPU-HW-001"), HostInput("gpu-2", probed=False, status="unreachable"),
              *healthy(2)])
    doc = json.loads(json.dumps(p.to_dict()))
    assert doc["schema"] == "gpufleet.remediate-plan/1" and doc["fleet"] == "gpu"
    assert doc["summary"] == {"auto": 1, "propose": 0, "escalate": 1, "blocked": 1, "observe": 0}
    first = doc["hosts"][0]
    assert first["host"] == "gpu-1" and first["boot_id"] == "boot-1"
    assert first["attempts"] == {"used": 0, "left": 3, "text": "0 of 3 attempts used in 24 h, 3 left"}
    rows = {r["finding"]: r for r in first["findings"]}
    assert rows["GPU-HW-001"]["decision"] == "escalate" and rows["GPU-HW-001"]["action"] == "escalate"
    assert rows["GPU-KRN-002"]["decision"] == "auto" and rows["GPU-KRN-002"]["action"] == "harden"
    assert rows["GPU-KRN-002"]["level"] == "auto" and rows["GPU-KRN-002"]["level_from"] == "default"
    assert doc["hosts"][1]["findings"][0]["decision"] == "blocked"
    assert doc["guards"]["in_flight"]["cap"] == 4 and doc["guards"]["breaker"]["tripped"] is False


def test_state_after_records_seen_findings_keeping_first_seen_and_no_stale_ones() -> None:
    p1 = plan([host("gpu-1", "GPU-HW-001"), host("gpu-2", "GPU-KRN-002", age_s=7200), *healthy(2)])
    s1 = state_after(p1, RemediateState("gpu"))
    assert [(s.host, s.finding, s.boot_id, s.decision) for s in s1.seen] == [("gpu-1", "GPU-HW-001", "boot-1",
                                                                              "escalate")]
    assert s1.observations == (p1.observation,) and s1.breaker is None
    p2 = plan([host("gpu-1", "GPU-HW-001", now=NOW + H), *healthy(3)], state=s1, now=NOW + H)
    assert p2.hosts[0].decisions[0].new is False and "escalated before" in p2.hosts[0].decisions[0].why
    s2 = state_after(p2, s1)
    assert s2.seen[0].first_seen == NOW and s2.seen[0].last_seen == NOW + H
    assert s2.breaker is None and len(s2.observations) == 2


def test_a_recorded_trip_is_not_replaced() -> None:
    state = RemediateState("gpu", breaker=Trip(NOW - H, "first", ("x", "y")))
    hosts = [host(f"gpu-{i}", "GPU-DRV-001") for i in range(4)]
    assert state_after(plan(hosts, state=state), state).breaker == state.breaker


def test_the_table_shows_decisions_guards_and_a_tripped_breaker() -> None:
    from rich.console import Console

    from remediation.report.remediate_view import print_plan

    state = RemediateState("gpu", breaker=Trip(NOW - H, "3 of 4 hosts unhealthy", ("a", "b", "c")))
    console = Console(record=True, width=200)
    print_plan(console, plan([host("gpu-1", "GPU-KRN-002"), HostInput("gpu-2", probed=False, status="unreachable"),
                              host("gpu-3")], state=state))
    text = console.export_text()
    assert "remediate plan, fleet gpu (--check: nothing changes)" in text
    assert "circuit breaker tripped at 2025-06-04T11:00:00+00:00; a person resets it" in text
    assert "not probed (unreachable: no answer)" in text and "nothing to do" in text
    assert "decisions: 0 auto, 0 propose, 0 escalate, 2 blocked, 0 observe" in text
    assert "circuit breaker: TRIPPED at 2025-06-04T11:00:00+00:00" in text
    assert "nothing was changed and the state was not written" in text
