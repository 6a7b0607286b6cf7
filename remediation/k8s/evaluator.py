"""The scheduler's filters, replayed on a snapshot: why each node does (not) take a pod.

Filters in the scheduler's default order: ``NodeUnschedulable`` (cordoned, unless the pod tolerates
``node.kubernetes.io/unschedulable:NoSchedule``), ``NodeName``, ``TaintToleration`` (``NoSchedule`` and
``NoExecute`` taints; ``PreferNoSchedule`` only scores), ``NodeAffinity`` (``nodeSelector`` and the required node
affinity terms: ORed terms, ANDed expressions, operators In/NotIn/Exists/DoesNotExist/Gt/Lt, ``matchFields`` on
``metadata.name``), ``NodePorts`` (host ports taken by pods on the node), ``NodeResourcesFit`` (the pod's requests,
``nvidia.com/gpu`` and every other extended resource included, against allocatable minus what the node's
non-terminated pods request; the pod count against allocatable ``pods``).

Unlike the scheduler, every filter runs on every node, so a node that lacks the toleration *and* the GPUs shows
both: the first failure is what the scheduler would report, the rest is what a fix would run into next. Inter-pod
affinity, topology spread and volume filters need objects a snapshot does not carry; they are not evaluated, and a
node that passes here may still fail them (the scheduler's own message then says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from remediation.k8s.objects import Node, Pod, Taint
from remediation.k8s.quantity import format_quantity
from remediation.k8s.scheduling import NODE_STATE, health_label, reason_class

__all__ = ["Failure", "NodeResult", "evaluate", "evaluate_node", "untolerated"]

UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


@dataclass(frozen=True)
class Failure:
    """One filter that rejects the pod on a node."""

    filter: str  # NodeUnschedulable | NodeName | TaintToleration | NodeAffinity | NodePorts | NodeResourcesFit
    reason: str  # canonical label (see remediation.k8s.scheduling)
    detail: str
    taint: Taint | None = None
    resource: str | None = None
    selector_key: str | None = None  # NodeAffinity: the nodeSelector key that does not match

    @property
    def node_state(self) -> bool:
        """Broken or going away (cordoned, node-health taint): fix the node, never the pod."""
        return reason_class(self.reason) == NODE_STATE

    @property
    def capacity(self) -> bool:
        return self.filter == "NodeResourcesFit"


@dataclass(frozen=True)
class NodeResult:
    node: Node
    failures: tuple[Failure, ...]

    @property
    def fits(self) -> bool:
        return not self.failures

    @property
    def reported(self) -> tuple[Failure, ...]:
        """What the scheduler reports for this node: the failures of the first failing filter."""
        if not self.failures:
            return ()
        first = self.failures[0].filter
        return tuple(f for f in self.failures if f.filter == first)


def untolerated(pod: Pod, taints: Iterable[Taint]) -> list[Taint]:
    """The scheduling taints (NoSchedule/NoExecute) among ``taints`` that no toleration of ``pod`` tolerates."""
    return [
        t
        for t in taints
        if t.effect in ("NoSchedule", "NoExecute") and not any(tol.tolerates(t) for tol in pod.tolerations)
    ]


def _affinity(pod: Pod, node: Node) -> list[Failure]:
    out = []
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            have = node.labels.get(key)
            out.append(
                Failure(
                    "NodeAffinity",
                    "node_affinity_mismatch",
                    f"nodeSelector {key}={value}: node has " + (f"{key}={have}" if have is not None else f"no {key}"),
                    selector_key=key,
                )
            )
    if pod.required_terms is not None and not any(term.matches(node) for term in pod.required_terms):
        terms = " | ".join(t.text() for t in pod.required_terms) or "(no terms)"
        out.append(Failure("NodeAffinity", "node_affinity_mismatch", f"required node affinity not met: {terms}"))
    return out


def _ports(pod: Pod, node_pods: Sequence[Pod]) -> list[Failure]:
    wanted = {p for c in (*pod.containers, *pod.init_containers) for p in c.host_ports}
    if not wanted:
        return []
    taken = {p for other in node_pods for c in (*other.containers, *other.init_containers) for p in c.host_ports}
    clash = sorted(wanted & taken)
    if not clash:
        return []
    ports = ", ".join(f"{port}/{proto}" for port, proto in clash)
    return [Failure("NodePorts", "host_port_conflict", f"host ports in use on the node: {ports}")]


def _resources(pod: Pod, node: Node, node_pods: Sequence[Pod]) -> list[Failure]:
    out = []
    wanted = pod.requests()
    used: dict[str, Decimal] = {}
    for other in node_pods:
        for name, q in other.requests().items():
            used[name] = used.get(name, Decimal(0)) + q
    max_pods = node.allocatable.get("pods")
    if max_pods is not None and len(node_pods) + 1 > max_pods:
        out.append(
            Failure(
                "NodeResourcesFit",
                "too_many_pods",
                f"Too many pods: {len(node_pods)} of {int(max_pods)} running",
                resource="pods",
            )
        )
    for name in sorted(wanted):
        need = wanted[name]
        if name == "pods":
            continue
        alloc = node.allocatable.get(name, Decimal(0))
        free = alloc - used.get(name, Decimal(0))
        if need > free:
            label = {
                "cpu": "insufficient_cpu",
                "memory": "insufficient_memory",
                "ephemeral-storage": "insufficient_ephemeral_storage",
            }.get(name)
            if label is None:
                label = (
                    "insufficient_gpu"
                    if name.endswith("/gpu") or name.startswith("nvidia.com/mig-")
                    else ("insufficient_extended")
                )
            out.append(
                Failure(
                    "NodeResourcesFit",
                    label,
                    f"Insufficient {name}: requests {format_quantity(need, name)}, "
                    f"{format_quantity(max(free, Decimal(0)), name)} free "
                    f"of {format_quantity(alloc, name)} allocatable",
                    resource=name,
                )
            )
    return out


def evaluate_node(pod: Pod, node: Node, node_pods: Sequence[Pod]) -> NodeResult:
    """Every filter of ``pod`` on ``node``; ``node_pods`` are the other non-terminated pods bound to the node."""
    failures: list[Failure] = []
    if node.unschedulable and not any(t.tolerates(UNSCHEDULABLE_TAINT) for t in pod.tolerations):
        failures.append(Failure("NodeUnschedulable", "node_unschedulable", "node is cordoned (spec.unschedulable)"))
    if pod.node_name and pod.node_name != node.name:
        failures.append(Failure("NodeName", "node_name_mismatch", f"pod asks for node {pod.node_name}"))
    for taint in untolerated(pod, node.taints):
        state = health_label(taint.key)
        failures.append(
            Failure(
                "TaintToleration",
                state or "untolerated_taint",
                f"untolerated taint {taint.text()}" + (" (node health: fix the node)" if state else ""),
                taint=taint,
            )
        )
    failures.extend(_affinity(pod, node))
    failures.extend(_ports(pod, node_pods))
    failures.extend(_resources(pod, node, node_pods))
    return NodeResult(node, tuple(failures))


def evaluate(pod: Pod, nodes: Sequence[Node], pods: Sequence[Pod] = ()) -> tuple[NodeResult, ...]:
    """``pod`` against every node; ``pods`` are the cluster's pods (those bound to each node count as its load)."""
    by_node: dict[str, list[Pod]] = {}
    for other in pods:
        same = other.key == pod.key or (bool(pod.uid) and other.uid == pod.uid)
        if other.node_name and not other.terminated and not same:
            by_node.setdefault(other.node_name, []).append(other)
    return tuple(evaluate_node(pod, node, by_node.get(node.name, [])) for node in nodes)
