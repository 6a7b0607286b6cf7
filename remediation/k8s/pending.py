"""Why a pod is Pending, and the fix: ``constraint | capacity | node_state`` (runbook S3).

:func:`diagnose_pending` takes what there is (the scheduler's and autoscaler's messages as text, a snapshot of the
pod, nodes, pods and events, the AKS pool and quota facts) and decides once, for ``invoke k8s.diagnose-pending``
and for the ``invoke diagnose`` kinds ``failed-scheduling`` / ``k8s-events`` alike: each finding ID below has one
rule function, used by both.

With a snapshot the scheduler's filters are replayed (:mod:`remediation.k8s.evaluator`) and the verdict comes from
the nodes themselves, so a 1.35 message that hides the taint key still names ``sku=gpu:NoSchedule``:

- a node whose only failures are taints the pod could tolerate (never a node-health taint) and, when no node at all
  matches the pod's ``nodeSelector``, a selector value: **constraint**; the fix adds exactly those tolerations (and
  that selector value), and is checked by re-running the filters on the patched pod;
- else a node that would take the pod but for resources (after that fix, if it needs one): **capacity**, with the
  pool and quota chain (:mod:`remediation.k8s.capacity`); the verdict stays constraint when a fix is needed first;
- else a node that only its state keeps away (cordoned, not ready, unreachable, pressure, being deleted):
  **node_state**: fix the node, never tolerate its taint;
- else (every node fails a hard constraint the pod states: required affinity, node name, host ports): constraint,
  with no automatic patch.

Without a snapshot the verdict is :func:`remediation.k8s.scheduling.text_verdict` of the latest message. When the
message hides the taint key (1.35+ "untolerated taint(s)") and other nodes lack GPUs, the text cannot tell a missing
toleration from GPU capacity: the verdict is **ambiguous**, K8S-PEND-001 (with the hint to replay the filters on the
nodes: ``--pod P --namespace NS`` or ``--snapshot DIR``) and K8S-PEND-004 are both reported, the toleration first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from remediation.core.findings import Finding, make_finding
from remediation.k8s.capacity import CapacityAdvice, NodePool, QuotaUsage, advise, nodepool_update, placeholder
from remediation.k8s.evaluator import Failure, NodeResult, evaluate
from remediation.k8s.objects import Pod, Taint, Toleration, pod_from_dict
from remediation.k8s.patch import PodFix, apply_patch, build_fix, toleration_for
from remediation.k8s.scheduling import (
    AMBIGUOUS,
    CAPACITY,
    CONSTRAINT,
    NODE_STATE,
    EventsText,
    Reason,
    SchedulingMessage,
    health_label,
    parse_events,
    parse_message,
    text_verdict,
)
from remediation.k8s.snapshot import Snapshot

__all__ = ["PendingDiagnosis", "diagnose_pending", "diagnose_text"]

_OTHER_CONSTRAINTS = frozenset(
    {
        "pod_affinity_mismatch",
        "pod_anti_affinity_mismatch",
        "pod_affinity_legacy",
        "topology_spread_mismatch",
        "host_port_conflict",
        "volume_node_affinity_conflict",
        "unbound_immediate_pvc",
        "volume_binding_conflict",
        "volume_zone_conflict",
        "volume_conflict",
        "node_name_mismatch",
    }
)


@dataclass(frozen=True)
class Candidate:
    """A node the pod could use, and what stands in the way there."""

    result: NodeResult
    taints: tuple[Taint, ...]  # to tolerate
    selector: dict[str, str]  # nodeSelector values to change
    lacking: tuple[Failure, ...]  # resource failures

    @property
    def fixes(self) -> int:
        return len(self.taints) + len(self.selector)


@dataclass(frozen=True)
class PendingDiagnosis:
    pod: str | None
    events: EventsText
    message: SchedulingMessage | None
    verdict: str | None
    nodes: tuple[NodeResult, ...]
    fits_now: tuple[str, ...]
    fix: PodFix | None
    scheduled_on: str | None  # where the evaluator places the pod once fixed
    capacity: CapacityAdvice | None
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]

    def facts(self) -> dict[str, Any]:
        """The ``invoke diagnose`` facts: exactly ``total_nodes``, ``reasons``, ``preemption``, ``verdict``."""
        return {
            "total_nodes": self.message.total_nodes if self.message else None,
            "reasons": [r.to_dict() for r in self.events.facts_reasons()],
            "preemption": self.message.preemption_kind if self.message else None,
            "verdict": self.verdict,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            **self.facts(),
            "fits_now": list(self.fits_now),
            "nodes": [
                {
                    "node": r.node.name,
                    "pool": r.node.pool,
                    "fits": r.fits,
                    "failures": [{"filter": f.filter, "reason": f.reason, "detail": f.detail} for f in r.failures],
                }
                for r in self.nodes
            ],
            "fix": self.fix.to_dict() if self.fix else None,
            "scheduled_on_after_fix": self.scheduled_on,
            "capacity": None
            if self.capacity is None
            else {
                "pool": self.capacity.pool,
                "vm_size": self.capacity.vm_size,
                "nodes_needed": self.capacity.nodes_needed,
                "at_max": self.capacity.at_max,
                "family": self.capacity.family,
                "raise": list(self.capacity.raise_),
                "lines": list(self.capacity.lines),
                "commands": list(self.capacity.commands),
            },
            "notes": list(self.notes),
            "findings": [f.to_dict() for f in self.findings],
        }


# --- the messages ----------------------------------------------------------------------------------------------


def _messages(text: str, snapshot: Snapshot | None) -> EventsText:
    found = list(parse_events(text).messages) if text else []
    if snapshot is not None:
        if snapshot.events_text:
            found.extend(parse_events(snapshot.events_text).messages)
        for event in snapshot.pod_events():
            if event.reason not in ("FailedScheduling", "NotTriggerScaleUp", "FailedToScaleUpGroup", "FailedScaleUp"):
                continue
            m = parse_message(event.message)
            found.append(
                SchedulingMessage(
                    m.source,
                    m.total_nodes,
                    m.reasons,
                    m.preemption,
                    m.era,
                    m.text,
                    event.reason,
                    m.wouldnt_fit,
                    m.scale_up_failure,
                    None,
                    event.component,
                    m.postfilter,
                )
            )
    return EventsText(tuple(found))


# --- the evaluator's verdict -----------------------------------------------------------------------------------


def _candidates(pod: Pod, results: Sequence[NodeResult]) -> tuple[list[Candidate], list[NodeResult]]:
    """Nodes the pod could use with a patch and/or more resources; and the nodes only their state keeps away."""
    unmatched_selector = {
        key for key in pod.node_selector if not any(r.node.labels.get(key) == pod.node_selector[key] for r in results)
    }
    candidates: list[Candidate] = []
    state_only: list[NodeResult] = []
    for r in results:
        if r.fits:
            continue
        taints: list[Taint] = []
        selector: dict[str, str] = {}
        lacking: list[Failure] = []
        hard = state = False
        for f in r.failures:
            if f.node_state:
                state = True
            elif f.filter == "TaintToleration" and f.taint is not None and not health_label(f.taint.key):
                taints.append(f.taint)
            elif (
                f.filter == "NodeAffinity" and f.selector_key in unmatched_selector and f.selector_key in r.node.labels
            ):
                selector[f.selector_key] = r.node.labels[f.selector_key]
            elif f.capacity:
                lacking.append(f)
            else:
                hard = True
        if hard:
            continue
        if state:
            state_only.append(r)
            continue
        candidates.append(Candidate(r, tuple(taints), selector, tuple(lacking)))
    return candidates, state_only


def _offers(result: NodeResult, pod: Pod) -> int:
    """How many of the extended resources the pod requests the node has at all (ranks the right pool first)."""
    wanted = [name for name in pod.requests() if "/" in name]
    return sum(1 for name in wanted if result.node.allocatable.get(name, Decimal(0)) > 0)


def _rank(pod: Pod, c: Candidate) -> tuple[int, int, int, str]:
    return (-_offers(c.result, pod), len(c.lacking) > 0, c.fixes, c.result.node.name)


def _gpu_request(pod: Pod, resource: str) -> int:
    return int(pod.requests().get(resource, Decimal(0)))


# --- the rules: one function per finding ID --------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    pod: Pod | None
    events: EventsText
    message: SchedulingMessage | None
    verdict: str | None
    best: Candidate | None
    state_nodes: tuple[NodeResult, ...]
    fix: PodFix | None
    scheduled_on: str | None
    capacity: CapacityAdvice | None
    evaluated: bool
    gpu_resource: str
    cluster: str = ""
    resource_group: str = ""


def _evidence(ctx: _Context, labels: Sequence[str] = ()) -> list[str]:
    lines: list[str] = []
    if ctx.message is not None:
        lines.append(ctx.message.text)
    for m in ctx.events.autoscaler():
        if m.text not in lines:
            lines.append(m.text)
    if labels and ctx.message is not None:
        lines.extend(r.raw for r in ctx.message.reasons if r.reason in labels and r.raw not in lines)
    return lines


def _text_reasons(ctx: _Context) -> tuple[Reason, ...]:
    """The reasons a text-only rule reads: the latest scheduler message's, else the autoscaler's."""
    if ctx.message is not None:
        return ctx.message.reasons
    return tuple(r for m in ctx.events.autoscaler() for r in m.reasons)


def _who(ctx: _Context) -> str:
    return f"pod {ctx.pod.key}" if ctx.pod is not None else "the pod"


def _rule_untolerated_taint(ctx: _Context) -> list[Finding]:
    """K8S-PEND-001: the pod lacks a toleration for the taint of the nodes it belongs on."""
    if ctx.verdict not in (CONSTRAINT, AMBIGUOUS):
        return []
    if ctx.evaluated:
        if ctx.best is None or not ctx.best.taints:
            return []
        taints = ", ".join(t.text() for t in ctx.best.taints)
        pool = ctx.best.result.node.pool
        where = f"{ctx.scheduled_on}" if ctx.scheduled_on else f"{ctx.best.result.node.name}"
        evidence = [
            *(f"node {ctx.best.result.node.name}: untolerated taint {t.text()}" for t in ctx.best.taints),
            *_evidence(ctx),
        ]
        then = (
            f"; with the toleration the scheduler places it on {where}"
            if ctx.scheduled_on
            else ("; with the toleration it still needs capacity (see below)")
        )
        return [
            make_finding(
                "K8S-PEND-001",
                f"untolerated taint {taints} on the nodes {_who(ctx)} belongs on"
                + (f" (pool {pool})" if pool else "")
                + then,
                evidence,
            )
        ]
    hit = [r for r in _text_reasons(ctx) if r.reason == "untolerated_taint" and not r.expected_exclusion]
    if not hit:
        return []
    named = [f"{r.taint_key}={r.taint_value}" if r.taint_value else f"{r.taint_key}" for r in hit if r.taint_key]
    count = sum(r.count for r in hit)
    if named:
        summary = f"{count} node(s) had untolerated taint {', '.join(dict.fromkeys(named))}: add the toleration"
    else:
        summary = (
            f"{count} node(s) had untolerated taint(s) this scheduler version does not name"
            + (
                " (Kubernetes 1.35+ hides the key)"
                if ctx.message is not None and ctx.message.era == "taint_v135"
                else ""
            )
            + (
                ": a missing toleration explains the Pending pod as well as GPU capacity does (K8S-PEND-004)"
                if ctx.verdict == AMBIGUOUS
                else ""
            )
            + ": run invoke k8s.diagnose-pending --pod P --namespace NS (live) or --snapshot DIR to name them from the "
            "nodes"
        )
    return [make_finding("K8S-PEND-001", summary, _evidence(ctx, ["untolerated_taint"]))]


def _rule_selector(ctx: _Context) -> list[Finding]:
    """K8S-PEND-002: no node matches the pod's nodeSelector / required node affinity."""
    if ctx.verdict != CONSTRAINT:
        return []
    if ctx.evaluated:
        if ctx.best is not None and ctx.best.selector:
            change = ", ".join(f"{k}={v}" for k, v in ctx.best.selector.items())
            wanted = ", ".join(f"{k}={ctx.pod.node_selector.get(k)}" for k in ctx.best.selector) if ctx.pod else ""
            return [
                make_finding(
                    "K8S-PEND-002",
                    f"no node has {wanted} (the pod's nodeSelector); the nodes it fits have {change}: "
                    f"set nodeSelector {change}",
                    _evidence(ctx),
                )
            ]
        if ctx.best is None and ctx.pod is not None and (ctx.pod.node_selector or ctx.pod.required_terms is not None):
            selector = ", ".join(f"{k}={v}" for k, v in ctx.pod.node_selector.items()) or "required node affinity"
            return [
                make_finding(
                    "K8S-PEND-002",
                    f"no node satisfies {_who(ctx)}'s {selector} together with its other constraints",
                    _evidence(ctx),
                )
            ]
        return []
    reasons = _text_reasons(ctx)
    if _text_constraint(reasons) != "node_affinity_mismatch":
        return []
    count = sum(r.count for r in reasons if r.reason == "node_affinity_mismatch")
    return [
        make_finding(
            "K8S-PEND-002",
            f"{count} node(s) did not match the pod's node affinity/selector and no other node takes it",
            _evidence(ctx, ["node_affinity_mismatch"]),
        )
    ]


