"""Acting on the plan: ``invoke remediate`` without ``--check``.

Under the state file's lock for the whole run: audit -> plan (:mod:`~remediation.remediate.plan`) -> confirm -> the
hosts with an ``auto`` decision, in batches no larger than the in-flight cap -> per batch:

1. **re-probe** each host (a fresh audit) and drop the decisions whose finding is gone;
2. **blockers**, each a reason to leave the host alone this run, reported with why and never acted on: the fresh
   probe failed; a hardware finding that arose after the plan (a GPU lost while the run worked on other hosts:
   the plan never weighed it, the next run's plan escalates it); the dpkg lock is held (GPU-APT-001); an Azure
   Scheduled Event is pending for the VM (anything but ``clear`` from
   :func:`remediation.azure.scheduled_events.decide`: the loop never acts on top of the platform);
   GPU work runs (what the driver restore's own guard sees, :func:`remediation.restore.rules.gpu_processes`) and the
   action would reload the driver or reboot (a harden run only changes apt's settings and touches no running job);
3. **act** through the existing flows only: harden findings -> :func:`remediation.host.harden.harden` on those
   hosts; driver findings -> the rollout engine's :func:`remediation.restore.flow.driver_restore`, with
   ``allow_reboot`` only when the plan allowed the reboot (a maintenance window open, or ``--allow-reboot``), and
   then only after an evidence packet of the host is written (a reboot clears its kernel log). Each
   attempt is saved in the state *before* the action (no verdict: in flight), then again with its outcome;
4. **gate**: a re-audit of the acted hosts: the finding gone, NVML answers, the driver the inventory expects
   (``nvidia_driver_expected_version``); then, on the hosts that passed, the gate under load
   (:mod:`~remediation.remediate.loadgate`: a short GPU load with NVML watched during it, per
   ``remediate.load_gate``). A failed gate halts the loop (no further batch) and escalates that host.

Then every ``escalate`` decision, every host whose gate failed, and every host left alone because its Scheduled
Events said ``escalate`` (an event started or due within the horizon, or events that cannot be read: finding
AZ-SE-001, paged once per host, boot and set of events) gets an escalation packet under
``<state dir>/remediate/escalations/<fleet>/`` and, when a webhook is configured, a page; a finding already decided
on in an earlier run (the decision's ``new`` is false: the same host, finding and boot) is not paged again, and a page
that could not be delivered is retried by the next run.

The pure parts (:func:`batches`, :func:`blocker`, :func:`refresh`, :func:`gate`, :func:`started`, :func:`settled`,
:func:`page_due`) hold the rules; :func:`act` wires them to the audit, the flows and the state through
:class:`Ports`, which tests replace.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remediation.core.findings import Finding
from remediation.remediate.guards import Guards, InFlightCap, Outcome, classify_failure
from remediation.remediate.plan import Decision, HostPlan, Plan, Verdict, inputs_from_audit, make_plan, state_after
from remediation.remediate.policy import Action
from remediation.remediate.state import Attempt, RemediateState, Seen, load, locked, save, state_path

if TYPE_CHECKING:
    from remediation.config import RemediateSettings
    from remediation.host.audit import AuditOptions, AuditResult, HostAudit
    from remediation.remediate.loadgate import LoadVerdict
    from remediation.transport.inventory import Host

#: The finding a host gets when its Azure Scheduled Events say ``escalate`` before the loop acts on it.
EVENT_FINDING = "AZ-SE-001"

__all__ = ["ActResult", "Escalation", "HostOutcome", "HostStatus", "Ports", "act", "batches", "blocker", "gate",
           "page_due", "refresh", "settled", "started"]

#: Actions that reload the driver or reboot: running GPU work blocks them.
DISRUPTIVE = frozenset({Action.DRIVER_RESTORE, Action.REBOOT})


class HostStatus(StrEnum):
    FIXED = "fixed"  # acted; the gate passed
    GONE = "gone"  # the re-probe no longer shows the findings: nothing to do
    BLOCKED = "blocked"  # a blocker said not now (or the plan did)
    FAILED = "failed"  # acted; the gate failed or the action broke: escalated, the loop halted
    NOT_STARTED = "not-started"  # a failed gate halted the loop before this host's batch
    ESCALATED = "escalated"  # nothing acted on; an escalate decision was packed (and paged)
    NOT_ACTED = "not-acted"  # only propose / observe decisions: a person's work
    NOTHING = "nothing-to-do"  # no finding
    DECLINED = "declined"  # the confirmation was answered no

    @property
    def bad(self) -> bool:
        """What makes the run exit 1."""
        return self in (HostStatus.BLOCKED, HostStatus.FAILED, HostStatus.NOT_STARTED, HostStatus.ESCALATED)


@dataclass(frozen=True)
class Escalation:
    host: str
    finding: str
    key: str  # the dedupe key (the page's fingerprint, the packet's name)
    why: str
    packet: str | None = None  # the packet's directory
    page: str = ""  # sent | already paged (...) | not configured | failed: ... | not due

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "finding": self.finding, "dedupe_key": self.key, "why": self.why,
                "packet": self.packet, "page": self.page}


@dataclass(frozen=True)
class HostOutcome:
    host: str
    status: HostStatus
    why: str
    actions: tuple[str, ...] = ()
    findings: tuple[str, ...] = ()  # the findings acted on
    attempt: str | None = None  # the outcome recorded: ok | transient | permanent | ambiguous
    cordon: str = ""  # what became of this run's cordon (:mod:`remediation.remediate.hold`)
    evidence: str = ""  # the packet written before an action that may reboot the host (its kernel log goes with it)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "why": self.why, "actions": list(self.actions),
                "findings": list(self.findings), "attempt": self.attempt, "cordon": self.cordon,
                "evidence": self.evidence or None}


@dataclass(frozen=True)
class ActResult:
    plan: Plan
    outcomes: Mapping[str, HostOutcome]
    escalations: tuple[Escalation, ...]
    halted: str | None  # why the loop stopped before its last batch
    state: Path
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        from remediation.core.exitcodes import ExitCode

        if self.halted or self.escalations or any(o.status.bad for o in self.outcomes.values()):
            return int(ExitCode.FINDINGS)
        return int(ExitCode.OK)

    def to_dict(self) -> dict[str, Any]:
        doc = self.plan.to_dict()
        doc["mode"] = "act"
        for h in doc["hosts"]:
            o = self.outcomes.get(h["host"])
            h["outcome"] = o.to_dict() if o is not None else None
        doc["outcomes"] = {s.value: sorted(o.host for o in self.outcomes.values() if o.status is s)
                           for s in HostStatus}
        doc["escalations"] = [e.to_dict() for e in self.escalations]
        doc["halted"] = self.halted
        doc["state"] = str(self.state)
        doc["notes"] = list(self.notes)
        return doc


# --- the rules (pure) -----------------------------------------------------------------------------------------------


def batches(hosts: Sequence[str], cap: int, busy: int = 0) -> list[list[str]]:
    """``hosts`` in batches of at most ``cap - busy`` (``busy``: hosts still in flight from an earlier run); none
    when no slot is free."""
    size = cap - busy
    if size < 1:
        return []
    return [list(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def refresh(decisions: Sequence[Decision], fresh: HostAudit | None) -> tuple[tuple[Decision, ...], tuple[str, ...]]:
    """The decisions whose finding the fresh probe still shows, and the finding IDs that are gone."""
    if fresh is None or fresh.facts is None:
        return tuple(decisions), ()
    now = {f.id for f in fresh.findings}
    kept = tuple(d for d in decisions if d.finding in now)
    return kept, tuple(d.finding for d in decisions if d.finding not in now)


def blocker(
    decisions: Sequence[Decision],
    fresh: HostAudit | None,
    events: Any | None,
    *,
    events_checked: bool = True,
    held: str | None = None,
    planned: Iterable[str] | None = None,
) -> str | None:
    """Why the host must be left alone now, or None. ``events``: the host's Scheduled Events decision
    (:class:`remediation.azure.scheduled_events.HostDecision`), None when it was not read. ``held``: what
    :meth:`remediation.remediate.hold.FleetHold.check` found (a cordon not ours, a firing alert, AKS auto-repair).
    ``planned``: the host's findings the plan decided on; a hardware finding the fresh probe shows beyond them arose
    during this run (the plan never weighed it), so the host is left for the next run's plan."""
    if fresh is None or fresh.facts is None:
        detail = "no answer" if fresh is None else f"{fresh.status.value}: {fresh.error or 'no answer'}"
        return f"re-probe failed ({detail}): nothing is changed without a fresh probe"
    if held:
        return held
    if planned is not None:
        from remediation.remediate.policy import is_hardware

        known = set(planned)
        new = [f for f in fresh.findings if is_hardware(f.id) and f.id not in known]
        if new:
            first = new[0]
            return (f"new since the plan: {', '.join(sorted({f.id for f in new}))} ({first.summary[:120]}): "
                    "not acted on; the next run's plan escalates it")
    if any(f.id == "GPU-APT-001" for f in fresh.findings) or fresh.facts.dpkg_lock.held:
        return "dpkg lock held (GPU-APT-001): transient, the next run retries"
    if events_checked:
        if events is None:
            return "Azure Scheduled Events were not read for this host: never act without them"
        if events.verdict.value != "clear":
            return f"Azure Scheduled Events: {events.verdict.value}: {events.reason}"
    if any(d.action in DISRUPTIVE for d in decisions):
        from remediation.restore.rules import gpu_processes

        procs = gpu_processes(fresh.facts)
        if procs:
            return ("protected GPU work running (" + "; ".join(procs[:4]) + "): the driver restore would stop it; "
                    "the next run looks again")
    return None


