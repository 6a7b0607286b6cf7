"""The loop's plan: the fleet's findings, the policy, the state, the guards and the clock -> one decision per host and
finding, with why, the action, and the arithmetic of the budget and the caps (pure: nothing here reads or writes).

Decisions (:class:`Verdict`): ``auto`` (the loop runs the action), ``propose`` (a person runs it), ``escalate`` (a
person must look: hardware, or a fix that did not hold), ``blocked`` (the loop would act, a guard says not now),
``observe`` (noted only). Per finding, first match wins:

1. host not probed -> ``blocked``: nothing is decided without a fresh probe (one row for the host);
2. the finding is older than the TTL (``finding_ttl_s``, from the probe's collection time) -> ``observe``: ignored;
3. level ``observe`` -> ``observe``;
4. a hardware finding (GPU-HW-*) -> ``escalate``;
5. level ``propose`` -> ``propose`` (the action and the catalog's remedy);
6. level ``auto``, in this order: the circuit breaker tripped (before or by this run) -> ``blocked``; the dpkg lock held
   (GPU-APT-001) -> ``blocked``; an attempt on the same (host, finding ID, boot id) whose outcome is not transient
   -> ``escalate``, not retried (dedupe); the host's attempt budget spent -> ``escalate``; a reboot with no
   maintenance window open and no ``--allow-reboot`` -> ``blocked``; the in-flight cap reached -> ``blocked``;
   else ``auto``.

Findings with the same action on one host share one attempt (harden fixes GPU-KRN-002/003/004 in one run). The
breaker counts a host as unhealthy when it has a fresh critical finding.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from remediation.core.findings import Finding, Severity
from remediation.remediate.guards import BreakerVerdict, Guards, Observation
from remediation.remediate.policy import Action, FleetPolicy, Level, action_for, is_hardware
from remediation.remediate.state import RemediateState, Seen, Trip
from remediation.remediate.windows import any_open

if TYPE_CHECKING:
    from remediation.host.audit import AuditResult

__all__ = ["Decision", "HostInput", "HostPlan", "Plan", "Verdict", "inputs_from_audit", "make_plan", "state_after"]

SCHEMA = "gpufleet.remediate-plan/1"


class Verdict(StrEnum):
    AUTO = "auto"
    PROPOSE = "propose"
    ESCALATE = "escalate"
    BLOCKED = "blocked"
    OBSERVE = "observe"


@dataclass(frozen=True)
class HostInput:
    """One host as the plan needs it: its findings, boot id, when they were collected, and its inventory groups."""

    host: str
    findings: tuple[Finding, ...] = ()
    boot_id: str | None = None
    observed_at: _dt.datetime | None = None
    groups: tuple[str, ...] = ()
    probed: bool = True
    status: str = "ok"
    error: str | None = None


def inputs_from_audit(audit: AuditResult) -> tuple[HostInput, ...]:
    """The plan's input from an audit: the findings, the boot id and the collection time from the probe's facts (the
    audit's start when the probe did not say), the groups from the inventory (Ansible's ``group_names``)."""
    out = []
    for h in audit.hosts:
        groups = h.vars.get("group_names") or ()
        groups = tuple(str(g) for g in groups) if isinstance(groups, list | tuple) else ()
        if h.facts is None:
            out.append(HostInput(h.host, (), None, None, groups, False, h.status.value, h.error))
            continue
        observed = h.facts.collected_at or audit.started_at
        if observed.tzinfo is None:
            observed = observed.replace(tzinfo=_dt.UTC)
        out.append(HostInput(h.host, h.findings, h.facts.system.boot_id, observed, groups))
    return tuple(out)


@dataclass(frozen=True)
class Decision:
    host: str
    finding: str  # a finding ID, or "-" for a host-level row
    verdict: Verdict
    why: str
    action: Action | None = None
    reboot: bool = False
    level: Level | None = None
    level_from: str = ""
    severity: str = ""
    summary: str = ""
    remedy: str = ""
    new: bool = True  # first decided on for this (host, finding ID, boot id)
    stale: bool = False  # ignored: older than the TTL

    def to_dict(self) -> dict[str, Any]:
        return {
            "finding": self.finding,
            "severity": self.severity or None,
            "summary": self.summary or None,
            "decision": self.verdict.value,
            "why": self.why,
            "action": self.action.value if self.action else None,
            "reboot": self.reboot,
            "level": self.level.value if self.level else None,
            "level_from": self.level_from or None,
            "remedy": self.remedy or None,
            "new": self.new,
            "stale": self.stale,
        }


@dataclass(frozen=True)
class HostPlan:
    host: str
    boot_id: str | None
    probed: bool
    decisions: tuple[Decision, ...]
    budget: str  # the attempt budget's arithmetic
    attempts_used: int
    attempts_left: int
    windows: tuple[str, ...] = ()

    @property
    def auto(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.verdict is Verdict.AUTO)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "boot_id": self.boot_id,
            "probed": self.probed,
            "attempts": {"used": self.attempts_used, "left": self.attempts_left, "text": self.budget},
            "windows": list(self.windows),
            "findings": [d.to_dict() for d in self.decisions],
        }


@dataclass(frozen=True)
class Plan:
    fleet: str
    at: _dt.datetime
    hosts: tuple[HostPlan, ...]
    in_flight: str  # the in-flight cap's arithmetic
    in_flight_cap: int
    in_flight_before: tuple[str, ...]  # hosts with an action of an earlier run and no verdict yet
    breaker: BreakerVerdict
    breaker_tripped_at: _dt.datetime | None  # a trip recorded by an earlier run
    observation: Observation  # what this run saw (the breaker's input, for the state)
    allow_reboot: bool
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return tuple(d for h in self.hosts for d in h.decisions)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for d in self.decisions if d.verdict is verdict)

    @property
    def breaker_open(self) -> bool:
        """The breaker is tripped: by an earlier run, or by what this run saw."""
        return self.breaker_tripped_at is not None or self.breaker.tripped

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "fleet": self.fleet,
            "at": self.at.isoformat(),
            "allow_reboot": self.allow_reboot,
            "summary": {v.value: self.count(v) for v in Verdict},
            "guards": {
                "in_flight": {"cap": self.in_flight_cap, "before": list(self.in_flight_before),
                              "text": self.in_flight},
                "breaker": {
                    "tripped": self.breaker_open,
                    "tripped_at": self.breaker_tripped_at.isoformat() if self.breaker_tripped_at else None,
                    "trips_now": self.breaker.tripped and self.breaker_tripped_at is None,
                    "share_pct": round(self.breaker.share_pct, 1),
                    "unhealthy": list(self.breaker.unhealthy),
                    "text": self.breaker.why,
                },
                **dict(self.settings),
            },
            "hosts": [h.to_dict() for h in self.hosts],
        }


def _fresh(h: HostInput, now: _dt.datetime, ttl_s: float) -> bool:
    return h.observed_at is not None and (now - h.observed_at).total_seconds() <= ttl_s


def _order(findings: Iterable[Finding]) -> list[Finding]:
    """Critical first, then by ID: the budget goes to the worst finding first."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.id))