def _text_constraint(reasons: Sequence[Reason]) -> str | None:
    """The constraint reasons point at: a taint, another hard constraint, or the node selector (in that order)."""
    labels = [r.reason for r in reasons if not r.expected_exclusion]
    if "untolerated_taint" in labels:
        return "untolerated_taint"
    other = [label for label in labels if label in _OTHER_CONSTRAINTS]
    if other:
        return other[0]
    if "node_affinity_mismatch" in labels:
        return "node_affinity_mismatch"
    return None


def _rule_other_constraint(ctx: _Context) -> list[Finding]:
    """K8S-PEND-003: a hard constraint other than taints and node selection (pod (anti-)affinity, topology spread,
    host ports, volumes, node name)."""
    if ctx.verdict != CONSTRAINT:
        return []
    if ctx.evaluated:
        if ctx.best is not None or ctx.pod is None or ctx.pod.node_selector or ctx.pod.required_terms is not None:
            return []
        return [
            make_finding(
                "K8S-PEND-003",
                f"every node fails a hard constraint of {_who(ctx)} (node name or host ports)",
                _evidence(ctx),
            )
        ]
    reasons = _text_reasons(ctx)
    if _text_constraint(reasons) not in _OTHER_CONSTRAINTS:
        return []
    items = [r for r in reasons if r.reason in _OTHER_CONSTRAINTS]
    summary = ", ".join(f"{r.reason} x{r.count}" for r in items)
    return [
        make_finding(
            "K8S-PEND-003", f"blocked by a hard constraint: {summary}", _evidence(ctx, list(_OTHER_CONSTRAINTS))
        )
    ]


