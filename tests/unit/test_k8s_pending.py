"""The scheduler's filters on snapshots, the verdicts, the patch that makes the pod schedule, the capacity chain."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from lab.services import k8s_scenarios as scenarios
from remediation.core.findings import Finding
from remediation.k8s.capacity import advise, pools_from_dict, usages_from_dict, vm_family, vm_vcpus
from remediation.k8s.errors import SnapshotError
from remediation.k8s.evaluator import evaluate
from remediation.k8s.objects import Taint, Toleration, node_from_dict, pod_from_dict
from remediation.k8s.patch import apply_patch, toleration_for
from remediation.k8s.pending import diagnose_pending
from remediation.k8s.snapshot import Snapshot, load_snapshot


def _snapshot(cluster: dict[str, Any]) -> Snapshot:
    from remediation.k8s.objects import event_from_dict

    return Snapshot(
        pod_from_dict(cluster["pod"]),
        tuple(node_from_dict(n) for n in cluster["nodes"]),
        tuple(pod_from_dict(p) for p in cluster["pods"]),
        tuple(event_from_dict(e) for e in cluster["events"]),
    )


def _ids(findings: tuple[Finding, ...]) -> set[str]:
    return {f.id for f in findings}


# --- tolerations and filters -----------------------------------------------------------------------------------

GPU = Taint("sku", "gpu", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        (Toleration("sku", "Equal", "gpu", "NoSchedule"), True),
        (Toleration("sku", "Equal", "gpu", ""), True),  # no effect: every effect
        (Toleration("sku", "Exists", "", "NoSchedule"), True),
        (Toleration("", "Exists", "", ""), True),  # empty key + Exists: everything
        (Toleration("sku", "Equal", "cpu", "NoSchedule"), False),
        (Toleration("sku", "Equal", "gpu", "NoExecute"), False),
        (Toleration("other", "Exists", "", ""), False),
        (Toleration("", "Equal", "gpu", ""), False),  # empty key needs Exists
    ],
)
def test_toleration_semantics(toleration: Toleration, tolerates: bool) -> None:
    assert toleration.tolerates(GPU) is tolerates


def _node(**kw: Any) -> dict[str, Any]:
    return scenarios.node("n1", kw.pop("pool", "gpunp"), "Standard_NC24ads_A100_v4", "24", "200Gi", **kw)


def _pod(**kw: Any) -> dict[str, Any]:
    return scenarios.pod("p", "ns", **kw)


def test_filters_in_scheduler_order_and_all_reported() -> None:
    node = node_from_dict(_node(gpus=1, taints=[{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]))
    pod = pod_from_dict(_pod(gpus=2, node_selector={"kubernetes.azure.com/agentpool": "other"}))
    (result,) = evaluate(pod, [node])
    assert [f.filter for f in result.failures] == ["TaintToleration", "NodeAffinity", "NodeResourcesFit"]
    assert [f.reason for f in result.reported] == ["untolerated_taint"]


def test_prefer_no_schedule_does_not_filter_and_cordon_does() -> None:
    soft = node_from_dict(_node(gpus=1, taints=[{"key": "x", "value": "y", "effect": "PreferNoSchedule"}]))
    assert evaluate(pod_from_dict(_pod()), [soft])[0].fits
    cordoned = _node(gpus=1)
    cordoned["spec"]["unschedulable"] = True
    (result,) = evaluate(pod_from_dict(_pod()), [node_from_dict(cordoned)])
    assert result.failures[0].reason == "node_unschedulable" and result.failures[0].node_state


def test_gpu_capacity_counts_what_pods_on_the_node_request() -> None:
    node = node_from_dict(_node(gpus=2))
    busy = pod_from_dict(scenarios.pod("busy", "ns", gpus=2, node_name="n1", phase="Running"))
    done = pod_from_dict(scenarios.pod("done", "ns", gpus=2, node_name="n1", phase="Succeeded"))
    wanting = pod_from_dict(_pod(gpus=1))
    assert evaluate(wanting, [node], [done])[0].fits
    (result,) = evaluate(wanting, [node], [busy])
    assert result.failures[0].reason == "insufficient_gpu" and result.failures[0].resource == "nvidia.com/gpu"
    assert "0 free of 2 allocatable" in result.failures[0].detail


@pytest.mark.parametrize(
    ("expression", "fits"),
    [
        ({"key": "kubernetes.azure.com/agentpool", "operator": "In", "values": ["gpunp", "x"]}, True),
        ({"key": "kubernetes.azure.com/agentpool", "operator": "NotIn", "values": ["gpunp"]}, False),
        ({"key": "accelerator", "operator": "Exists"}, True),
        ({"key": "accelerator", "operator": "DoesNotExist"}, False),
        ({"key": "gpu-count", "operator": "Gt", "values": ["0"]}, True),
        ({"key": "gpu-count", "operator": "Lt", "values": ["1"]}, False),
    ],
)
def test_required_node_affinity(expression: dict[str, Any], fits: bool) -> None:
    raw = _node(gpus=1)
    raw["metadata"]["labels"]["gpu-count"] = "1"
    spec = _pod()
    spec["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}
    assert evaluate(pod_from_dict(spec), [node_from_dict(raw)])[0].fits is fits


def test_quantities_and_init_containers() -> None:
    spec = _pod(gpus=0, cpu="500m", memory="1Gi")
    spec["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}]
    pod = pod_from_dict(spec)
    assert str(pod.requests()["cpu"]) == "2"  # max(sum of containers, each init container)
    assert pod.requests()["memory"] == 2**30


# --- verdicts on the recorded clusters ----------------------------------------------------------------------------


def test_runbook_pod_from_a_135_message_and_a_snapshot() -> None:
    cluster = scenarios.runbook_cluster()
    state = _snapshot(cluster)
    result = diagnose_pending("", state)
    assert result.message is not None and result.message.era == "taint_v135"
    assert result.verdict == "constraint"
    assert _ids(result.findings) == {"K8S-PEND-001"}
    assert "untolerated taint sku=gpu:NoSchedule" in result.findings[0].summary
    assert result.fix is not None
    assert [t.to_dict() for t in result.fix.tolerations] == [
        {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert "kubectl patch pod training-job-7b-xyz -n ml-team --type=json" in result.fix.commands[0]
    # the patch as printed (pod JSON patch) makes the evaluator schedule the pod onto a GPU node
    patched = pod_from_dict(apply_patch(cluster["pod"], result.fix.pod_ops))
    placed = [r.node.name for r in evaluate(patched, state.nodes, state.pods) if r.fits]
    assert placed and all("gpunp" in name for name in placed)
    assert result.scheduled_on in placed
    # the corrected YAML has the user's toleration and not the admission defaults
    assert "not-ready" not in result.fix.yaml and "sku" in result.fix.yaml
    # the facts keep the message's own content (1.35 hides the key)
    assert result.facts()["reasons"][0]["taint_key"] is None


def test_runbook_text_alone_asks_for_the_nodes() -> None:
    result = diagnose_pending(scenarios.MESSAGE_135)
    assert result.verdict == "constraint"
    assert "does not name" in result.findings[0].summary


def test_deployment_owner_gets_a_template_patch() -> None:
    cluster = scenarios.runbook_cluster()
    raw = copy.deepcopy(cluster["pod"])
    raw["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "serve-5c9f7", "controller": True}]
    raw["metadata"]["labels"] = {"pod-template-hash": "5c9f7"}
    cluster["pod"] = raw
    result = diagnose_pending("", _snapshot(cluster))
    assert result.fix is not None
    assert any(c.startswith("kubectl patch deployment serve -n ml-team --type=json") for c in result.fix.commands)
    ops = result.fix.template_ops
    assert ops[0]["path"] == "/spec/template/spec/tolerations"  # no user tolerations yet: the whole list


def test_selector_fix_when_no_node_carries_the_selected_value() -> None:
    cluster = scenarios.runbook_cluster()
    cluster["pod"]["spec"]["nodeSelector"] = {"kubernetes.azure.com/agentpool": "gpupool"}  # a renamed pool
    cluster["pods"] = [cluster["pod"]]
    state = _snapshot(cluster)
    result = diagnose_pending("", state)
    assert result.verdict == "constraint"
    assert _ids(result.findings) == {"K8S-PEND-001", "K8S-PEND-002"}
    assert result.fix is not None and result.fix.node_selector == {"kubernetes.azure.com/agentpool": "gpunp"}
    assert result.fix.pod_ops == ()  # a pod's nodeSelector cannot change: only its controller's template
    patched = pod_from_dict(apply_patch(cluster["pod"], result.fix.spec_ops))
    assert any(r.fits for r in evaluate(patched, state.nodes, state.pods))


def test_capacity_chain_names_max_count_and_quota() -> None:
    cluster = scenarios.capacity_cluster()
    result = diagnose_pending("", _snapshot(cluster), pools_from_dict(cluster["pools"]),
                              usages_from_dict(cluster["usages"]), cluster="myAKS", resource_group="myRG")
    assert result.verdict == "capacity" and result.fix is None
    assert _ids(result.findings) == {"K8S-PEND-004", "K8S-PEND-007", "K8S-PEND-008"}
    assert result.capacity is not None and set(result.capacity.raise_) == {"max_count", "quota"}
    assert "invoke aks.pools --cluster myAKS --resource-group myRG" in result.capacity.commands
    assert ("invoke quota.plan --location eastus --vm-size Standard_NC24ads_A100_v4 --nodes 1"
            in result.capacity.commands)
    assert any("at least 96" in line for line in result.capacity.lines)


def test_capacity_when_the_pool_can_grow_and_quota_fits() -> None:
    cluster = scenarios.capacity_cluster()
    cluster["pools"]["value"][1]["properties"]["maxCount"] = 6
    cluster["usages"]["value"][1]["limit"] = 200
    cluster["usages"]["value"][0]["limit"] = 500
    result = diagnose_pending("", _snapshot(cluster), pools_from_dict(cluster["pools"]),
                              usages_from_dict(cluster["usages"]))
    assert result.verdict == "capacity"
    assert result.capacity is not None and result.capacity.raise_ == ()
    assert "K8S-PEND-008" not in _ids(result.findings)
    assert any("autoscaler's events" in line for line in result.capacity.lines)


def test_taint_and_capacity_together_fix_first_then_capacity() -> None:
    cluster = scenarios.capacity_cluster()
    cluster["pod"]["spec"]["tolerations"] = list(scenarios.POD_TAINT_DEFAULTS)
    cluster["pods"][0] = cluster["pod"]
    result = diagnose_pending("", _snapshot(cluster))
    assert result.verdict == "constraint"
    assert {"K8S-PEND-001", "K8S-PEND-004"} <= _ids(result.findings)
    assert result.fix is not None and result.scheduled_on is None


def test_node_state_never_suggests_a_health_toleration() -> None:
    cluster = scenarios.node_state_cluster()
    result = diagnose_pending("", _snapshot(cluster))
    assert result.verdict == "node_state" and result.fix is None
    assert _ids(result.findings) == {"K8S-PEND-006"}
    assert "never tolerate" in result.findings[0].summary
    with pytest.raises(ValueError, match="node-health"):
        toleration_for(Taint("node.kubernetes.io/unreachable", "", "NoExecute"))


def test_a_pod_that_fits_now_has_no_verdict() -> None:
    cluster = scenarios.runbook_cluster()
    cluster["pod"]["spec"]["tolerations"].append({"key": "sku", "operator": "Exists", "effect": "NoSchedule"})
    result = diagnose_pending("", _snapshot(cluster))
    assert result.verdict is None and result.fits_now and not result.findings


def test_snapshot_directory_round_trip(tmp_path: Path) -> None:
    directory = scenarios.write_snapshot(scenarios.runbook_cluster(), tmp_path / "snap")
    state = load_snapshot(directory)
    assert state.pod is not None and len(state.nodes) == 12 and len(state.pod_events()) == 1
    assert diagnose_pending("", state).verdict == "constraint"
    (directory / "nodes.json").write_text("{not json")
    with pytest.raises(SnapshotError, match=r"nodes\.json is not JSON"):
        load_snapshot(directory)
    (directory / "pod.json").write_text(json.dumps({"kind": "Node"}))
    with pytest.raises(SnapshotError, match="not a Pod"):
        load_snapshot(directory)


# --- the capacity adapter --------------------------------------------------------------------------------------


def test_arm_shapes_parse() -> None:
    pools = pools_from_dict({"value": [{"name": "gpunp", "properties": {
        "count": 2, "minCount": 1, "maxCount": 2, "enableAutoScaling": True, "vmSize": "Standard_ND96asr_v4",
        "nodeTaints": ["sku=gpu:NoSchedule"]}}]})
    assert pools[0].at_max and pools[0].taints == ("sku=gpu:NoSchedule",)
    usages = usages_from_dict({"value": [{"currentValue": 96, "limit": 96, "unit": "Count",
                                          "name": {"value": "standardNDASv4_A100Family", "localizedValue": "x"}}]})
    assert usages[0].free == 0
    assert vm_family("Standard_ND96asr_v4") == "standardNDASv4_A100Family" and vm_vcpus("Standard_ND96asr_v4") == 96
    advice = advise(pools, usages, pool="gpunp", gpus_wanted=16, gpus_per_node=8)
    assert advice.nodes_needed == 2 and advice.vcpus_needed == 192 and set(advice.raise_) == {"max_count", "quota"}
    with pytest.raises(SnapshotError, match="agentPools"):
        pools_from_dict({"value": "nope"})


def test_scale_from_zero_picks_the_only_gpu_pool() -> None:
    pools = pools_from_dict([{"name": "system", "vmSize": "Standard_D4s_v5", "count": 3, "maxCount": 5,
                              "enableAutoScaling": True},
                             {"name": "gpu", "vmSize": "Standard_NC24ads_A100_v4", "count": 0, "maxCount": 0,
                              "enableAutoScaling": True}])
    advice = advise(pools, (), pool=None, gpus_wanted=1, gpus_per_node=None)
    assert advice.pool == "gpu" and advice.raise_ == ("max_count",)


def _spot_capacity_cluster(low_current: int, low_limit: int) -> dict[str, Any]:
    """capacity_cluster with its GPU pool on Spot (AgentPool ``scaleSetPriority: Spot``, the vendored
    Microsoft.ContainerService 2024-09-01 spec) and the region's ``lowPriorityCores`` usage row ("Total Regional
    Low-priority vCPUs", the quota Spot VMs of every family draw on)."""
    cluster = scenarios.capacity_cluster()
    cluster["pools"]["value"][1]["properties"]["scaleSetPriority"] = "Spot"
    cluster["usages"]["value"].append({"currentValue": low_current, "limit": low_limit, "unit": "Count",
                                       "name": {"value": "lowPriorityCores",
                                                "localizedValue": "Total Regional Low-priority vCPUs"}})
    return cluster