def gate(host_vars: Mapping[str, Any], after: HostAudit | None, findings: Iterable[str],
         load: LoadVerdict | None = None) -> tuple[bool | None, str]:
    """The health gate after an action: True (passed), False (failed) or None (no verdict: the host could not be
    probed, or the load program gave no answer), and why. ``load``: the gate under load's verdict (None: not run,
    as when the checks before it failed)."""
    if after is None or after.facts is None:
        why = "no answer" if after is None else f"{after.status.value}: {after.error or 'no answer'}"
        return None, f"gate: the re-audit could not probe the host ({why})"
    left = sorted({f.id for f in after.findings} & set(findings))
    if left:
        return False, f"gate: {', '.join(left)} still present after the action"
    nvml = after.facts.nvml
    if nvml.failed:
        return False, f"gate: NVML does not answer ({nvml.error_class or 'failed'})"
    expected = host_vars.get("nvidia_driver_expected_version")
    if expected and nvml.driver_version != str(expected):
        return False, f"gate: driver {nvml.driver_version or '?'} loaded, {expected} expected"
    passed = f"gate passed: {', '.join(sorted(set(findings)))} gone, NVML answers (driver " \
             f"{nvml.driver_version or '?'})"
    if load is not None:
        if load.passed is None:
            return None, f"gate: {load.why}"
        if load.passed is False:
            return False, f"gate: {load.why}"
        return True, f"{passed}; {load.why}"
    return True, passed


