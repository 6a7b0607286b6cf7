"""A cluster snapshot for the diagnoses: a pod, the nodes, the cluster's pods, events; from a directory of
``kubectl get -o json`` files or (:mod:`remediation.k8s.live`) from the API.

Directory layout (every file optional except where a diagnosis needs it)::

    pod.json       kubectl get pod P -n NS -o json
    nodes.json     kubectl get nodes -o json
    pods.json      kubectl get pods -A -o json            (node load: what the node's pods request)
    events.json    kubectl get events -n NS -o json       (FailedScheduling, NotTriggerScaleUp, Evicted, ...)
    events.txt     kubectl describe pod P -n NS           (the Events table, read as text)
    pools.json     AKS agent pools as ARM lists them      (capacity verdict; or --pools FILE)
    usages.json    compute usages as ARM lists them       (capacity verdict; or --usages FILE)
    logs/          model-server logs (*.log, *.txt)       (latency: kubectl logs [--previous])
    facts.json     invoke audit --format json             (latency: the node's GPU temperature and throttling)
    metrics.prom   cAdvisor / kubelet metrics             (latency: CPU throttling of the pod and its neighbours)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remediation.k8s.errors import SnapshotError
from remediation.k8s.objects import (
    Event,
    Node,
    Pod,
    event_from_dict,
    items_from_dict,
    node_from_dict,
    pod_from_dict,
)

__all__ = ["Snapshot", "load_json", "load_snapshot", "read_text"]


@dataclass(frozen=True)
class Snapshot:
    pod: Pod | None
    nodes: tuple[Node, ...] = ()
    pods: tuple[Pod, ...] = ()
    events: tuple[Event, ...] = ()
    events_text: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def pod_events(self) -> tuple[Event, ...]:
        """Events about the snapshot's pod (all events when there is no pod), oldest first."""
        if self.pod is None:
            return tuple(sorted(self.events, key=lambda e: e.time))
        mine = [e for e in self.events if e.kind in ("Pod", "") and e.name == self.pod.name]
        return tuple(sorted(mine, key=lambda e: e.time))

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)


def load_json(path: Path) -> Any:
    """A JSON file; :class:`SnapshotError` naming the file when it is missing or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SnapshotError(f"{path} is not JSON ({exc}); write it with kubectl get ... -o json") from None


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc.strerror}") from None


def load_snapshot(directory: str | Path, need_pod: bool = True) -> Snapshot:
    """The snapshot in ``directory`` (see the module docstring)."""
    root = Path(directory)
    if not root.is_dir():
        raise SnapshotError(f"--snapshot {directory}: not a directory (pod.json, nodes.json, ... written by kubectl)")
    pod_path = root / "pod.json"
    pod = pod_from_dict(load_json(pod_path), str(pod_path)) if pod_path.exists() else None
    if pod is None and need_pod:
        raise SnapshotError(f"{pod_path} is missing: kubectl get pod NAME -n NS -o json > {pod_path}")
    nodes: tuple[Node, ...] = ()
    if (root / "nodes.json").exists():
        path = root / "nodes.json"
        nodes = tuple(node_from_dict(n, str(path)) for n in items_from_dict(load_json(path), "Node", str(path)))
    pods: tuple[Pod, ...] = ()
    if (root / "pods.json").exists():
        path = root / "pods.json"
        pods = tuple(pod_from_dict(p, str(path)) for p in items_from_dict(load_json(path), "Pod", str(path)))
    events: tuple[Event, ...] = ()
    if (root / "events.json").exists():
        path = root / "events.json"
        events = tuple(event_from_dict(e) for e in items_from_dict(load_json(path), "Event", str(path)))
    events_text = read_text(root / "events.txt") if (root / "events.txt").exists() else ""
    return Snapshot(pod, nodes, pods, events, events_text, str(root))