def _lacking(ctx: _Context) -> list[tuple[str, str]]:
    """(resource, detail) the pod lacks on its best node, or from the message."""
    if ctx.evaluated:
        if ctx.best is None:
            return []
        return [(f.resource or "", f.detail) for f in ctx.best.lacking]
    if ctx.message is None and not ctx.events.autoscaler():
        return []
    reasons = list(ctx.message.reasons if ctx.message else ()) + [r for m in ctx.events.autoscaler() for r in m.reasons]
    return [(r.resource or r.reason, r.raw) for r in reasons if r.kind == CAPACITY and r.resource]


def _is_gpu(resource: str, gpu_resource: str) -> bool:
    return resource == gpu_resource or resource.lower().endswith("/gpu") or resource.startswith("nvidia.com/mig-")


def _rule_gpu_capacity(ctx: _Context) -> list[Finding]:
    """K8S-PEND-004: no node of the pod's pool has the GPUs it requests free."""
    if ctx.verdict not in (CAPACITY, CONSTRAINT, AMBIGUOUS) or (ctx.verdict == CONSTRAINT and not ctx.evaluated):
        return []
    gpu = [(res, detail) for res, detail in _lacking(ctx) if _is_gpu(res, ctx.gpu_resource)]
    if not gpu:
        return []
    where = ""
    if ctx.best is not None and ctx.pod is not None:
        node = ctx.best.result.node
        where = f" on pool {node.pool or node.name}" if _offers(ctx.best.result, ctx.pod) else " (no node has GPUs)"
    lines = [detail for _res, detail in gpu]
    unless = " (unless the untolerated taint(s) hide the GPU pool: K8S-PEND-001)" if ctx.verdict == AMBIGUOUS else ""
    return [
        make_finding(
            "K8S-PEND-004",
            f"not enough free {gpu[0][0]}{where}{unless}: " + "; ".join(dict.fromkeys(lines)),
            [*lines, *_evidence(ctx)],
        )
    ]