def started(state: RemediateState, host: str, boot_id: str | None, decisions: Sequence[Decision],
            at: _dt.datetime) -> tuple[RemediateState, tuple[Attempt, ...]]:
    """The state with one in-flight attempt per finding acted on (all at ``at``: one action is one attempt of the
    budget, whatever the number of findings it fixes)."""
    attempts = tuple(Attempt(host, d.finding, boot_id, d.action.value if d.action else "?", at) for d in decisions)
    for a in attempts:
        state = state.with_attempt(a)
    return state, attempts


def settled(state: RemediateState, attempts: Sequence[Attempt], *, ok: bool, outcome: Outcome | None = None
            ) -> RemediateState:
    """The state with ``attempts`` given their verdict: ``ok`` (fixed), else ``outcome``."""
    keys = {(a.host, a.finding, a.boot_id, a.at) for a in attempts}
    done = tuple(replace(a, ok=ok, outcome=None if ok else outcome)
                 if (a.host, a.finding, a.boot_id, a.at) in keys else a for a in state.attempts)
    return replace(state, attempts=done)


def page_due(previous: str | None, *, gate_failed: bool = False) -> bool:
    """Whether an escalation is paged: a gate that failed in this run, or a finding whose earlier decision in this
    boot (``previous``, from the state before this run; None: first seen) was not an escalation, which an earlier
    run paged already."""
    return gate_failed or previous != Verdict.ESCALATE.value


# --- wiring ---------------------------------------------------------------------------------------------------------


@dataclass
class Ports:
    """What :func:`act` calls outside itself (the tests pass stand-ins)."""

    audit: Callable[..., AuditResult] | None = None
    harden: Callable[..., Any] | None = None
    restore: Callable[..., Any] | None = None
    read_events: Callable[..., Mapping[str, Any]] | None = None
    send_page: Callable[..., Any] | None = None
    clock: Callable[[], _dt.datetime] = field(default=lambda: _dt.datetime.now(_dt.UTC))
    hold: Callable[..., Any] | None = None  # makes the run's cordons and checks (hold.FleetHold)
    load: Callable[..., Mapping[str, LoadVerdict]] | None = None  # the gate under load (loadgate.run_load)

    def filled(self) -> Ports:
        from remediation.azure.scheduled_events import read_events
        from remediation.escalation.page import send_page
        from remediation.host.audit import run_audit
        from remediation.host.harden import harden
        from remediation.remediate.hold import FleetHold
        from remediation.remediate.loadgate import run_load
        from remediation.restore.flow import driver_restore

        return Ports(self.audit or run_audit, self.harden or harden, self.restore or driver_restore,
                     self.read_events or read_events, self.send_page or send_page, self.clock,
                     self.hold or FleetHold, self.load or run_load)


