"""Why an inference pod's latency spiked (runbook S5): restarts and their cause, model load time, the node's GPU
heat and throttling, CPU-throttled neighbours; each finding with the template values that apply its fix.

Inputs (a snapshot directory, see :mod:`remediation.k8s.snapshot`): the pod (restart counts, last state,
conditions, probes), the cluster's pods (neighbours on the same node), events (evictions, preemptions, drains,
spot reclaims, probe failures), the model server's logs, the audit's facts of the node (``invoke audit --format
json``), cAdvisor metrics (``container_cpu_cfs_throttled_periods_total`` / ``container_cpu_cfs_periods_total``).

Decisions:

- A restart's cause is its container's ``lastState.terminated.reason``: ``OOMKilled`` -> K8S-LAT-001; anything
  else (``Error``, exit codes, liveness kills seen in the events) -> K8S-LAT-006.
- A replaced pod (K8S-LAT-002): ``status.reason: Evicted``, the ``DisruptionTarget`` condition
  (``EvictionByEvictionAPI`` = drain or eviction API, ``PreemptionByScheduler``, ``DeletionByTaintManager``,
  ``TerminationByKubelet``), and events about the pod or its siblings (same ``generateName``) or its node:
  ``Evicted``, ``Preempted``/``Preempting``, ``TaintManagerEviction``, ``NodeNotSchedulable`` (a drain's
  cordon), a preempt/eviction notice on a spot node.
- Model load (K8S-LAT-003) from the logs (:mod:`remediation.k8s.modelload`), at or above ``slow_load_s``.
- Probes (K8S-LAT-004): the serving container has no readiness probe, or only a TCP one; or a liveness probe whose
  budget (initial delay + period x failures) is shorter than the measured load and no startup probe.
- GPU heat: the host audit's own rules (GPU-THM-001/002/003) on the node's facts.
- CPU (K8S-LAT-005): the server's CFS throttled share at or above ``cpu_throttle_ratio``, or neighbours on the node
  (DaemonSet pods aside) that are throttled themselves or run without a CPU limit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml

from remediation.core.errors import ProbeError
from remediation.core.findings import Finding, make_finding
from remediation.k8s.errors import SnapshotError
from remediation.k8s.modelload import ModelLoad
from remediation.k8s.modelload import parse as parse_load
from remediation.k8s.objects import Container, Event, Node, Pod
from remediation.k8s.snapshot import Snapshot

__all__ = ["LatencyDiagnosis", "cpu_throttling", "diagnose_latency", "load_findings", "merge_values"]

#: The endpoint each server answers 200 on only once its model is loaded.
READY_PATHS = {
    "vllm": "/health",
    "tgi": "/health",
    "triton": "/v2/health/ready",
    "torchserve": "/ping",
    "ollama": "/api/tags",
}


def _values(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False)


def _merge(into: dict[str, Any], doc: Mapping[str, Any]) -> None:
    for key, value in doc.items():
        old = into.get(key)
        if isinstance(old, dict) and isinstance(value, Mapping):
            _merge(old, value)
        elif isinstance(old, int | float) and isinstance(value, int | float) and not isinstance(value, bool):
            into[key] = max(old, value)  # two fixes sizing the same budget: the larger covers both
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def merge_values(fixes: Sequence[tuple[str, str]]) -> str:
    """The fixes' template values as ONE values document: each key once (``startup:`` from K8S-LAT-003, -004 and
    -006 is one block), nested keys merged, the larger of two numbers kept. Empty when there are no fixes."""
    merged: dict[str, Any] = {}
    for _fid, text in fixes:
        doc = yaml.safe_load(text)
        if isinstance(doc, Mapping):
            _merge(merged, doc)
    return _values(merged) if merged else ""


def load_findings(load: ModelLoad, slow_load_s: float = 60.0) -> list[Finding]:
    """K8S-LAT-003: a model load at or above ``slow_load_s`` seconds (also the ``model-load`` diagnose kind's rule)."""
    if load.load_seconds is None or load.load_seconds < slow_load_s:
        return []
    server = load.server or "model server"
    model = f" {load.model}" if load.model else ""
    return [
        make_finding(
            "K8S-LAT-003",
            f"{server} loads{model} in {load.load_seconds:.1f} s"
            + (f" ({load.parts()})" if load.parts() else "")
            + f": every (re)start is a {load.load_seconds:.0f} s latency hole",
            load.evidence[-5:],
        )
    ]


@dataclass(frozen=True)
class Restart:
    container: str
    count: int
    reason: str
    exit_code: int | None
    finished: str


@dataclass(frozen=True)
class Disruption:
    kind: str  # evicted | drain | preempted | spot_reclaim | taint_eviction | node_shutdown
    detail: str


@dataclass(frozen=True)
class Neighbour:
    pod: str
    throttled: float | None
    cpu_limited: bool


@dataclass(frozen=True)
class LatencyDiagnosis:
    pod: str
    node: str
    restarts: tuple[Restart, ...]
    disruptions: tuple[Disruption, ...]
    load: ModelLoad | None
    throttled: float | None
    neighbours: tuple[Neighbour, ...]
    gpu_host: str | None
    findings: tuple[Finding, ...]
    fixes: tuple[tuple[str, str], ...]  # (finding id, template values that apply the fix)
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "restarts": [r.__dict__ for r in self.restarts],
            "disruptions": [d.__dict__ for d in self.disruptions],
            "load_seconds": self.load.load_seconds if self.load else None,
            "server": self.load.server if self.load else None,
            "cpu_throttled": self.throttled,
            "neighbours": [n.__dict__ for n in self.neighbours],
            "gpu_facts_host": self.gpu_host,
            "findings": [f.to_dict() for f in self.findings],
            "template_values": {fid: values for fid, values in self.fixes},
            "notes": list(self.notes),
        }