def _rule_other_capacity(ctx: _Context) -> list[Finding]:
    """K8S-PEND-005: CPU, memory, pods, volumes or another resource is short on every node the pod could use."""
    if ctx.verdict not in (CAPACITY, CONSTRAINT, AMBIGUOUS) or (ctx.verdict == CONSTRAINT and not ctx.evaluated):
        return []
    other = [(res, detail) for res, detail in _lacking(ctx) if not _is_gpu(res, ctx.gpu_resource)]
    if not other:
        return []
    lines = [detail for _res, detail in other]
    return [
        make_finding(
            "K8S-PEND-005",
            "not enough " + ", ".join(dict.fromkeys(r for r, _ in other)) + ": " + "; ".join(dict.fromkeys(lines)),
            [*lines, *_evidence(ctx)],
        )
    ]


def _rule_node_state(ctx: _Context) -> list[Finding]:
    """K8S-PEND-006: the nodes that would take the pod are cordoned, not ready, unreachable, under pressure or
    being deleted."""
    if ctx.verdict != NODE_STATE:
        return []
    if ctx.evaluated:
        lines = [f"node {r.node.name}: {f.detail}" for r in ctx.state_nodes for f in r.failures if f.node_state]
        names = ", ".join(r.node.name for r in ctx.state_nodes)
        return [
            make_finding(
                "K8S-PEND-006",
                f"only node state keeps {_who(ctx)} off {names}: fix the node(s); never tolerate node-health taints",
                [*lines, *_evidence(ctx)],
            )
        ]
    states = [r for r in _text_reasons(ctx) if r.kind == NODE_STATE]
    if not states:
        return []
    summary = ", ".join(f"{r.reason} x{r.count}" for r in states)
    return [
        make_finding(
            "K8S-PEND-006",
            f"nodes unavailable: {summary}; fix the nodes, never tolerate node-health taints",
            _evidence(ctx),
        )
    ]


