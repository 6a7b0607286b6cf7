"""Answers an expert would reject, corrected (issue 24, runbook S3/S5): each test runs the text that showed it.

- K8S-PEND-008: the family has room, the regional vCPU total (``cores``) does not: name ``cores``, never "fits".
- K8S-PEND-007: the ``az aks nodepool update`` carries -g, --cluster-name, -n, --min-count, --max-count.
- Liveness kills counted from the kubelet's Killing events, not Killing + Unhealthy.
- Xid 13/31/43 (application class): the remedy checks the application first; the alerts page on hardware Xids only.
- Model load includes TGI's weight download and vLLM's CUDA-graph capture.
- The inference template labels the pod for AKS workload identity when azcopy logs in with it.
- The latency "template values" block has each key (``startup:``) once.
"""

from __future__ import annotations

import io
from typing import Any

import yaml
from rich.console import Console

from lab.services import k8s_scenarios as scenarios
from remediation.core.findings import Severity
from remediation.host.diagnose import diagnose
from remediation.k8s.alerts import render_rules
from remediation.k8s.capacity import pools_from_dict, usages_from_dict
from remediation.k8s.latency import diagnose_latency, merge_values
from remediation.k8s.modelload import parse
from remediation.k8s.objects import event_from_dict, node_from_dict, pod_from_dict
from remediation.k8s.pending import diagnose_pending
from remediation.k8s.render import TEMPLATES, load_values, render, validate_manifest
from remediation.k8s.report import print_latency, print_pending
from remediation.k8s.snapshot import Snapshot
from tests.corpus import blocks

# --- S3: which quota binds, and the pool command ---------------------------------------------------------------

# `kubectl describe pod training-job-7b-xyz -n ml-team` Events (1.30 wording) with the autoscaler's answer
EVENTS = """\
Events:
  Type     Reason             Age                  From                Message
  ----     ------             ----                 ----                -------
  Warning  FailedScheduling   2m (x9 over 20m)     default-scheduler   0/12 nodes are available: 3 Insufficient nvidia.com/gpu, 9 node(s) didn't match Pod's node affinity/selector. preemption: 0/12 nodes are available: 3 No preemption victims found for incoming pod, 9 Preemption is not helpful for scheduling.
  Normal   NotTriggerScaleUp  1m (x40 over 20m)    cluster-autoscaler  pod didn't trigger scale-up: 1 max node group size reached, 1 node(s) didn't match Pod's node affinity/selector
"""  # noqa: E501

# `az aks nodepool list --cluster-name myAKS -g myRG -o json` (trimmed to the fields read)
POOLS = [
    {"name": "nodepool1", "vmSize": "Standard_D8s_v5", "count": 9, "minCount": 3, "maxCount": 12,
     "enableAutoScaling": True, "mode": "System"},
    {"name": "gpunp", "vmSize": "Standard_NC24ads_A100_v4", "count": 3, "minCount": 1, "maxCount": 3,
     "enableAutoScaling": True, "mode": "User", "nodeTaints": ["sku=gpu:NoSchedule"], "scaleSetPriority": None},
]


def _usages(family: tuple[int, int], cores: tuple[int, int]) -> list[dict[str, Any]]:
    """`az vm list-usage --location eastus -o json`: values as strings, as az prints them."""
    return [
        {"currentValue": str(cores[0]), "limit": str(cores[1]), "localName": "Total Regional vCPUs",
         "name": {"localizedValue": "Total Regional vCPUs", "value": "cores"}},
        {"currentValue": str(family[0]), "limit": str(family[1]), "localName": "Standard NCADS_A100_v4 Family vCPUs",
         "name": {"localizedValue": "Standard NCADS_A100_v4 Family vCPUs", "value": "standardNCADSA100v4Family"}},
    ]


def _pending(family: tuple[int, int], cores: tuple[int, int], **kw: str) -> Any:
    return diagnose_pending(EVENTS, None, pools_from_dict(POOLS), usages_from_dict(_usages(family, cores)),
                            location="eastus", **kw)


