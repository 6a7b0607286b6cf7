"""The Kubernetes objects the diagnoses read, parsed once from the API's JSON (``kubectl get -o json``).

Only the fields the scheduler's filters and the latency diagnosis use are kept, as frozen dataclasses; the pod's
own JSON stays on :attr:`Pod.raw` for building its patch. ``*_from_dict`` never trusts the document: a field of the
wrong type is read as absent, and only a document that is not an object of the expected kind raises
:class:`~remediation.k8s.errors.SnapshotError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from remediation.k8s.errors import SnapshotError
from remediation.k8s.quantity import parse_quantity

__all__ = [
    "Container",
    "ContainerStatus",
    "Event",
    "Node",
    "Pod",
    "Requirement",
    "Taint",
    "Term",
    "Toleration",
    "event_from_dict",
    "items_from_dict",
    "node_from_dict",
    "pod_from_dict",
]

#: Labels that name a node's pool on AKS (newest first), then other clouds' equivalents.
POOL_LABELS = (
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
)
_SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _labels(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(value).items() if isinstance(v, str | int | float | bool)}


def _resources(value: Any) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for name, raw in _map(value).items():
        quantity = parse_quantity(raw)
        if quantity is not None:
            out[str(name)] = quantity
    return out


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def text(self) -> str:
        """``key=value:Effect`` (``key:Effect`` when the value is empty), the way ``kubectl taint`` writes it."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "value": self.value, "effect": self.effect}
        if not self.value:
            del out["value"]
        return out