def _rule_pool_max(ctx: _Context) -> list[Finding]:
    """K8S-PEND-007: the pool cannot grow: at maxCount, autoscaling off, or the autoscaler says max size reached."""
    lines: list[str] = []
    for m in ctx.events.autoscaler():
        if m.count("max_group_size"):
            lines.append(m.text)
        if m.scale_up_failure is not None:
            lines.append(m.text)
    if ctx.capacity is not None and "max_count" in ctx.capacity.raise_:
        lines.extend(line for line in ctx.capacity.lines if "maxCount" in line or "autoscaling is off" in line)
    if not lines:
        return []
    failure = next((m.scale_up_failure for m in ctx.events.autoscaler() if m.scale_up_failure), None)
    capacity = ctx.capacity
    pool = capacity.pool if capacity is not None else None
    if failure is not None and failure.min is not None and failure.target is not None and failure.target < failure.min:
        summary = (
            f"pool {failure.group}: the autoscaler refuses target size {failure.target} outside "
            f"min {failure.min} / max {failure.max}: scale the pool to at least minCount by hand"
        )
    elif pool:
        summary = f"node pool {pool} cannot add nodes: raise its maxCount (invoke aks.pools)"
    else:
        summary = "the cluster autoscaler's node group is at its maximum size: raise the pool's maxCount"
    # The command with the user's own values where known, <marked> placeholders for the rest.
    command = (
        capacity.pool_command
        if capacity is not None and capacity.pool_command
        else nodepool_update(ctx.resource_group, ctx.cluster, pool, None, None)
    )
    look = (
        f"invoke aks.pools --cluster {placeholder(ctx.cluster, 'cluster')} "
        f"--resource-group {placeholder(ctx.resource_group, 'resource-group')}"
    )
    finding = make_finding("K8S-PEND-007", summary, lines)
    remedy = f"raise the pool's maxCount (keep vCPU quota for it): `{command}`; check: `{look}`"
    return [replace(finding, remedy=remedy)]