# --- metrics ---------------------------------------------------------------------------------------------------

_METRIC = re.compile(r"^(?P<name>container_cpu_cfs_(?:throttled_)?periods_total)\{(?P<labels>[^}]*)\}\s+(?P<v>\S+)")
_LABEL = re.compile(r'(?<!\w)(\w+)="((?:[^"\\]|\\.)*)"')


def cpu_throttling(metrics: str) -> dict[str, float]:
    """``namespace/pod`` -> share of CFS periods throttled, from cAdvisor metrics text (containers summed)."""
    throttled: dict[str, float] = {}
    periods: dict[str, float] = {}
    for line in metrics.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if labels.get("container", "") in ("", "POD") or not labels.get("pod"):
            continue
        key = f"{labels.get('namespace', '')}/{labels['pod']}"
        try:
            value = float(m.group("v"))
        except ValueError:
            continue
        table = throttled if "throttled" in m.group("name") else periods
        table[key] = table.get(key, 0.0) + value
    return {k: throttled.get(k, 0.0) / v for k, v in periods.items() if v > 0}


# --- the pieces --------------------------------------------------------------------------------------------------


def _server_container(pod: Pod) -> tuple[Container | None, Mapping[str, Any]]:
    spec = pod.raw.get("spec", {}) if isinstance(pod.raw.get("spec"), Mapping) else {}
    raws = (
        [c for c in spec.get("containers", []) if isinstance(c, Mapping)]
        if isinstance(spec.get("containers"), list)
        else []
    )
    for container, raw in zip(pod.containers, raws, strict=False):
        if any("gpu" in name for name in container.effective_requests()):
            return container, raw
    return (pod.containers[0], raws[0]) if pod.containers and raws else (None, {})


def _restarts(pod: Pod) -> list[Restart]:
    return [
        Restart(s.name, s.restart_count, s.last_reason or "unknown", s.last_exit_code, s.last_finished)
        for s in pod.statuses
        if s.restart_count > 0
    ]


def _related(pod: Pod, event: Event) -> bool:
    meta = pod.raw.get("metadata", {}) if isinstance(pod.raw.get("metadata"), Mapping) else {}
    raw_prefix = meta.get("generateName")
    prefix = raw_prefix if isinstance(raw_prefix, str) else ""
    if event.kind in ("Pod", ""):
        return event.name == pod.name or (bool(prefix) and event.name.startswith(prefix))
    return event.kind == "Node" and event.name == pod.node_name


_SPOT = re.compile(r"\bpreempt|\bspot\b|evict(?:ion)? notice|scheduled ?event", re.I)