def _escalate(
    host: str, finding: Finding, facts: Any, boot_id: str | None, why: str, *, due: bool, cfg: RemediateSettings,
    out_dir: Path, fleet: str, now: _dt.datetime, host_vars: Mapping[str, Any], send: Callable[..., Any],
    discriminator: str = "",
    incident: str | None = None,
) -> Escalation:
    from remediation.escalation.packet import build_packet, write_packet
    from remediation.escalation.page import build_payload, dedupe_key

    key = dedupe_key(host, finding.id, boot_id, discriminator)
    rid = host_vars.get("azure_vm_resource_id")
    packet = build_packet(replace(finding, host=host), facts, now=now,
                          resource_id=rid if isinstance(rid, str) else None, discriminator=discriminator,
                          incident_markdown=incident)
    if facts is None:
        packet["boot_id"], packet["dedupe_key"] = boot_id, key
    path = write_packet(packet, out_dir)
    if not cfg.webhook_url:
        page = "not configured (remediate.webhook_url is empty)"
    elif not due:
        page = "already paged (same host, finding and boot in an earlier run)"
    else:
        payload = build_payload(finding, boot_id=boot_id, host=host, fleet=fleet, detected_at=now,
                                discriminator=discriminator)
        result = send(cfg.webhook_url, payload, token=cfg.webhook_token or None)
        page = "sent" if result.delivered else f"failed: {result.error or result.status}"
    return Escalation(host, finding.id, key, why, str(path), page)


def _incident(audit: AuditResult | None, host: str) -> str | None:
    """The host's incident report (Markdown) for its packet, or None when there is none to write: the packet is
    written all the same (host text is untrusted: a report that cannot be rendered never stops an escalation)."""
    if audit is None:
        return None
    try:
        from remediation.report.incident import render_incident

        return render_incident(audit, host)
    except Exception:  # the packet's evidence matters more than its prose
        return None


def _evidence_before_reboot(name: str, decisions: Sequence[Decision], fresh: AuditResult, state: Path, fleet: str,
                            now: _dt.datetime, host_vars: Mapping[str, Any]) -> str:
    """The packet of ``name``'s findings (facts, kernel log lines, dkms status, holds, the incident report) written
    before an action that may reboot it: a reboot clears the kernel's ring buffer, and what made the loop act must
    outlive it. Not paged: the host is being fixed, not escalated. Returns the packet's directory."""
    from remediation.escalation.packet import build_packet, write_packet

    host_audit = fresh.host(name)
    found = {f.id: f for f in host_audit.findings}
    primary = next((found[d.finding] for d in decisions if d.action in DISRUPTIVE and d.finding in found),
                   next(iter(found.values())))
    rid = host_vars.get("azure_vm_resource_id")
    packet = build_packet(replace(primary, host=name), host_audit.facts, now=now,
                          resource_id=rid if isinstance(rid, str) else None, discriminator="before-reboot",
                          incident_markdown=_incident(fresh, name))
    packet["purpose"] = "evidence kept before an action that may reboot the host (not an escalation)"
    return str(write_packet(packet, state.parent / "evidence" / fleet))