def test_spot_pool_quota_is_the_low_priority_quota() -> None:
    cluster = _spot_capacity_cluster(48, 48)
    result = diagnose_pending("", _snapshot(cluster), pools_from_dict(cluster["pools"]),
                              usages_from_dict(cluster["usages"]), cluster="myAKS", resource_group="myRG")
    pend = [f for f in result.findings if f.id == "K8S-PEND-008"]
    assert len(pend) == 1 and "lowPriorityCores" in pend[0].summary
    assert "standardNCADSA100v4Family" not in " ".join([pend[0].summary, *pend[0].evidence])
    assert result.capacity is not None and result.capacity.family == "lowPriorityCores"
    assert "invoke quota.request --location eastus --family lowPriorityCores --vcpus 72" in result.capacity.commands


def test_spot_pool_with_low_priority_room_is_not_held_by_the_full_family() -> None:
    cluster = _spot_capacity_cluster(0, 100)  # the A100 family (72/72) and cores (96/100) are full: Spot skips them
    result = diagnose_pending("", _snapshot(cluster), pools_from_dict(cluster["pools"]),
                              usages_from_dict(cluster["usages"]))
    assert "K8S-PEND-008" not in _ids(result.findings)
    assert result.capacity is not None and "quota" not in result.capacity.raise_