def _disruptions(pod: Pod, events: Sequence[Event], on_spot: bool) -> list[Disruption]:
    out: list[Disruption] = []
    if pod.reason == "Evicted":
        out.append(Disruption("evicted", pod.message or "pod evicted"))
    if pod.reason in ("NodeShutdown", "Terminated", "Shutdown"):
        out.append(Disruption("node_shutdown", pod.message or "node shut down"))
    condition = pod.condition("DisruptionTarget")
    if condition is not None and condition[1] == "True":
        kind = {
            "EvictionByEvictionAPI": "drain",
            "PreemptionByScheduler": "preempted",
            "PreemptionByKubeScheduler": "preempted",
            "DeletionByTaintManager": "taint_eviction",
            "TerminationByKubelet": "evicted",
        }.get(condition[2], "evicted")
        out.append(Disruption(kind, f"DisruptionTarget {condition[2]}: {condition[3]}".rstrip(": ")))
    for e in events:
        if not _related(pod, e):
            continue
        text = f"{e.reason}: {e.message}"
        if e.reason == "Evicted":
            out.append(Disruption("evicted", text))
        elif e.reason in ("Preempted", "Preempting"):
            out.append(Disruption("preempted", text))
        elif e.reason == "TaintManagerEviction":
            out.append(Disruption("taint_eviction", text))
        elif e.reason == "NodeNotSchedulable" or "drain" in e.message.lower():
            out.append(Disruption("drain", text))
        elif e.kind == "Node" and (on_spot or "spot" in text.lower()) and _SPOT.search(text):
            out.append(Disruption("spot_reclaim", text))
        elif e.reason in ("Shutdown", "NodeShutdown"):
            out.append(Disruption("node_shutdown", text))
    return list(dict.fromkeys(out))


def _gpu_facts(doc: Any, node: str) -> tuple[Any, str | None]:
    """The node's HostFacts from an audit document (or a single facts document), and its host name."""
    from remediation.core.facts import facts_from_dict

    if not isinstance(doc, Mapping):
        raise SnapshotError("facts: expected the JSON of invoke audit --format json (or one host's facts)")
    try:
        if str(doc.get("schema", "")).startswith("gpufleet.audit/"):
            hosts = [h for h in doc.get("hosts", []) if isinstance(h, Mapping) and isinstance(h.get("facts"), Mapping)]
            match = [h for h in hosts if h.get("host") == node or h["facts"].get("hostname") == node]
            if not match and len(hosts) == 1:
                match = hosts
            if not match:
                return None, None
            return facts_from_dict(match[0]["facts"], str(match[0].get("host"))), str(match[0].get("host"))
        facts = facts_from_dict(doc)
        return facts, facts.host
    except ProbeError as exc:
        raise SnapshotError(f"facts: {exc}") from None


def _probe_budget(probe: Mapping[str, Any]) -> float:
    def num(key: str, default: float) -> float:
        value = probe.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

    return num("initialDelaySeconds", 0) + num("periodSeconds", 10) * num("failureThreshold", 3)


def _memory_fix(container: Container | None) -> str:
    limit = container.limits.get("memory") if container is not None else None
    if limit is None:
        return "64Gi"
    gib = math.ceil(float(limit * Decimal("1.5")) / 2**30)
    return f"{gib}Gi"


# --- the diagnosis ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Case:
    """What the latency rules read: the pod, its node and model server, and what the logs, events and metrics say."""

    pod: Pod
    node: Node | None
    container: Container | None  # the model server's container
    raw_container: Mapping[str, Any]
    logs: str
    load: ModelLoad | None
    max_load: int  # the startup budget a fix sets: 1.5 x the measured load, in whole minutes, at least 300 s
    restarts: list[Restart]
    probe_kills: list[Event]  # the kubelet's Killing events: "Container X failed liveness probe, will be restarted"
    probe_failures: list[Event]  # its Unhealthy events: "Liveness probe failed: ..." (failures, not kills)
    disruptions: list[Disruption]
    facts_doc: Any
    own: float | None  # the pod's CFS throttled share
    neighbours: list[Neighbour]
    slow_load_s: float
    cpu_throttle_ratio: float
    temp_alert_c: int

    @property
    def load_s(self) -> float | None:
        return self.load.load_seconds if self.load is not None else None

    @property
    def throttled(self) -> bool:
        return self.own is not None and self.own >= self.cpu_throttle_ratio