def make_plan(
    hosts: Sequence[HostInput],
    policy: FleetPolicy,
    state: RemediateState,
    now: _dt.datetime,
    guards: Guards,
    allow_reboot: bool = False,
    fleet_size: int | None = None,
) -> Plan:
    """One :class:`Decision` per (host, finding); see the module's docstring for the rules, in their order.

    ``fleet_size``: the whole fleet's hosts when ``hosts`` is a part of it (``--limit``), for the in-flight cap and the
    breaker's share; default ``len(hosts)``."""
    ttl = guards.finding_ttl_s
    unhealthy = tuple(h.host for h in hosts if h.probed and _fresh(h, now, ttl)
                      and any(f.severity is Severity.CRITICAL for f in h.findings))
    size = max(len(hosts), fleet_size or 0)
    observation = Observation(now, size, unhealthy)
    verdict = guards.breaker.evaluate((*state.observations, observation), now)
    tripped_at = state.breaker.at if state.breaker is not None else None
    breaker_why = (f"circuit breaker tripped at {tripped_at.isoformat(timespec='seconds')}"
                   if tripped_at is not None else "circuit breaker trips in this run" if verdict.tripped else "")
    reset = f"; a person resets it: invoke remediate.reset --fleet {policy.fleet}"

    cap = guards.in_flight.limit(size)
    budget_since = now - _dt.timedelta(seconds=guards.budget.window_s)
    before = tuple(sorted({a.host for a in state.attempts if a.in_flight and a.at > budget_since}))
    in_flight: set[str] = set(before)

    plans = []
    for h in hosts:
        times = sorted({a.at for a in state.attempts_on(h.host)})  # one action on several findings: one attempt
        used, left = guards.budget.used(times, now), guards.budget.left(times, now)
        windows = policy.windows_for(h.groups)
        if not h.probed:
            row = Decision(h.host, "-", Verdict.BLOCKED,
                           f"not probed ({h.status}: {h.error or 'no answer'}): nothing is decided without a fresh "
                           "probe")
            plans.append(HostPlan(h.host, None, False, (row,), guards.budget.describe(times, now), used, left,
                                  tuple(w.describe() for w in windows)))
            continue
        fresh = _fresh(h, now, ttl)
        dpkg_lock = next((f for f in h.findings if f.id == "GPU-APT-001"), None)
        actions_run: dict[Action, str] = {}  # action -> the finding whose attempt it is, in this run
        rows = []
        for f in _order(h.findings):
            spec = action_for(f.id)
            level, level_from = policy.level(f.id, h.groups)
            seen = state.seen_as(h.host, f.id, h.boot_id)
            base: dict[str, Any] = {"action": spec.action, "reboot": spec.reboot, "level": level,
                                    "level_from": level_from, "severity": f.severity.value, "summary": f.summary,
                                    "remedy": f.remedy, "new": seen is None}

            def decide(verdict: Verdict, why: str, base: dict[str, Any] = base, f: Finding = f,
                       host: str = h.host) -> Decision:
                return Decision(host, f.id, verdict, why, **base)

            if not fresh:
                age = ("at an unknown time" if h.observed_at is None
                       else f"{(now - h.observed_at).total_seconds():.0f} s ago")
                rows.append(replace(decide(Verdict.OBSERVE, f"ignored: stale (collected {age}, TTL {ttl:g} s); "
                                                            "a fresh audit decides"), stale=True))
                continue
            if level is Level.OBSERVE:
                rows.append(decide(Verdict.OBSERVE, f"level observe ({level_from}): noted, nothing done"))
                continue
            if is_hardware(f.id):
                again = "" if seen is None else (f" (escalated before, first seen "
                                                 f"{seen.first_seen.isoformat(timespec='seconds')}, same boot)")
                rows.append(decide(Verdict.ESCALATE, "hardware fault: never fixed automatically; drain, then redeploy "
                                                     f"the VM or open a support case with the evidence{again}"))
                continue
            if level is Level.PROPOSE:
                what = f"{spec.action.value}" + (f" ({spec.detail})" if spec.detail else "")
                if spec.action is Action.MANUAL:
                    what = f.remedy or "see the runbook"
                rows.append(decide(Verdict.PROPOSE, f"level propose ({level_from}): a person runs {what}"))
                continue
            # level auto
            if breaker_why:
                rows.append(decide(Verdict.BLOCKED, breaker_why + reset))
                continue
            if dpkg_lock is not None:
                rows.append(decide(Verdict.BLOCKED, "dpkg lock held (GPU-APT-001): transient, the next run retries"))
                continue
            last = state.attempt_for(h.host, f.id, h.boot_id)
            if last is not None and not (last.outcome is not None and last.outcome.retried):
                result = ("it reported success but the finding is back" if last.ok
                          else f"outcome {last.outcome}" if last.outcome is not None
                          else "no verdict recorded: ambiguous")
                rows.append(decide(Verdict.ESCALATE, f"dedupe: {last.action} already ran for this finding in this "
                                                     f"boot ({h.boot_id or 'boot id unknown'}) at "
                                                     f"{last.at.isoformat(timespec='seconds')}, {result}: not "
                                                     "retried"))
                continue
            if h.host in before:
                rows.append(decide(Verdict.BLOCKED, "an action of an earlier run on this host has no verdict yet: "
                                                    "nothing more until it has one"))
                continue
            if spec.action in actions_run:
                rows.append(decide(Verdict.AUTO, f"with {actions_run[spec.action]}: the same {spec.action.value} run, "
                                                 "one attempt"))
                continue
            left_now = left - len(actions_run)
            if left_now <= 0:
                free = guards.budget.next_free(times, now)
                when = f"; the next attempt frees at {free.isoformat(timespec='seconds')}" if free else ""
                rows.append(decide(Verdict.ESCALATE, f"attempt budget spent: {guards.budget.describe(times, now)}"
                                                     f"{' (and this run)' if actions_run else ''}{when}"))
                continue
            if spec.reboot and not allow_reboot:
                window = any_open(windows, now)
                if window is None:
                    nxt = min((w.next_start(now) for w in windows), default=None)
                    when = (f"; next window {nxt.isoformat(timespec='minutes')}" if nxt is not None
                            else "; the policy has no maintenance window")
                    rows.append(decide(Verdict.BLOCKED, f"{spec.action.value} reboots: allowed only inside a "
                                                        f"maintenance window or with --allow-reboot{when}"))
                    continue
            if h.host not in in_flight and len(in_flight) >= cap:
                rows.append(decide(Verdict.BLOCKED, f"in-flight cap reached ({len(in_flight)} hosts, "
                                                    f"{guards.in_flight.describe(size)}): a later batch or run"))
                continue
            in_flight.add(h.host)
            actions_run[spec.action] = f.id
            reboot = ""
            if spec.reboot:
                opened = any_open(windows, now)
                reboot = (" with --allow-reboot" if allow_reboot or opened is None
                          else f" in window {opened.describe()}")
                reboot = f"; reboot{reboot}"
            rows.append(decide(Verdict.AUTO, f"level auto ({level_from}): {spec.action.value}"
                                             f"{f' ({spec.detail})' if spec.detail else ''}{reboot}; attempt "
                                             f"{used + len(actions_run)} of {guards.budget.attempts}, "
                                             f"{left - len(actions_run)} left after it"))
        plans.append(HostPlan(h.host, h.boot_id, True, tuple(rows), guards.budget.describe(times, now), used, left,
                              tuple(w.describe() for w in windows)))

    settings = {
        "budget": {"attempts": guards.budget.attempts, "window_h": guards.budget.window_s / 3600},
        "finding_ttl_s": ttl,
        "windows": [w.describe() for w in policy.windows],
    }
    return Plan(policy.fleet, now, tuple(plans),
                f"{len(in_flight)} of {size} hosts in flight ({len(before)} from earlier runs); "
                f"{guards.in_flight.describe(size)}",
                cap, before, verdict, tripped_at, observation, allow_reboot, settings)


def state_after(plan: Plan, state: RemediateState) -> RemediateState:
    """The state an acting run saves after deciding: this run's observation, the breaker's trip when it tripped now,
    and every decided finding recorded as seen (first seen kept). ``--check`` saves nothing."""
    new = state.with_observation(plan.observation)
    if plan.breaker.tripped:
        new = new.tripped(Trip(plan.at, plan.breaker.why, plan.breaker.unhealthy))
    seen = {s.key: s for s in new.seen}
    for h in plan.hosts:
        for d in h.decisions:
            if d.finding == "-" or d.stale:
                continue
            key = (h.host, d.finding, h.boot_id)
            first = seen[key].first_seen if key in seen else plan.at
            seen[key] = Seen(h.host, d.finding, h.boot_id, first, plan.at, d.verdict.value)
    return replace(new, seen=tuple(seen.values()))