def test_regional_total_full_family_free_names_cores_not_the_family() -> None:
    result = _pending(family=(72, 200), cores=(96, 100), cluster="myAKS", resource_group="myRG")
    (quota,) = [f for f in result.findings if f.id == "K8S-PEND-008"]
    assert "regional vCPU total (cores)" in quota.summary and "at least 120" in quota.summary
    assert "fits" not in quota.summary and "standardNCADSA100v4Family" not in quota.summary
    assert "`invoke quota.request --location eastus --family cores --vcpus 120`" in quota.remedy
    assert "--family standardNCADSA100v4Family" not in quota.remedy
    assert result.capacity is not None and [name for name, _ in result.capacity.binding] == ["cores"]
    out = io.StringIO()
    print_pending(result, Console(file=out, width=300))
    assert "capacity: raise the pool's maxCount and the regional vCPU total (cores)" in out.getvalue()
    assert "the family vCPU quota" not in out.getvalue()


def test_both_quotas_full_name_both() -> None:
    result = _pending(family=(72, 72), cores=(96, 100))
    (quota,) = [f for f in result.findings if f.id == "K8S-PEND-008"]
    assert "family standardNCADSA100v4Family quota: 72 of 72" in quota.summary and "(cores)" in quota.summary
    assert "--family standardNCADSA100v4Family --vcpus 96" in quota.remedy
    assert "--family cores --vcpus 120" in quota.remedy


def test_quota_with_room_everywhere_is_no_finding() -> None:
    result = _pending(family=(0, 200), cores=(0, 500))
    assert "K8S-PEND-008" not in {f.id for f in result.findings}


def test_pool_command_carries_the_users_values() -> None:
    result = _pending(family=(0, 200), cores=(0, 500), cluster="myAKS", resource_group="myRG")
    (pool,) = [f for f in result.findings if f.id == "K8S-PEND-007"]
    assert ("`az aks nodepool update -g myRG --cluster-name myAKS -n gpunp --update-cluster-autoscaler "
            "--min-count 1 --max-count 4`") in pool.remedy
    assert "invoke aks.pools --cluster myAKS --resource-group myRG" in pool.remedy


def test_pool_command_marks_what_it_does_not_know() -> None:
    # the task's defaults (commands/k8s.py) and no pools file: every unknown is a <marked> placeholder
    result = diagnose_pending(EVENTS, cluster="CLUSTER", resource_group="RESOURCE_GROUP")
    (pool,) = [f for f in result.findings if f.id == "K8S-PEND-007"]
    assert ("az aks nodepool update -g <resource-group> --cluster-name <cluster> -n <pool> "
            "--update-cluster-autoscaler --min-count <min-count> --max-count <new-max-count>") in pool.remedy
    assert "CLUSTER" not in pool.remedy and "RESOURCE_GROUP" not in pool.remedy


# --- S5: liveness kills, template values, model load -----------------------------------------------------------


def _latency_state(events: list[dict[str, Any]], restart_count: int, reason: str) -> Snapshot:
    scene = scenarios.latency_snapshot()
    pod = scene["pod"]
    status = pod["status"]["containerStatuses"][0]
    status["restartCount"] = restart_count
    status["lastState"]["terminated"].update({"reason": reason, "exitCode": 137})
    return Snapshot(pod_from_dict(pod), tuple(node_from_dict(n) for n in scene["nodes"]), (pod_from_dict(pod),),
                    tuple(event_from_dict(e) for e in events))


def test_liveness_kills_count_killing_events_not_unhealthy_ones() -> None:
    # kubelet events of a vLLM pod killed 4 times, each after failureThreshold 2 failed probes (8 Unhealthy)
    pod = scenarios.latency_snapshot()["pod"]
    events = [
        scenarios.event(pod, "Unhealthy", 'Liveness probe failed: Get "http://10.244.3.17:8000/health": context '
                        "deadline exceeded (Client.Timeout exceeded while awaiting headers)", component="kubelet",
                        count=8),
        scenarios.event(pod, "Killing", "Container server failed liveness probe, will be restarted",
                        component="kubelet", type_="Normal", count=4),
    ]
    result = diagnose_latency(_latency_state(events, 4, "Error"))
    (other,) = [f for f in result.findings if f.id == "K8S-LAT-006"]
    assert "liveness probe killed it 4x (restartCount 4)" in other.summary
    assert "8x" not in other.summary and "12x" not in other.summary
    assert "liveness probe failures (Unhealthy events): 8" in other.evidence