@dataclass
class _Outcome:
    """What one rule adds: findings, (finding id, template values) fixes, notes; the GPU rule also the host."""

    findings: list[Finding] = field(default_factory=list)
    fixes: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpu_host: str | None = None


@dataclass(frozen=True)
class _LatencyRule:
    """One cause of a latency spike: ``check(case)`` says whether it is there and what fixes it."""

    name: str
    check: Callable[[_Case], _Outcome]


def _oom_restarts(case: _Case) -> _Outcome:
    oom = [r for r in case.restarts if r.reason == "OOMKilled"]
    if not oom:
        return _Outcome()
    finding = make_finding(
        "K8S-LAT-001",
        ", ".join(f"container {r.container} restarted {r.count}x, last OOMKilled" for r in oom)
        + (f"; each restart reloads the model ({case.load_s:.0f} s)" if case.load_s else ""),
        [
            f"{r.container}: restartCount {r.count}, lastState terminated OOMKilled (exit {r.exit_code}) at "
            f"{r.finished or '?'}"
            for r in oom
        ],
    )
    return _Outcome([finding], [("K8S-LAT-001", _values({"resources": {"memory": _memory_fix(case.container)}}))])


def _other_restarts(case: _Case) -> _Outcome:
    other = [r for r in case.restarts if r.reason != "OOMKilled"]
    if not (other or case.probe_kills):
        return _Outcome()
    parts = [
        f"container {r.container} restarted {r.count}x, last {r.reason}"
        + (f" (exit {r.exit_code})" if r.exit_code is not None else "")
        for r in other
    ]
    if case.probe_kills:
        # A kill is one Killing event (its count when the kubelet aggregated them); the Unhealthy events before it
        # are the probe's failures (failureThreshold of them per kill), never added to the kills. Events expire
        # (1 h by default), restartCount does not: it is shown beside the kills, not added to them.
        kills = sum(max(1, e.count) for e in case.probe_kills)
        restarts = sum(r.count for r in case.restarts)
        parts.append(
            f"liveness probe killed it {kills}x" + (f" (restartCount {restarts})" if restarts else "")
        )
    failures = sum(max(1, e.count) for e in case.probe_failures)
    evidence = [
        *(f"{r.container}: restartCount {r.count}, last {r.reason} exit {r.exit_code}" for r in other),
        *(f"{e.reason} (x{max(1, e.count)}): {e.message}" for e in case.probe_kills),
        *([f"liveness probe failures (Unhealthy events): {failures}"] if failures else []),
    ]
    finding = make_finding("K8S-LAT-006", "; ".join(parts), evidence)
    return _Outcome([finding], [("K8S-LAT-006", _values({"startup": {"maxLoadSeconds": case.max_load}}))])


def _replaced(case: _Case) -> _Outcome:
    if not case.disruptions:
        return _Outcome()
    kinds = ", ".join(dict.fromkeys(d.kind for d in case.disruptions))
    finding = make_finding(
        "K8S-LAT-002",
        f"pod {case.pod.key} was replaced or moved ({kinds}): the new pod reloads the model"
        + (f" ({case.load_s:.0f} s)" if case.load_s else ""),
        [d.detail for d in case.disruptions],
    )
    out = _Outcome([finding])
    values: dict[str, Any] = {"replicas": 2, "model": {"cache": {"enabled": True}}, "dedicated": {"enabled": True}}
    if case.node is not None and case.node.spot:
        values["gpuPool"] = {"name": "A-REGULAR-GPU-POOL"}
        out.notes.append(f"node {case.node.name} is a spot node: inference belongs on a regular (on-demand) pool")
    out.fixes.append(("K8S-LAT-002", _values(values)))
    return out


def _slow_load(case: _Case) -> _Outcome:
    if case.load is None:
        return _Outcome(notes=["the logs hold no model load line"] if case.logs.strip() else [])
    slow = load_findings(case.load, case.slow_load_s)
    values = {"model": {"cache": {"enabled": True}}, "startup": {"maxLoadSeconds": case.max_load}}
    return _Outcome(slow, [("K8S-LAT-003", _values(values))] if slow else [])