def _rule_quota(ctx: _Context) -> list[Finding]:
    """K8S-PEND-008: the vCPU quota the pool draws on has no room for the pool's next node: its VM family's, the
    regional vCPU total (``cores``), or both; a Spot pool: the regional low-priority quota (lowPriorityCores).

    The summary names exactly the quota(s) that bind (never the family's when only the regional total is full) and
    the remedy the ``invoke quota.request --family`` of each."""
    capacity = ctx.capacity
    if capacity is None or "quota" not in capacity.raise_ or not capacity.binding:
        return []
    lines = [line for line in capacity.lines if "quota" in line or "regional" in line]
    summary = "no vCPU quota for the next node: " + "; ".join(line for _name, line in capacity.binding)
    requests = [c for c in capacity.commands if c.startswith("invoke quota.request")]
    plan = [c for c in capacity.commands if c.startswith("invoke quota.plan")]
    remedy = (
        f"raise {capacity.quota_names()}: "
        + "; ".join(f"`{c}`" for c in requests)
        + (f" (weigh it first: `{plan[0]}`)" if plan else "")
    )
    finding = make_finding("K8S-PEND-008", summary, [*lines, *capacity.commands])
    return [replace(finding, remedy=remedy)]


def _rule_autoscaler(ctx: _Context) -> list[Finding]:
    """K8S-PEND-009: the autoscaler will not add a node: the pod would not fit a new node, or scale-up backs off."""
    lines: list[str] = []
    parts: list[str] = []
    for m in ctx.events.autoscaler():
        if m.wouldnt_fit:
            parts.append("it would not fit on a new node of any pool (requests above what a node offers)")
            lines.append(m.text)
        if m.count("scale_up_backoff"):
            parts.append("scale-up is in backoff after a failed scale-up (VMSS quota, allocation failure, subnet IPs)")
            lines.append(m.text)
    if not parts:
        return []
    return [
        make_finding(
            "K8S-PEND-009", "cluster autoscaler: " + "; ".join(dict.fromkeys(parts)), list(dict.fromkeys(lines))
        )
    ]


_RULES = (
    _rule_untolerated_taint,
    _rule_selector,
    _rule_other_constraint,
    _rule_gpu_capacity,
    _rule_other_capacity,
    _rule_node_state,
    _rule_pool_max,
    _rule_quota,
    _rule_autoscaler,
)


# --- the diagnosis ---------------------------------------------------------------------------------------------