def act(
    hosts: Sequence[Host],
    inventory: str | Path,
    options: AuditOptions,
    cfg: RemediateSettings,
    *,
    fleet: str,
    state_dir: Path,
    restore_options: Any = None,
    allow_reboot: bool = False,
    source: str = "invoke.yaml",
    fleet_size: int | None = None,
    confirm: Callable[[Plan], bool] | None = None,
    ports: Ports | None = None,
) -> ActResult:
    """Audit, plan and act (see the module docstring); the state file is locked for the whole run (a second run
    waits 10 s, then :class:`~remediation.remediate.errors.StateLockedError`)."""
    from remediation.remediate.flow import guards_from, policy_from

    p = (ports or Ports()).filled()
    assert p.audit and p.harden and p.restore and p.read_events and p.send_page
    policy = policy_from(cfg, fleet, source)
    guards: Guards = guards_from(cfg)
    endpoint = cfg.imds_endpoint.strip()
    if endpoint:
        from remediation.azure.scheduled_events import check_endpoint

        check_endpoint(endpoint)
    if cfg.webhook_url:
        from remediation.escalation.page import check_url

        check_url(cfg.webhook_url, cfg.webhook_token or None)
    path = state_path(state_dir, fleet)
    by_name = {h.name: h for h in hosts}
    notes: list[str] = []
    if not endpoint:
        notes.append("Azure Scheduled Events not checked (remediate.imds_endpoint is empty: hosts not on Azure)")
    if not cfg.webhook_url:
        notes.append("no page sent: remediate.webhook_url is empty (escalation packets are written)")
    from remediation.remediate.loadgate import load_mode

    notes.append({"required": "load gate: required (a host with no load tool fails its gate)",
                  "when-available": "load gate: when available (a host with no load tool is gated on NVML and the "
                                    "driver only, and says so)",
                  "off": "load gate: off (remediate.load_gate: off)"}[load_mode(cfg.load_gate).value])
    from remediation.rollout.engine import new_run_id

    assert p.hold is not None
    hold = p.hold(cfg, hosts, options, new_run_id(), p.clock)  # its run id names the cordons this run sets
    notes.extend(hold.notes)

    with locked(path):
        state = load(path, fleet)
        audit = p.audit(hosts, options, fleet=fleet, inventory=str(inventory))
        now = p.clock()
        inputs = inputs_from_audit(audit)
        capped = make_plan(inputs, policy, state, now, guards, allow_reboot, fleet_size)
        # The same plan without the cap: the hosts the cap blocked go in later batches of this run.
        wide = make_plan(inputs, policy, state, now, replace(guards, in_flight=InFlightCap(10**9, 100.0)),
                         allow_reboot, fleet_size)
        plan = replace(capped, hosts=wide.hosts)
        outcomes: dict[str, HostOutcome] = {}
        auto = [h for h in plan.hosts if h.auto]
        if auto and confirm is not None and not confirm(plan):
            outcomes = {h.host: HostOutcome(h.host, HostStatus.DECLINED, "not confirmed; nothing was changed")
                        for h in auto}
            return ActResult(plan, outcomes, (), None, path, tuple(notes))

        before = state
        state = state_after(plan, state)
        save(path, state)
        halted: str | None = None
        gate_failed: dict[str, tuple[tuple[Decision, ...], HostAudit | None, str]] = {}
        platform: dict[str, tuple[Any, tuple[Decision, ...], HostAudit | None]] = {}  # Scheduled Events: escalate
        chunks = batches([h.host for h in auto], plan.in_flight_cap, len(plan.in_flight_before))
        if auto and not chunks:
            for h in auto:
                outcomes[h.host] = HostOutcome(h.host, HostStatus.BLOCKED,
                                               f"in-flight cap reached by earlier runs ({plan.in_flight})")
        plans = {h.host: h for h in plan.hosts}
        for chunk in chunks:
            if halted is not None:
                for name in chunk:
                    outcomes[name] = HostOutcome(name, HostStatus.NOT_STARTED, f"the loop halted: {halted}")
                continue
            state, halted = _batch(chunk, plans, by_name, inventory, options, cfg, p, state, path, outcomes,
                                   gate_failed, endpoint, restore_options, allow_reboot, fleet, hold, platform)

        getattr(hold, "close", lambda: None)()
        escalations: list[Escalation] = []
        out_dir = path.parent / "escalations" / fleet
        for h in plan.hosts:
            found = {f.id: f for f in audit.host(h.host).findings} if h.probed else {}
            facts = audit.host(h.host).facts if h.probed else None
            for d in h.decisions:
                if d.verdict is not Verdict.ESCALATE or d.stale or d.finding not in found:
                    continue
                if any((e.host, e.finding) == (h.host, d.finding) for e in escalations):
                    continue  # the same finding ID twice on a host (two GPUs): one packet, one page per key
                seen = before.seen_as(h.host, d.finding, h.boot_id)
                due = page_due(seen.decision if seen is not None else None)
                e = _escalate(h.host, found[d.finding], facts, h.boot_id, d.why, due=due, cfg=cfg,
                              out_dir=out_dir, fleet=fleet, now=now, host_vars=by_name[h.host].vars,
                              send=p.send_page, incident=_incident(audit, h.host))
                escalations.append(e)
        for name, (decisions, after, why) in gate_failed.items():
            first = {f.id: f for f in audit.host(name).findings}
            now_found = {f.id: f for f in after.findings} if after is not None and after.facts else {}
            for d in decisions:
                finding = now_found.get(d.finding) or first[d.finding]
                facts = after.facts if after is not None and after.facts else audit.host(name).facts
                escalations.append(_escalate(name, finding, facts, plans[name].boot_id, why, due=True, cfg=cfg,
                                             out_dir=out_dir, fleet=fleet, now=now, host_vars=by_name[name].vars,
                                             send=p.send_page, incident=_incident(audit, name)))
        platform_seen = _platform_escalations(platform, plans, before, outcomes, escalations, cfg=cfg,
                                              out_dir=out_dir, fleet=fleet, now=now, by_name=by_name,
                                              send=p.send_page, audit=audit)
        for h in plan.hosts:
            if h.host in outcomes:
                continue
            mine = [e for e in escalations if e.host == h.host]
            verdicts = {d.verdict for d in h.decisions}
            if not h.decisions:
                outcomes[h.host] = HostOutcome(h.host, HostStatus.NOTHING, "no finding")
            elif mine:
                names = ", ".join(e.finding for e in mine)
                outcomes[h.host] = HostOutcome(h.host, HostStatus.ESCALATED, f"escalated: {names}")
            elif Verdict.BLOCKED in verdicts:
                why = next(d.why for d in h.decisions if d.verdict is Verdict.BLOCKED)
                outcomes[h.host] = HostOutcome(h.host, HostStatus.BLOCKED, why)
            else:
                outcomes[h.host] = HostOutcome(h.host, HostStatus.NOT_ACTED, "propose / observe only: a person's work")
        paged = {(n, d.finding, plans[n].boot_id) for n, (ds, _a, _w) in gate_failed.items() for d in ds}
        failed_pages = {(e.host, e.finding, plans[e.host].boot_id) for e in escalations if e.page.startswith("failed")}
        # escalated now: seen as such (an earlier page is not repeated); a page that failed: forgotten, so that the
        # next run pages it
        state = replace(state, seen=tuple(
            replace(s, decision=Verdict.ESCALATE.value) if s.key in paged else s
            for s in state.seen if s.key not in failed_pages))
        replaced = {s.key for s in platform_seen}  # the events paged now stand for the host and boot from now on
        state = replace(state, seen=(*(s for s in state.seen if s.key not in replaced), *platform_seen))
        keep = max(guards.budget.window_s, guards.breaker.window_s, guards.finding_ttl_s)
        save(path, state.pruned(now, keep))
    return ActResult(plan, outcomes, tuple(escalations), halted, path, tuple(notes))