def test_template_values_name_each_key_once() -> None:
    scene = scenarios.latency_snapshot()
    state = Snapshot(pod_from_dict(scene["pod"]), tuple(node_from_dict(n) for n in scene["nodes"]),
                     tuple(pod_from_dict(p) for p in scene["pods"]), tuple(event_from_dict(e) for e in scene["events"]))
    result = diagnose_latency(state, scene["logs"], None, scene["metrics"])
    assert sum("startup" in yaml.safe_load(v) for _fid, v in result.fixes) >= 2  # several fixes size the startup
    merged = merge_values(result.fixes)
    assert merged.count("startup:") == 1 and merged.count("model:") == 1
    doc = yaml.safe_load(merged)
    assert doc["startup"] == {"maxLoadSeconds": 300} and doc["resources"]["memory"] == "48Gi"
    out = io.StringIO()
    print_latency(result, Console(file=out, width=300))
    block = out.getvalue().split("template values that apply the fixes")[1]
    assert block.count("startup:") == 1


# TGI 2.2 launcher log (text-generation-launcher): four safetensors files downloaded one after another, then one
# shard loads; the download lines are those of server/text_generation_server/utils/hub.py
TGI_LOG = """\
2024-09-03T04:36:57.507198Z  INFO download: text_generation_launcher: Starting check and download process for meta-llama/Meta-Llama-3.1-8B-Instruct
2024-09-03T04:37:01.632012Z  INFO text_generation_launcher: Download file: model-00001-of-00004.safetensors
2024-09-03T04:37:08.927851Z  INFO text_generation_launcher: Downloaded /data/models--meta-llama--Meta-Llama-3.1-8B-Instruct/snapshots/5206a32e0bd3067aef1ce90f5528ade7d866253f/model-00001-of-00004.safetensors in 0:00:07.
2024-09-03T04:37:08.927963Z  INFO text_generation_launcher: Download: [1/4] -- ETA: 0:00:21
2024-09-03T04:37:08.928312Z  INFO text_generation_launcher: Download file: model-00002-of-00004.safetensors
2024-09-03T04:38:31.672929Z  INFO text_generation_launcher: Downloaded /data/models--meta-llama--Meta-Llama-3.1-8B-Instruct/snapshots/5206a32e0bd3067aef1ce90f5528ade7d866253f/model-00002-of-00004.safetensors in 0:01:22.
2024-09-03T04:38:31.672967Z  INFO text_generation_launcher: Download: [2/4] -- ETA: 0:01:30
2024-09-03T04:38:31.673299Z  INFO text_generation_launcher: Download file: model-00003-of-00004.safetensors
2024-09-03T04:39:15.116042Z  INFO text_generation_launcher: Downloaded /data/models--meta-llama--Meta-Llama-3.1-8B-Instruct/snapshots/5206a32e0bd3067aef1ce90f5528ade7d866253f/model-00003-of-00004.safetensors in 0:00:43.
2024-09-03T04:39:15.116123Z  INFO text_generation_launcher: Download: [3/4] -- ETA: 0:00:44.333333
2024-09-03T04:39:15.116431Z  INFO text_generation_launcher: Download file: model-00004-of-00004.safetensors
2024-09-03T04:39:22.450825Z  INFO text_generation_launcher: Downloaded /data/models--meta-llama--Meta-Llama-3.1-8B-Instruct/snapshots/5206a32e0bd3067aef1ce90f5528ade7d866253f/model-00004-of-00004.safetensors in 0:00:07.
2024-09-03T04:39:22.450918Z  INFO text_generation_launcher: Download: [4/4] -- ETA: 0
2024-09-03T04:39:23.170638Z  INFO download: text_generation_launcher: Successfully downloaded weights for meta-llama/Meta-Llama-3.1-8B-Instruct
2024-09-03T04:39:23.170897Z  INFO shard-manager: text_generation_launcher: Starting shard rank=0
2024-09-03T04:40:10.814732Z  INFO shard-manager: text_generation_launcher: Shard ready in 47.643196061s rank=0
"""  # noqa: E501


def test_tgi_load_includes_the_weight_download() -> None:
    load = parse(TGI_LOG)
    assert load.server == "tgi" and load.download_seconds == 7 + 82 + 43 + 7
    assert load.load_seconds is not None and abs(load.load_seconds - (139 + 47.643196061)) < 1e-6
    (finding,) = diagnose(TGI_LOG).findings
    assert finding.id == "K8S-LAT-003" and "download 139 s + load 47.6 s" in finding.summary
    cached = "\n".join(line for line in TGI_LOG.splitlines() if "Downloaded" not in line)  # weights in the cache
    assert parse(cached).load_seconds == 47.643196061


