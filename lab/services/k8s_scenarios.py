"""Recorded clusters for the Kubernetes stand-in, the snapshot tests and the demo: the objects as the API writes
them (``kubectl get -o json``), built as data.

- :func:`runbook_cluster`: runbook S3 exactly: 12 nodes (3 in the GPU pool ``gpunp`` tainted ``sku=gpu:NoSchedule``,
  9 CPU nodes), pod ``ml-team/training-job-7b-xyz`` (1 GPU, selects the GPU pool, no toleration), its
  FailedScheduling event in the 1.35 wording that names no taint.
- :func:`capacity_cluster`: the same pod with the toleration, every GPU in use; the pool at maxCount and the family
  quota full (ARM's agentPools and usages lists).
- :func:`node_state_cluster`: the GPU nodes not ready (node-health taints): fix the node, never tolerate.
- :func:`hidden_taint_cluster`: a 1.35 cluster with DRA: the pod selects no pool and lacks the toleration; the
  message hides the taint and the CPU nodes say "Insufficient nvidia.com/gpu" (text alone: ambiguous).

Scheduler messages are rendered by :func:`scheduler_message` as kube-scheduler's ``FitError.Error()`` writes them
(pkg/scheduler/framework/types.go), with the DynamicResources PostFilter clause of 1.34+ when DRA is on.
- :func:`latency_snapshot`: runbook S5: a vLLM pod restarted after OOMKilled, evicted before, 164 s model loads,
  a hot GPU on its node, CPU-hungry neighbours.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "Cluster",
    "capacity_cluster",
    "hidden_taint_cluster",
    "latency_snapshot",
    "node_state_cluster",
    "runbook_cluster",
    "scheduler_message",
    "write_snapshot",
]

Cluster = dict[str, Any]
GPU_TAINT = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}
POD_TAINT_DEFAULTS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]
MESSAGE_135 = (
    "0/12 nodes are available: 3 node(s) had untolerated taint(s), 9 node(s) didn't match Pod's node "
    "affinity/selector. preemption: 0/12 nodes are available: 12 Preemption is not helpful for scheduling."
)

#: The PostFilter message of the DynamicResources plugin (1.34+ with DRA on) when it has no claim to free.
DRA_NO_CLAIMS = "no new claims to deallocate"


def scheduler_message(
    total: int, reasons: dict[str, int], preemption: dict[str, int] | None = None, *, dra: bool = False
) -> str:
    """A FailedScheduling message as kube-scheduler's ``FitError.Error()`` writes it: ``"0/%v nodes are
    available:"``, then ``" %v."`` of the histogram (``"N reason"``, sorted as strings, joined by ``", "``) and of
    the PostFilter messages joined by ``", "``: DRA's "no new claims to deallocate" (``dra``), then preemption's
    ``"preemption: 0/%v nodes are available: ..."``."""

    def histogram(counts: dict[str, int]) -> str:
        return ", ".join(sorted(f"{n} {text}" for text, n in counts.items()))

    text = f"0/{total} nodes are available: {histogram(reasons)}."
    post = [DRA_NO_CLAIMS] if dra else []
    if preemption:
        post.append(f"preemption: 0/{total} nodes are available: {histogram(preemption)}")
    if post:
        text += f" {', '.join(post)}."
    return text


def node(
    name: str,
    pool: str,
    vm_size: str,
    cpu: str,
    memory: str,
    gpus: int = 0,
    taints: list[dict[str, str]] | None = None,
    ready: bool = True,
    spot: bool = False,
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "119703055367"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    labels = {
        "agentpool": pool,
        "kubernetes.azure.com/agentpool": pool,
        "kubernetes.azure.com/mode": "user" if gpus else "system",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": vm_size,
        "topology.kubernetes.io/region": "eastus",
    }
    if gpus:
        labels["accelerator"] = "nvidia"
    if spot:
        labels["kubernetes.azure.com/scalesetpriority"] = "spot"
    spec: dict[str, Any] = {"providerID": f"azure:///subscriptions/0000/resourceGroups/mc_rg/{name}"}
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "Unknown",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                }
            ],
        },
    }


def pod(
    name: str,
    namespace: str,
    *,
    gpus: int = 1,
    cpu: str = "8",
    memory: str = "64Gi",
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
    node_name: str = "",
    phase: str = "Pending",
    owner: tuple[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "labels": labels or {},
    }
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1" if owner[0] == "Job" else "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": f"uid-{owner[1]}",
                "controller": True,
            }
        ]
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "ghcr.io/example/llm:1", "resources": resources}],
        "tolerations": [*(tolerations or []), *POD_TAINT_DEFAULTS],
        "restartPolicy": "Never" if owner and owner[0] == "Job" else "Always",
        "schedulerName": "default-scheduler",
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node_name:
        spec["nodeName"] = node_name
    status: dict[str, Any] = {"phase": phase, "qosClass": "Burstable"}
    if phase == "Pending" and not node_name:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def event(
    obj: dict[str, Any],
    reason: str,
    message: str,
    component: str = "default-scheduler",
    kind: str = "Pod",
    type_: str = "Warning",
    time: str = "2026-12-02T08:20:00Z",
    count: int = 1,
) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{abs(hash((reason, message))) % 10**8:x}",
            "namespace": meta.get("namespace", "default"),
        },
        "involvedObject": {
            "kind": kind,
            "name": meta["name"],
            "namespace": meta.get("namespace", ""),
            "apiVersion": "v1",
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "count": count,
        "source": {"component": component},
        "firstTimestamp": time,
        "lastTimestamp": time,
    }


def _gpu_nodes(ready: bool = True, extra_taints: list[dict[str, str]] | None = None) -> list[dict[str, Any]]:
    return [
        node(
            f"aks-gpunp-12345678-vmss00000{i}",
            "gpunp",
            "Standard_NC24ads_A100_v4",
            "23660m",
            "210Gi",
            gpus=1,
            taints=[GPU_TAINT, *(extra_taints or [])],
            ready=ready,
        )
        for i in range(3)
    ]


def _cpu_nodes() -> list[dict[str, Any]]:
    return [
        node(f"aks-nodepool1-87654321-vmss00000{i}", "nodepool1", "Standard_D8s_v5", "7820m", "28Gi") for i in range(9)
    ]


def runbook_cluster() -> Cluster:
    """Runbook S3: the training pod without the toleration; the 1.35 message that names no taint."""
    training = pod(
        "training-job-7b-xyz",
        "ml-team",
        gpus=1,
        cpu="8",
        memory="64Gi",
        node_selector={"kubernetes.azure.com/agentpool": "gpunp"},
        owner=("Job", "training-job-7b"),
        labels={"job-name": "training-job-7b"},
    )
    return {
        "pod": training,
        "nodes": [*_gpu_nodes(), *_cpu_nodes()],
        "pods": [training],
        "events": [event(training, "FailedScheduling", MESSAGE_135, count=20)],
    }


def capacity_cluster() -> Cluster:
    """Every GPU of the pool taken; the pool at maxCount; the family quota full."""
    training = pod(
        "training-job-7b-xyz",
        "ml-team",
        gpus=1,
        node_selector={"kubernetes.azure.com/agentpool": "gpunp"},
        tolerations=[{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        owner=("Job", "training-job-7b"),
    )
    gpu_nodes = _gpu_nodes()
    busy = [
        pod(
            f"finetune-{i}",
            "ml-team",
            gpus=1,
            node_name=n["metadata"]["name"],
            phase="Running",
            tolerations=[{"key": "sku", "operator": "Exists", "effect": "NoSchedule"}],
        )
        for i, n in enumerate(gpu_nodes)
    ]
    message = scheduler_message(  # a 1.34+ cluster with DRA on: the DynamicResources clause before preemption's
        12,
        {"Insufficient nvidia.com/gpu": 3, "node(s) didn't match Pod's node affinity/selector": 9},
        {"No preemption victims found for incoming pod": 3, "Preemption is not helpful for scheduling": 9},
        dra=True,
    )
    return {
        "pod": training,
        "nodes": [*gpu_nodes, *_cpu_nodes()],
        "pods": [training, *busy],
        "events": [
            event(training, "FailedScheduling", message),
            event(
                training,
                "NotTriggerScaleUp",
                "pod didn't trigger scale-up: 1 max node group size reached, "
                "1 node(s) didn't match Pod's node affinity/selector",
                component="cluster-autoscaler",
                type_="Normal",
            ),
        ],
        "pools": {
            "value": [
                {
                    "name": "nodepool1",
                    "properties": {
                        "count": 9,
                        "minCount": 3,
                        "maxCount": 12,
                        "enableAutoScaling": True,
                        "vmSize": "Standard_D8s_v5",
                        "mode": "System",
                    },
                },
                {
                    "name": "gpunp",
                    "properties": {
                        "count": 3,
                        "minCount": 0,
                        "maxCount": 3,
                        "enableAutoScaling": True,
                        "vmSize": "Standard_NC24ads_A100_v4",
                        "mode": "User",
                        "nodeTaints": ["sku=gpu:NoSchedule"],
                    },
                },
            ]
        },
        "usages": {
            "value": [
                {
                    "currentValue": 96,
                    "limit": 100,
                    "unit": "Count",
                    "name": {"value": "cores", "localizedValue": "Total Regional vCPUs"},
                },
                {
                    "currentValue": 72,
                    "limit": 72,
                    "unit": "Count",
                    "name": {
                        "value": "standardNCADSA100v4Family",
                        "localizedValue": "Standard NCADS_A100_v4 Family vCPUs",
                    },
                },
            ]
        },
    }


def node_state_cluster() -> Cluster:
    """The GPU nodes went not-ready: their node-health taint is what the scheduler reports."""
    training = pod(
        "training-job-7b-xyz",
        "ml-team",
        gpus=1,
        node_selector={"kubernetes.azure.com/agentpool": "gpunp"},
        tolerations=[{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        owner=("Job", "training-job-7b"),
    )
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    message = (
        "0/12 nodes are available: 3 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 9 node(s) "
        "didn't match Pod's node affinity/selector. preemption: 0/12 nodes are available: 12 Preemption is "
        "not helpful for scheduling."
    )
    return {
        "pod": training,
        "nodes": [*_gpu_nodes(ready=False, extra_taints=[not_ready]), *_cpu_nodes()],
        "pods": [training],
        "events": [event(training, "FailedScheduling", message)],
    }


def hidden_taint_cluster() -> Cluster:
    """1.35 with DRA: the pod asks for a GPU, selects no pool and lacks ``sku=gpu``; the 9 CPU nodes have no GPUs.
    The message names no taint, so text alone cannot tell the toleration from GPU capacity; the nodes can."""
    training = pod("training-job-7b-xyz", "ml-team", gpus=1, owner=("Job", "training-job-7b"))
    message = scheduler_message(
        12,
        {"node(s) had untolerated taint(s)": 3, "Insufficient nvidia.com/gpu": 9},
        {"Preemption is not helpful for scheduling": 12},
        dra=True,
    )
    return {
        "pod": training,
        "nodes": [*_gpu_nodes(), *_cpu_nodes()],
        "pods": [training],
        "events": [event(training, "FailedScheduling", message, count=4)],
        "version": "v1.35.0",
    }


VLLM_LOG = """\
INFO 07-15 08:12:03 api_server.py:495] vLLM API server version 0.6.3
INFO 07-15 08:12:03 gpu_model_runner.py:867] Starting to load model /models/llama-3-8b-instruct...
INFO 07-15 08:14:39 default_loader.py:384] Loading weights took 152.20 seconds
INFO 07-15 08:14:47 gpu_model_runner.py:4879] Model loading took 14.99 GiB memory and 164.2 seconds
INFO 07-15 08:14:58 api_server.py:530] Starting vLLM API server on http://0.0.0.0:8000
"""


def latency_snapshot() -> Cluster:
    """Runbook S5: restart after OOMKilled, an earlier eviction, 164 s loads, a hot GPU, noisy neighbours."""
    node_name = "aks-gpuinfer-11112222-vmss000001"
    serve = pod(
        "model-serve-7d9f8b6c5-abcde",
        "inference",
        gpus=1,
        cpu="8",
        memory="32Gi",
        node_name=node_name,
        phase="Running",
        owner=("ReplicaSet", "model-serve-7d9f8b6c5"),
        labels={"app": "model-serve", "pod-template-hash": "7d9f8b6c5"},
        tolerations=[{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
    )
    serve["metadata"]["generateName"] = "model-serve-7d9f8b6c5-"
    container = serve["spec"]["containers"][0]
    container["name"] = "server"
    container["readinessProbe"] = {"tcpSocket": {"port": 8000}, "periodSeconds": 10}
    container["livenessProbe"] = {
        "httpGet": {"path": "/health", "port": 8000},
        "initialDelaySeconds": 30,
        "periodSeconds": 10,
        "failureThreshold": 3,
    }
    serve["status"]["containerStatuses"] = [
        {
            "name": "server",
            "ready": True,
            "restartCount": 3,
            "image": "vllm/vllm-openai:v0.6.3",
            "state": {"running": {"startedAt": "2026-12-02T08:12:03Z"}},
            "lastState": {
                "terminated": {
                    "reason": "OOMKilled",
                    "exitCode": 137,
                    "startedAt": "2026-12-02T07:40:00Z",
                    "finishedAt": "2026-12-02T08:11:58Z",
                }
            },
        }
    ]
    neighbours = [
        pod(
            "etl-batch-5f6d7-xyz12",
            "data",
            gpus=0,
            cpu="2",
            memory="8Gi",
            node_name=node_name,
            phase="Running",
            owner=("ReplicaSet", "etl-batch-5f6d7"),
        ),
        pod(
            "log-agent-x1y2z",
            "kube-system",
            gpus=0,
            cpu="100m",
            memory="200Mi",
            node_name=node_name,
            phase="Running",
            owner=("DaemonSet", "log-agent"),
        ),
    ]
    old = dict(serve["metadata"])
    old["name"] = "model-serve-7d9f8b6c5-qwert"
    events = [
        event(
            {"metadata": old},
            "Evicted",
            "The node was low on resource: memory. Threshold quantity: 100Mi, "
            "available: 92Mi. Container server was using 31Gi, request is 32Gi, has larger consumption of memory.",
            component="kubelet",
            time="2026-12-02T06:10:00Z",
        ),
        event(
            serve,
            "Killing",
            "Container server failed liveness probe, will be restarted",
            component="kubelet",
            type_="Normal",
            time="2026-12-02T07:39:50Z",
        ),
    ]
    server = f'container="server",namespace="inference",pod="{serve["metadata"]["name"]}"'
    etl = 'container="etl",namespace="data",pod="etl-batch-5f6d7-xyz12"'
    metrics = "\n".join(
        [
            "# TYPE container_cpu_cfs_periods_total counter",
            f"container_cpu_cfs_periods_total{{{server}}} 10000",
            f"container_cpu_cfs_throttled_periods_total{{{server}}} 3100",
            f"container_cpu_cfs_periods_total{{{etl}}} 10000",
            f"container_cpu_cfs_throttled_periods_total{{{etl}}} 6200",
            "",
        ]
    )
    facts = _hot_facts(node_name)
    return {
        "pod": serve,
        "nodes": [
            node(node_name, "gpuinfer", "Standard_NC24ads_A100_v4", "23660m", "210Gi", gpus=1, taints=[GPU_TAINT])
        ],
        "pods": [serve, *neighbours],
        "events": events,
        "logs": VLLM_LOG,
        "metrics": metrics,
        "facts": facts,
    }


def _hot_facts(host: str) -> dict[str, Any]:
    """An audit document (gpufleet.audit/1) whose one host has a GPU at 84 °C, thermally throttled."""
    fixture = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "facts" / "thermal.json"
    facts = json.loads(fixture.read_text()) if fixture.exists() else None
    if facts is None:  # a bare checkout without tests/: the smallest facts document the checks read
        facts = {"schema": "gpufleet.facts/1", "hostname": host, "nvml": {"error_class": "none", "gpus": []}}
    facts = dict(facts, hostname=host)
    return {
        "schema": "gpufleet.audit/1",
        "fleet": "aks-gpuinfer",
        "inventory": "",
        "started_at": "",
        "seconds": 1.0,
        "hosts": [
            {
                "host": host,
                "status": "ok",
                "error": None,
                "seconds": 1.0,
                "healthy": False,
                "findings": [],
                "facts": facts,
            }
        ],
    }


def write_snapshot(cluster: Cluster, directory: Path) -> Path:
    """``cluster`` as a snapshot directory (the files kubectl would write; see remediation.k8s.snapshot)."""
    directory.mkdir(parents=True, exist_ok=True)

    def dump(name: str, doc: Any) -> None:
        (directory / name).write_text(json.dumps(doc, indent=2) + "\n")

    dump("pod.json", cluster["pod"])
    dump("nodes.json", {"apiVersion": "v1", "kind": "NodeList", "items": cluster["nodes"]})
    dump("pods.json", {"apiVersion": "v1", "kind": "PodList", "items": cluster["pods"]})
    dump("events.json", {"apiVersion": "v1", "kind": "EventList", "items": cluster["events"]})
    for key in ("pools", "usages", "facts"):
        if key in cluster:
            dump(f"{key}.json", cluster[key])
    if "logs" in cluster:
        (directory / "logs").mkdir(exist_ok=True)
        (directory / "logs" / "server.log").write_text(cluster["logs"])
    if "metrics" in cluster:
        (directory / "metrics.prom").write_text(cluster["metrics"])
    return directory