def _probes(case: _Case) -> _Outcome:
    if case.container is None:
        return _Outcome()
    name = case.container.name
    readiness = case.raw_container.get("readinessProbe")
    startup = case.raw_container.get("startupProbe")
    liveness = case.raw_container.get("livenessProbe")
    problems = []
    if not isinstance(readiness, Mapping):
        problems.append(f"container {name} has no readiness probe: it takes traffic while loading")
    elif "tcpSocket" in readiness or ("exec" in readiness and not readiness.get("httpGet")):
        problems.append(
            f"container {name}'s readiness probe does not ask the server whether the model is loaded (TCP/exec)"
        )
    load_s = case.load_s
    if (
        isinstance(liveness, Mapping)
        and not isinstance(startup, Mapping)
        and load_s is not None
        and (_probe_budget(liveness) < load_s)
    ):
        problems.append(
            f"liveness probe gives up after {_probe_budget(liveness):.0f} s, the load takes "
            f"{load_s:.0f} s, and there is no startup probe: the load is killed and restarted"
        )
    if not problems:
        return _Outcome()
    server = case.load.server if case.load is not None else None
    values = {
        "readiness": {"path": READY_PATHS.get(server or "", "/health")},
        "startup": {"maxLoadSeconds": case.max_load},
    }
    return _Outcome([make_finding("K8S-LAT-004", "; ".join(problems), problems)], [("K8S-LAT-004", _values(values))])


def _gpu_heat(case: _Case) -> _Outcome:
    from remediation.core.checks.evidence import from_facts
    from remediation.core.checks.policy import Policy
    from remediation.core.checks.thermal import temperature_alert, temperature_slowdown, throttle

    out = _Outcome()
    if case.facts_doc is None:
        return out
    if case.node is None and not case.pod.node_name:
        out.notes.append("the pod is on no node: GPU facts not matched")
    facts, out.gpu_host = _gpu_facts(case.facts_doc, case.pod.node_name)
    if facts is None:
        out.notes.append(f"no host {case.pod.node_name} in the facts document")
        return out
    ev = from_facts(facts, Policy(temp_alert_c=case.temp_alert_c))  # the audit's own GPU-THM rules
    out.findings = [*temperature_alert(ev), *temperature_slowdown(ev), *throttle(ev)]
    if out.findings:
        out.notes.append(
            "GPU heat: lower sustained utilisation (the server's batch size, e.g. vLLM "
            "--max-num-seqs, in the inference values `args`) and alert on DCGM_FI_DEV_GPU_TEMP > "
            f"{case.temp_alert_c} (invoke k8s.alerts)"
        )
    return out


def _cpu(case: _Case) -> _Outcome:
    noisy = [n for n in case.neighbours if (n.throttled or 0) >= case.cpu_throttle_ratio or not n.cpu_limited]
    if not (case.throttled or noisy):
        return _Outcome()
    parts = []
    evidence = []
    if case.throttled:
        parts.append(f"the model server is CPU-throttled in {case.own:.0%} of CFS periods")
        evidence.append(f"{case.pod.key}: container_cpu_cfs_throttled_periods_total / periods = {case.own:.2f}")
    if noisy:
        parts.append(
            f"it shares node {case.pod.node_name} with {len(case.neighbours)} pod(s), "
            f"{len(noisy)} of them CPU-hungry (throttled or without a CPU limit)"
        )
        evidence.extend(
            f"neighbour {n.pod}: "
            + (f"throttled {n.throttled:.0%}" if n.throttled is not None else "no metrics")
            + ("" if n.cpu_limited else ", no CPU limit")
            for n in noisy
        )
    cpu = case.container.effective_requests().get("cpu") if case.container is not None else None
    cpu_values: dict[str, Any] = {"dedicated": {"enabled": True}}
    if case.throttled:
        cpu_values["resources"] = {"cpu": str(math.ceil(cpu * 2)) if cpu is not None else "8"}
    return _Outcome([make_finding("K8S-LAT-005", "; ".join(parts), evidence)], [("K8S-LAT-005", _values(cpu_values))])