# vLLM V1 (0.8) engine log: load, then CUDA-graph capture (gpu_model_runner.py) before the API server starts
VLLM_V1_LOG = """\
INFO 05-06 20:59:31 [gpu_model_runner.py:1329] Starting to load model meta-llama/Llama-3.1-8B-Instruct...
INFO 05-06 20:59:57 [default_loader.py:384] Loading weights took 24.84 seconds
INFO 05-06 20:59:59 [gpu_model_runner.py:1347] Model loading took 14.99 GiB memory and 31.657031 seconds
INFO 05-06 21:00:09 [backends.py:430] Dynamo bytecode transform time: 9.61 s
INFO 05-06 21:00:31 [gpu_model_runner.py:1686] Graph capturing finished in 22 secs, took 0.53 GiB
INFO 05-06 21:00:31 [core.py:159] init engine (profile, create kv cache, warmup model) took 31.84 seconds
"""


def test_vllm_load_includes_cuda_graph_capture() -> None:
    load = parse(VLLM_V1_LOG)
    assert load.server == "vllm" and load.graph_seconds == 22.0
    assert load.load_seconds is not None and abs(load.load_seconds - (31.657031 + 22)) < 1e-9
    v0 = parse(blocks()["6.2"][0])  # V0: shard bar 2 s, then "Graph capturing finished in 14 secs."
    assert v0.load_seconds == 16.0 and v0.graph_seconds == 14.0


# --- Xid: application class vs hardware ------------------------------------------------------------------------


def test_application_xid_remedy_checks_the_application_first() -> None:
    app = diagnose(blocks()["3.3"][0])  # the corpus's Xid 13 (graphics engine exception) kernel log
    (finding,) = app.findings
    assert finding.summary.startswith("Xid 13 ") and finding.severity is Severity.WARNING
    assert "check the application first" in finding.remedy and "drain the host;" not in finding.remedy
    assert "several workloads" in finding.remedy
    # dmesg of an illegal-address kernel (Xid 31, MMU fault), as the R535+ driver prints it
    xid31 = ("[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 31, pid=48211, name=python3, Ch 00000008, intr 00000000. "
             "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_1c000000. Fault is of type "
             "FAULT_PDE ACCESS_TYPE_VIRT_READ")
    (f31,) = diagnose(xid31).findings
    assert f31.summary.startswith("Xid 31 ") and "check the application first" in f31.remedy
    hw = diagnose(blocks()["3.9"][0]).findings[0]  # Xid 48, double-bit ECC
    assert hw.severity is Severity.CRITICAL and hw.remedy.startswith("drain the host")


def test_xid_alerts_page_on_hardware_and_warn_on_application() -> None:
    alerts = {r["alert"]: r for g in yaml.safe_load(render_rules())["groups"] for r in g["rules"]}
    hard, soft = alerts["GpuXidError"], alerts["GpuXidErrorApplication"]
    assert hard["labels"]["severity"] == "critical" and soft["labels"]["severity"] == "warning"
    assert hard["labels"]["finding"] == soft["labels"]["finding"] == "GPU-HW-005"
    for code in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120):
        assert f"DCGM_FI_DEV_XID_ERRORS == {code} " in hard["expr"] + " "
    for code in (13, 31, 43):
        assert f"== {code} " not in hard["expr"] + " "
    assert "unless" in soft["expr"]  # every code but the critical ones: 13, 31, 43 among them


# --- the inference template and AKS workload identity ----------------------------------------------------------


def test_workload_identity_label_and_service_account() -> None:
    values = load_values(TEMPLATES / "examples" / "inference.yaml")
    assert values["model"]["cache"].get("auth", "WORKLOAD") == "WORKLOAD"
    del values["serviceAccountName"]
    deployment = render("inference", values, TEMPLATES, "1.30").documents[0]
    validate_manifest(deployment, "1.30")
    template = deployment["spec"]["template"]
    env = {e["name"]: e["value"] for e in template["spec"]["initContainers"][0]["env"]}
    assert env["AZCOPY_AUTO_LOGIN_TYPE"] == "WORKLOAD"
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert template["spec"]["serviceAccountName"] == values["name"]
    assert "azure.workload.identity/use" not in deployment["spec"]["selector"]["matchLabels"]
    values["model"]["cache"]["auth"] = "MSI"  # the node's managed identity: no label, no service account
    msi = render("inference", values, TEMPLATES, "1.30").documents[0]["spec"]["template"]
    assert "azure.workload.identity/use" not in msi["metadata"]["labels"] and "serviceAccountName" not in msi["spec"]