def _platform_escalations(
    platform: Mapping[str, tuple[Any, tuple[Decision, ...], HostAudit | None]],
    plans: Mapping[str, HostPlan],
    before: RemediateState,
    outcomes: dict[str, HostOutcome],
    escalations: list[Escalation],
    *,
    cfg: RemediateSettings,
    out_dir: Path,
    fleet: str,
    now: _dt.datetime,
    by_name: Mapping[str, Host],
    send: Callable[..., Any],
    audit: AuditResult | None = None,
) -> tuple[Seen, ...]:
    """An AZ-SE-001 escalation (packet, page) for each host whose Scheduled Events said ``escalate`` before the loop
    acted: the host stays untouched and blocked, and a person hears of it once per (host, boot, events). Returns the
    records that say which events were paged (a page that failed is not recorded: the next run pages it)."""
    from remediation.azure.scheduled_events import event_finding, event_key

    records: list[Seen] = []
    for name, (decision, kept, fresh) in platform.items():
        boot_id = plans[name].boot_id
        key = event_key(decision)
        finding = event_finding(decision, tuple(d.finding for d in kept))
        seen = before.seen_as(name, EVENT_FINDING, boot_id)
        due = seen is None or seen.detail != key
        facts = fresh.facts if fresh is not None else None
        e = _escalate(name, finding, facts, boot_id, decision.reason, due=due, cfg=cfg, out_dir=out_dir, fleet=fleet,
                      now=now, host_vars=by_name[name].vars, send=send, discriminator=key,
                      incident=_incident(audit, name))
        escalations.append(e)
        outcomes[name] = replace(outcomes[name], status=HostStatus.ESCALATED,
                                 why=f"escalated: {EVENT_FINDING}: {decision.reason}")
        if not e.page.startswith("failed"):
            first = seen.first_seen if seen is not None and seen.detail == key else now
            records.append(Seen(name, EVENT_FINDING, boot_id, first, now, Verdict.ESCALATE.value, key))
    return tuple(records)