@dataclass(frozen=True)
class Toleration:
    key: str  # "" with operator Exists tolerates every taint
    operator: str  # "Equal" | "Exists"
    value: str
    effect: str  # "" = every effect
    toleration_seconds: int | None = None

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration tolerates ``taint`` (the API's ``ToleratesTaint``)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("Equal", ""):
            return bool(self.key) and self.value == taint.value
        return False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator or "Equal"
        if self.operator != "Exists":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` / ``matchFields`` entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return present and value in self.values
        if op == "NotIn":
            return not present or value not in self.values
        if op == "Exists":
            return present
        if op == "DoesNotExist":
            return not present
        if op in ("Gt", "Lt") and present and len(self.values) == 1:
            try:
                have, want = int(str(value)), int(self.values[0])
            except ValueError:
                return False
            return have > want if op == "Gt" else have < want
        return False

    def text(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        return f"{self.key} {self.operator} ({', '.join(self.values)})"


@dataclass(frozen=True)
class Term:
    """A node selector term: every expression and field must match; an empty term matches no node."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...] = ()

    def matches(self, node: Node) -> bool:
        if not self.expressions and not self.fields:
            return False
        return all(r.matches(node.labels) for r in self.expressions) and all(
            r.matches({"metadata.name": node.name}) for r in self.fields
        )

    def text(self) -> str:
        return " and ".join(r.text() for r in (*self.expressions, *self.fields)) or "(empty term)"


def _requirements(value: Any) -> tuple[Requirement, ...]:
    out = []
    for item in _list(value):
        m = _map(item)
        out.append(
            Requirement(
                _str(m.get("key")),
                _str(m.get("operator")),
                tuple(str(v) for v in _list(m.get("values"))),
            )
        )
    return tuple(out)


def _taints(value: Any) -> tuple[Taint, ...]:
    out = []
    for item in _list(value):
        m = _map(item)
        if m.get("key"):
            out.append(Taint(_str(m.get("key")), _str(m.get("value")), _str(m.get("effect"))))
    return tuple(out)


def _tolerations(value: Any) -> tuple[Toleration, ...]:
    out = []
    for item in _list(value):
        m = _map(item)
        out.append(
            Toleration(
                _str(m.get("key")),
                _str(m.get("operator"), "Equal") or "Equal",
                _str(m.get("value")),
                _str(m.get("effect")),
                _int(m.get("tolerationSeconds")),
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Container:
    name: str
    requests: dict[str, Decimal] = field(hash=False)
    limits: dict[str, Decimal] = field(hash=False)
    host_ports: tuple[tuple[int, str], ...] = ()  # (port, protocol)
    restart_policy: str = ""  # "Always" on a sidecar init container

    def effective_requests(self) -> dict[str, Decimal]:
        """Requests, with a limit standing in for a missing request (what the API server defaults)."""
        out = dict(self.limits)
        out.update(self.requests)
        return out


def _container(value: Any) -> Container:
    m = _map(value)
    res = _map(m.get("resources"))
    ports = []
    for p in _list(m.get("ports")):
        port = _int(_map(p).get("hostPort"))
        if port:
            ports.append((port, _str(_map(p).get("protocol"), "TCP") or "TCP"))
    return Container(
        _str(m.get("name")),
        _resources(res.get("requests")),
        _resources(res.get("limits")),
        tuple(ports),
        _str(m.get("restartPolicy")),
    )


@dataclass(frozen=True)
class ContainerStatus:
    name: str
    restart_count: int
    ready: bool
    state: str  # running | waiting | terminated | ""
    state_reason: str
    last_reason: str  # lastState.terminated.reason: OOMKilled, Error, Completed, ...
    last_exit_code: int | None
    last_finished: str
    last_started: str
    last_message: str


def _container_status(value: Any) -> ContainerStatus:
    m = _map(value)
    state = _map(m.get("state"))
    current = next(iter(state), "")
    last = _map(_map(m.get("lastState")).get("terminated"))
    return ContainerStatus(
        name=_str(m.get("name")),
        restart_count=_int(m.get("restartCount")) or 0,
        ready=m.get("ready") is True,
        state=str(current),
        state_reason=_str(_map(state.get(current)).get("reason")) if current else "",
        last_reason=_str(last.get("reason")),
        last_exit_code=_int(last.get("exitCode")),
        last_finished=_str(last.get("finishedAt")),
        last_started=_str(last.get("startedAt")),
        last_message=_str(last.get("message")),
    )


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    uid: str
    labels: dict[str, str] = field(hash=False)
    node_name: str
    node_selector: dict[str, str] = field(hash=False)
    required_terms: tuple[Term, ...] | None  # None: no required node affinity
    tolerations: tuple[Toleration, ...]
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...]
    overhead: dict[str, Decimal] = field(hash=False)
    phase: str
    reason: str  # status.reason (Evicted, NodeShutdown, ...)
    message: str
    owner_kind: str
    owner_name: str
    conditions: tuple[tuple[str, str, str, str], ...]  # (type, status, reason, message)
    statuses: tuple[ContainerStatus, ...]
    raw: Mapping[str, Any] = field(hash=False, compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def requests(self) -> dict[str, Decimal]:
        """What the scheduler reserves for the pod: max(sum of containers, each init container) + overhead."""
        total: dict[str, Decimal] = {}
        for c in self.containers:
            for name, q in c.effective_requests().items():
                total[name] = total.get(name, Decimal(0)) + q
        sidecars: dict[str, Decimal] = {}
        for c in self.init_containers:
            reqs = c.effective_requests()
            if c.restart_policy == "Always":  # sidecar: runs alongside, counts like a container
                for name, q in reqs.items():
                    sidecars[name] = sidecars.get(name, Decimal(0)) + q
                continue
            for name, q in reqs.items():
                total[name] = max(total.get(name, Decimal(0)), q + sidecars.get(name, Decimal(0)))
        for name, q in sidecars.items():
            total[name] = total.get(name, Decimal(0)) + q
        for name, q in self.overhead.items():
            total[name] = total.get(name, Decimal(0)) + q
        return {k: v for k, v in total.items() if v > 0}

    def condition(self, kind: str) -> tuple[str, str, str, str] | None:
        return next((c for c in self.conditions if c[0] == kind), None)


def pod_from_dict(doc: Any, source: str = "pod") -> Pod:
    """A Pod from its API JSON; :class:`SnapshotError` when ``doc`` is not a Pod object."""
    m = _map(doc)
    if not m or m.get("kind", "Pod") != "Pod" or not isinstance(m.get("spec"), Mapping):
        raise SnapshotError(f"{source}: not a Pod object (kubectl get pod NAME -o json writes one)")
    meta, spec, status = _map(m.get("metadata")), _map(m.get("spec")), _map(m.get("status"))
    affinity = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[Term, ...] | None = None
    if isinstance(required, Mapping):
        terms = tuple(
            Term(_requirements(_map(t).get("matchExpressions")), _requirements(_map(t).get("matchFields")))
            for t in _list(required.get("nodeSelectorTerms"))
        )
    owner_kind = owner_name = ""
    for ref in _list(meta.get("ownerReferences")):
        r = _map(ref)
        if r.get("controller") is True or not owner_kind:
            owner_kind, owner_name = _str(r.get("kind")), _str(r.get("name"))
    return Pod(
        name=_str(meta.get("name")),
        namespace=_str(meta.get("namespace"), "default") or "default",
        uid=_str(meta.get("uid")),
        labels=_labels(meta.get("labels")),
        node_name=_str(spec.get("nodeName")),
        node_selector=_labels(spec.get("nodeSelector")),
        required_terms=terms,
        tolerations=_tolerations(spec.get("tolerations")),
        containers=tuple(_container(c) for c in _list(spec.get("containers"))),
        init_containers=tuple(_container(c) for c in _list(spec.get("initContainers"))),
        overhead=_resources(spec.get("overhead")),
        phase=_str(status.get("phase")),
        reason=_str(status.get("reason")),
        message=_str(status.get("message")),
        owner_kind=owner_kind,
        owner_name=owner_name,
        conditions=tuple(
            (
                _str(_map(c).get("type")),
                _str(_map(c).get("status")),
                _str(_map(c).get("reason")),
                _str(_map(c).get("message")),
            )
            for c in _list(status.get("conditions"))
        ),
        statuses=tuple(
            _container_status(s)
            for s in (*_list(status.get("initContainerStatuses")), *_list(status.get("containerStatuses")))
        ),
        raw=m,
    )


@dataclass(frozen=True)
class Node:
    name: str
    labels: dict[str, str] = field(hash=False)
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: dict[str, Decimal] = field(hash=False)
    capacity: dict[str, Decimal] = field(hash=False)
    ready: str  # status of the Ready condition: "True" | "False" | "Unknown" | ""

    @property
    def pool(self) -> str:
        """The node's pool (AKS agent pool label, or another cloud's equivalent); "" when unlabelled."""
        return next((self.labels[k] for k in POOL_LABELS if self.labels.get(k)), "")

    @property
    def vm_size(self) -> str:
        return self.labels.get("node.kubernetes.io/instance-type") or self.labels.get(
            "beta.kubernetes.io/instance-type", ""
        )

    @property
    def region(self) -> str:
        return self.labels.get("topology.kubernetes.io/region") or self.labels.get(
            "failure-domain.beta.kubernetes.io/region", ""
        )

    @property
    def spot(self) -> bool:
        return (
            self.labels.get("kubernetes.azure.com/scalesetpriority") == "spot"
            or self.labels.get("karpenter.sh/capacity-type") == "spot"
        )

    def scheduling_taints(self) -> tuple[Taint, ...]:
        return tuple(t for t in self.taints if t.effect in _SCHEDULING_EFFECTS)


def node_from_dict(doc: Any, source: str = "node") -> Node:
    m = _map(doc)
    if not m or m.get("kind", "Node") != "Node":
        raise SnapshotError(f"{source}: not a Node object (kubectl get nodes -o json writes a list of them)")
    meta, spec, status = _map(m.get("metadata")), _map(m.get("spec")), _map(m.get("status"))
    ready = next(
        (_str(_map(c).get("status")) for c in _list(status.get("conditions")) if _map(c).get("type") == "Ready"), ""
    )
    return Node(
        name=_str(meta.get("name")),
        labels=_labels(meta.get("labels")),
        taints=_taints(spec.get("taints")),
        unschedulable=spec.get("unschedulable") is True,
        allocatable=_resources(status.get("allocatable")),
        capacity=_resources(status.get("capacity")),
        ready=ready,
    )


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    type: str
    count: int
    kind: str  # involvedObject.kind
    name: str  # involvedObject.name
    namespace: str
    component: str  # source.component / reportingController
    time: str  # lastTimestamp / eventTime / firstTimestamp


def event_from_dict(doc: Any) -> Event:
    m = _map(doc)
    involved = _map(m.get("involvedObject") or m.get("regarding"))
    source = _map(m.get("source"))
    series = _map(m.get("series"))
    return Event(
        reason=_str(m.get("reason")),
        message=_str(m.get("message") or m.get("note")),
        type=_str(m.get("type")),
        count=_int(m.get("count")) or _int(series.get("count")) or 1,
        kind=_str(involved.get("kind")),
        name=_str(involved.get("name")),
        namespace=_str(involved.get("namespace")),
        component=_str(source.get("component") or m.get("reportingController") or m.get("reportingComponent")),
        time=_str(
            m.get("lastTimestamp") or m.get("eventTime") or series.get("lastObservedTime") or m.get("firstTimestamp")
        ),
    )


def items_from_dict(doc: Any, kind: str, source: str) -> list[Any]:
    """The items of a ``kind``List document (or a single object of that kind, or a bare JSON list of them)."""
    if isinstance(doc, list):
        return list(doc)
    m = _map(doc)
    if not m:
        raise SnapshotError(f"{source}: expected a JSON object ({kind}List from kubectl get -o json)")
    if isinstance(m.get("items"), list):
        return list(m["items"])
    if m.get("kind") == kind:
        return [m]
    raise SnapshotError(f"{source}: expected a {kind}List (kubectl get ... -o json), got kind {m.get('kind')!r}")