_LATENCY_RULES: tuple[_LatencyRule, ...] = (
    _LatencyRule("K8S-LAT-001: a container restarted after an OOM kill", _oom_restarts),
    _LatencyRule("K8S-LAT-006: other restarts, or liveness-probe kills", _other_restarts),
    _LatencyRule("K8S-LAT-002: the pod was replaced or moved (eviction, drain, preemption, spot)", _replaced),
    _LatencyRule("K8S-LAT-003: a slow model load (a note when the logs hold none)", _slow_load),
    _LatencyRule("K8S-LAT-004: probes that let traffic in while loading, or kill the load", _probes),
    _LatencyRule("GPU-THM-*: the node's GPU heat, by the audit's own rules on its facts", _gpu_heat),
    _LatencyRule("K8S-LAT-005: a CPU-throttled server or CPU-hungry neighbours", _cpu),
)


def _neighbours(snapshot: Snapshot, pod: Pod, throttling: Mapping[str, float]) -> list[Neighbour]:
    """The other running pods on the pod's node (DaemonSet pods aside), their throttling and CPU limits."""
    if not pod.node_name:
        return []
    return [
        Neighbour(p.key, throttling.get(p.key), bool(p.containers) and all("cpu" in c.limits for c in p.containers))
        for p in snapshot.pods
        if p.node_name == pod.node_name and p.key != pod.key and not p.terminated and p.owner_kind != "DaemonSet"
    ]


def diagnose_latency(
    snapshot: Snapshot,
    logs: str = "",
    facts_doc: Any = None,
    metrics: str = "",
    *,
    slow_load_s: float = 60.0,
    cpu_throttle_ratio: float = 0.25,
    temp_alert_c: int = 78,
    logs_source: str = "the model server log",
    metrics_source: str = "the metrics text",
) -> LatencyDiagnosis:
    """Restarts, disruptions, model load, probes, GPU heat and CPU contention of ``snapshot``'s pod.

    ``logs`` or ``metrics`` over the input cap (:func:`remediation.core.parsers.check_size`) raise ``SnapshotError``."""
    from remediation.core.parsers import check_size

    check_size(logs, logs_source, SnapshotError)
    check_size(metrics, metrics_source, SnapshotError)
    from remediation.core.checks import evidence, policy, thermal  # noqa: F401  # loaded here as before (for _gpu_heat)

    pod = snapshot.pod
    if pod is None:
        raise SnapshotError(f"{snapshot.source or 'snapshot'}: pod.json is missing (the inference pod)")
    node = snapshot.node(pod.node_name) if pod.node_name else None
    container, raw_container = _server_container(pod)
    load = parse_load(logs) if logs.strip() else None
    load_s = load.load_seconds if load is not None else None
    max_load = max(300, math.ceil((load_s or 0) * 1.5 / 60) * 60)
    restarts = _restarts(pod)
    own = [e for e in snapshot.events if e.kind in ("Pod", "") and e.name == pod.name]  # this pod, not its siblings
    probe_kills = [e for e in own if e.reason == "Killing" and "liveness" in e.message.lower()]
    probe_failures = [e for e in own if e.reason == "Unhealthy" and "liveness" in e.message.lower()]
    disruptions = _disruptions(pod, snapshot.events, bool(node and node.spot))
    throttling = cpu_throttling(metrics) if metrics.strip() else {}
    case = _Case(
        pod=pod,
        node=node,
        container=container,
        raw_container=raw_container,
        logs=logs,
        load=load,
        max_load=max_load,
        restarts=restarts,
        probe_kills=probe_kills,
        probe_failures=probe_failures,
        disruptions=disruptions,
        facts_doc=facts_doc,
        own=throttling.get(pod.key),
        neighbours=_neighbours(snapshot, pod, throttling),
        slow_load_s=slow_load_s,
        cpu_throttle_ratio=cpu_throttle_ratio,
        temp_alert_c=temp_alert_c,
    )
    out = _Outcome()
    for rule in _LATENCY_RULES:  # every rule, in order
        found = rule.check(case)
        out.findings += found.findings
        out.fixes += found.fixes
        out.notes += found.notes
        out.gpu_host = found.gpu_host if found.gpu_host is not None else out.gpu_host
    return LatencyDiagnosis(
        pod=pod.key,
        node=pod.node_name,
        restarts=tuple(case.restarts),
        disruptions=tuple(disruptions),
        load=load,
        throttled=case.own,
        neighbours=tuple(case.neighbours),
        gpu_host=out.gpu_host,
        findings=tuple(out.findings),
        fixes=tuple(out.fixes),
        notes=tuple(out.notes),
    )