def _batch(
    chunk: Sequence[str],
    plans: Mapping[str, HostPlan],
    by_name: Mapping[str, Host],
    inventory: str | Path,
    options: AuditOptions,
    cfg: RemediateSettings,
    p: Ports,
    state: RemediateState,
    path: Path,
    outcomes: dict[str, HostOutcome],
    gate_failed: dict[str, tuple[tuple[Decision, ...], HostAudit | None, str]],
    endpoint: str,
    restore_options: Any,
    allow_reboot: bool,
    fleet: str,
    hold: Any = None,
    platform: dict[str, tuple[Any, tuple[Decision, ...], HostAudit | None]] | None = None,
) -> tuple[RemediateState, str | None]:
    """One batch: re-probe, blockers, act, gate, record. Returns the state and why the loop halts (or None)."""
    assert p.audit and p.harden and p.restore and p.read_events
    hosts = [by_name[n] for n in chunk]
    fresh = p.audit(hosts, options, fleet=fleet, inventory=str(inventory))
    if hold is None:
        from remediation.remediate.hold import NoHold

        hold = NoHold()
    held = hold.check(hosts)  # cordons not ours, firing alerts, AKS auto-repair
    events: Mapping[str, Any] = {}
    if endpoint:
        from remediation.azure.scheduled_events import decide_all, vm_name_of

        read = p.read_events(hosts, endpoint=endpoint)
        events = decide_all(read, now=p.clock(), vm_names={h.name: vm_name_of(h) for h in hosts})
    to_act: dict[str, tuple[Decision, ...]] = {}
    for name in chunk:
        hp = plans[name]
        try:
            now_audit: HostAudit | None = fresh.host(name)
        except KeyError:
            now_audit = None
        kept, gone = refresh(hp.auto, now_audit)
        if not kept:
            outcomes[name] = HostOutcome(name, HostStatus.GONE, f"re-probe: {', '.join(gone)} gone; nothing done",
                                         findings=gone)
            continue
        why = blocker(kept, now_audit, events.get(name), events_checked=bool(endpoint), held=held.get(name),
                      planned=[d.finding for d in hp.decisions])
        ev = events.get(name)
        if (why is not None and platform is not None and ev is not None and ev.verdict.value == "escalate"
                and why.startswith("Azure Scheduled Events:")):
            platform[name] = (ev, kept, now_audit)  # the platform acts on a host we would fix: a person hears of it
        if why is not None:
            outcomes[name] = HostOutcome(name, HostStatus.BLOCKED, why, findings=tuple(d.finding for d in kept))
            continue
        to_act[name] = kept
    for name, why in hold.cordon([by_name[n] for n in to_act], to_act).items():  # ours set before acting
        outcomes[name] = HostOutcome(name, HostStatus.BLOCKED, why, findings=tuple(d.finding for d in to_act[name]))
        del to_act[name]
    if not to_act:
        return state, None

    at = p.clock()
    attempts: dict[str, tuple[Attempt, ...]] = {}
    for name, kept in to_act.items():
        state, attempts[name] = started(state, name, plans[name].boot_id, kept, at)
    save(path, state)  # in flight: a run cut short leaves attempts without a verdict, which block the next run

    verdict: dict[str, tuple[bool, Outcome | None, str]] = {}  # host -> ok, outcome, why (action's own)
    evidence: dict[str, str] = {}  # host -> the packet written before an action that may reboot it
    harden_hosts = [n for n, ds in to_act.items() if any(d.action is Action.HARDEN for d in ds)]
    restore_hosts = [n for n, ds in to_act.items() if any(d.action in DISRUPTIVE for d in ds)]
    if harden_hosts:
        try:
            result = p.harden([by_name[n] for n in harden_hosts], inventory, options)
            blocked = {b.host: b.blocked for b in result.plan.blocked}
            for n in harden_hosts:
                if n in blocked:
                    verdict[n] = (False, classify_failure(started=False, finished=False), f"harden: {blocked[n]}")
        except Exception as exc:  # a runner that broke: ambiguous, it may have changed something
            for n in harden_hosts:
                verdict[n] = (False, Outcome.AMBIGUOUS, f"harden did not finish: {exc}")
    if restore_hosts:
        from remediation.restore.flow import HostStatus as RS
        from remediation.restore.flow import RestoreOptions

        reboot = allow_reboot or any(d.reboot and d.verdict is Verdict.AUTO for n in restore_hosts for d in to_act[n])
        if reboot:  # the evidence first: a reboot clears the kernel log that made the loop act
            for n in restore_hosts:
                evidence[n] = _evidence_before_reboot(n, to_act[n], fresh, path, fleet, p.clock(), by_name[n].vars)
        base = restore_options if restore_options is not None else RestoreOptions()
        opts = replace(base, allow_reboot=reboot, batch=len(restore_hosts), dry_run=False)
        try:
            rr = p.restore([by_name[n] for n in restore_hosts], inventory, options, opts, fleet=fleet,
                           run_id=hold.run_id)  # the run's own cordon is not someone else's to the restore
            for n in restore_hosts:
                try:
                    o = rr.outcome(n)
                except KeyError:
                    verdict[n] = (False, Outcome.TRANSIENT, "driver restore: the host was not part of the run")
                    continue
                if o.status in (RS.LEFT_ALONE, RS.NOT_STARTED, RS.PLANNED):
                    verdict[n] = (False, Outcome.TRANSIENT, f"driver restore left it alone: {o.where or o.detail}")
                elif o.status is RS.FAILED:
                    verdict[n] = (False, Outcome.PERMANENT, f"driver restore failed ({o.where}); undone")
                elif o.status is RS.REBOOT_REQUIRED:
                    verdict[n] = (False, Outcome.PERMANENT, "driver restore: reboot required to finish")
        except Exception as exc:
            for n in restore_hosts:
                verdict[n] = (False, Outcome.AMBIGUOUS, f"driver restore did not finish: {exc}")

    acted = [n for n in to_act if n not in verdict]
    after = p.audit([by_name[n] for n in acted], options, fleet=fleet, inventory=str(inventory)) if acted else None
    loads = _under_load(acted, after, to_act, by_name, cfg, p)
    halted: str | None = None
    for name, kept in to_act.items():
        actions = tuple(sorted({d.action.value for d in kept if d.action}))
        ids = tuple(d.finding for d in kept)
        if name in verdict:
            ok, outcome, why = verdict[name]
        else:
            assert after is not None
            try:
                host_after: HostAudit | None = after.host(name)
            except KeyError:
                host_after = None
            passed, why = gate(by_name[name].vars, host_after, ids, loads.get(name))
            ok = bool(passed)
            outcome = None if passed else classify_failure(started=True, finished=passed is not None)
            if not passed:
                gate_failed[name] = (kept, host_after, why)
        state = settled(state, attempts[name], ok=ok, outcome=outcome)
        if ok:
            outcomes[name] = HostOutcome(name, HostStatus.FIXED, why, actions, ids, "ok")
            continue
        assert outcome is not None
        if outcome is Outcome.TRANSIENT:
            outcomes[name] = HostOutcome(name, HostStatus.BLOCKED, why, actions, ids, outcome.value)
            continue
        outcomes[name] = HostOutcome(name, HostStatus.FAILED, why, actions, ids, outcome.value)
        if name not in gate_failed:
            gate_failed[name] = (kept, None, why)
        halted = halted or f"{name}: {why}"
    save(path, state)
    # this run's cordon: lifted after a passed gate or an action that did not start; kept on a failed host
    lift = [n for n in to_act if outcomes[n].status is HostStatus.FIXED or outcomes[n].attempt == "transient"]
    lifted = hold.release([by_name[n] for n in lift])
    for name in to_act:
        outcomes[name] = replace(outcomes[name], cordon=lifted.get(name) or hold.kept(name),
                                 evidence=evidence.get(name, ""))
    return state, halted


def _under_load(acted: Sequence[str], after: AuditResult | None, to_act: Mapping[str, Sequence[Decision]],
                by_name: Mapping[str, Host], cfg: RemediateSettings, p: Ports) -> Mapping[str, LoadVerdict]:
    """The gate under load on the acted hosts whose re-audit gate passed (all at once, one round trip each)."""
    from remediation.remediate.loadgate import LoadMode, load_mode

    mode = load_mode(cfg.load_gate)
    if after is None or mode is LoadMode.OFF or p.load is None:
        return {}
    ready = []
    for name in acted:
        try:
            host_after: HostAudit | None = after.host(name)
        except KeyError:
            continue
        if gate(by_name[name].vars, host_after, tuple(d.finding for d in to_act[name]))[0]:
            ready.append(by_name[name])
    return p.load(ready, mode=mode, seconds=cfg.load_gate_seconds) if ready else {}