def diagnose_pending(
    text: str = "",
    snapshot: Snapshot | None = None,
    pools: Sequence[NodePool] = (),
    usages: Sequence[QuotaUsage] = (),
    *,
    gpu_resource: str = "nvidia.com/gpu",
    cluster: str = "",
    resource_group: str = "",
    location: str = "",
    source: str = "--events",
) -> PendingDiagnosis:
    """Decide why the pod is Pending from the messages in ``text`` and/or ``snapshot`` (see the module docstring).

    ``text`` (named ``source``) over the input cap (:func:`remediation.core.parsers.check_size`) raises ``K8sError``."""
    from remediation.core.parsers import check_size
    from remediation.k8s.errors import K8sError

    check_size(text, source, K8sError)
    events = _messages(text, snapshot)
    message = events.scheduler()
    pod = snapshot.pod if snapshot is not None else None
    autos = events.autoscaler()
    verdict = text_verdict(
        events.facts_reasons(),
        message.preemption_kind if message else None,
        any(m.wouldnt_fit for m in autos),
        any(m.scale_up_failure is not None for m in autos),
    )
    results: tuple[NodeResult, ...] = ()
    best: Candidate | None = None
    state_nodes: tuple[NodeResult, ...] = ()
    fix: PodFix | None = None
    scheduled_on: str | None = None
    notes: list[str] = []
    evaluated = pod is not None and snapshot is not None and bool(snapshot.nodes)
    capacity_needed = False
    if evaluated and pod is not None and snapshot is not None:
        results = evaluate(pod, snapshot.nodes, snapshot.pods)
        fits = [r.node.name for r in results if r.fits]
        candidates, state_only = _candidates(pod, results)
        candidates.sort(key=lambda c: _rank(pod, c))
        if fits:
            verdict = None
            notes.append(
                f"the pod fits on {', '.join(fits)} as it is: the scheduler should place it (or it already has)"
            )
        elif candidates:
            best = candidates[0]
            capacity_needed = bool(best.lacking)
            verdict = CONSTRAINT if best.fixes else CAPACITY
        elif state_only:
            verdict = NODE_STATE
            state_nodes = tuple(state_only)
        else:
            verdict = CONSTRAINT
            notes.append(
                "every node fails a constraint no patch here can change (required node affinity, node "
                "name, host ports): the pod spec must change"
            )
        if best is not None and best.fixes:
            tolerations: list[Toleration] = [toleration_for(t) for t in dict.fromkeys(best.taints)]
            fix = build_fix(pod, tolerations, best.selector)
            patched = pod_from_dict(apply_patch(pod.raw, fix.spec_ops), "patched pod")
            after = evaluate(patched, snapshot.nodes, snapshot.pods)
            placed = [r.node.name for r in after if r.fits]
            scheduled_on = best.result.node.name if best.result.node.name in placed else (placed[0] if placed else None)
            if scheduled_on is None and not capacity_needed:
                notes.append("the patched pod still does not fit: see the nodes' failures")
        if message is not None and message.era == "taint_v135" and best is not None and best.taints:
            notes.append(
                "the message (Kubernetes 1.35+) does not name the taint; the nodes do: "
                + ", ".join(t.text() for t in best.taints)
            )
        if snapshot is not None and pod is not None and pod.node_name and pod.phase not in ("Pending", ""):
            notes.append(f"pod is {pod.phase} on {pod.node_name}: not Pending")
    elif message is not None and any(r.reason == "untolerated_taint" and not r.taint_key for r in message.reasons):
        hidden = (
            "the message (Kubernetes 1.35+) does not name the taint"
            if message.era == "taint_v135"
            else "the message does not name the taint"
        )
        notes.append(
            hidden
            + (": a missing toleration and GPU capacity explain it equally" if verdict == AMBIGUOUS else "")
            + "; replay the scheduler's filters on the nodes: invoke k8s.diagnose-pending --pod P --namespace NS "
            "(live) or --snapshot DIR"
        )
    capacity: CapacityAdvice | None = None
    at_max = any(m.count("max_group_size") for m in autos) and bool(pools or usages)
    if verdict in (CAPACITY, AMBIGUOUS) or capacity_needed or at_max:
        gpus = _gpu_request(pod, gpu_resource) if pod is not None else 0
        node = best.result.node if best is not None else None
        offers = node is not None and node.allocatable.get(gpu_resource, Decimal(0)) > 0
        per_node = int(node.allocatable.get(gpu_resource, Decimal(0))) if node is not None and offers else None
        region = location or (node.region if node is not None else "")
        if pools or usages or gpus or (message is not None and message.count("insufficient_gpu")):
            capacity = advise(
                pools,
                usages,
                pool=node.pool if node is not None and offers else None,
                gpus_wanted=gpus or 1,
                gpus_per_node=per_node,
                vm_size=node.vm_size if node is not None and offers else None,
                cluster=cluster,
                resource_group=resource_group,
                location=region,
            )
    ctx = _Context(
        pod,
        events,
        message,
        verdict,
        best,
        state_nodes,
        fix,
        scheduled_on,
        capacity,
        evaluated,
        gpu_resource,
        cluster,
        resource_group,
    )
    findings = [f for rule in _RULES for f in rule(ctx)]
    return PendingDiagnosis(
        pod=pod.key if pod is not None else None,
        events=events,
        message=message,
        verdict=verdict,
        nodes=results,
        fits_now=tuple(r.node.name for r in results if r.fits),
        fix=fix,
        scheduled_on=scheduled_on,
        capacity=capacity,
        findings=tuple(findings),
        notes=tuple(notes),
    )


def diagnose_text(text: str) -> tuple[dict[str, Any], list[Finding]]:
    """The ``invoke diagnose`` handler of ``failed-scheduling`` and ``k8s-events``: facts and findings of text."""
    result = diagnose_pending(text)
    return result.facts(), list(result.findings)


def reasons_text(reasons: Sequence[Reason]) -> str:
    return ", ".join(f"{r.reason} x{r.count}" for r in reasons)
