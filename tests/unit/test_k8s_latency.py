"""Model-load times from server logs, the latency diagnosis of the runbook's S5 pod, and the alert rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.services import k8s_scenarios as scenarios
from remediation.core.errors import TemplateError
from remediation.host.diagnose import diagnose
from remediation.k8s.alerts import check_rules, render_rules
from remediation.k8s.latency import cpu_throttling, diagnose_latency
from remediation.k8s.modelload import parse
from remediation.k8s.snapshot import load_snapshot
from tests.corpus import blocks

# corpus section -> (server, load_seconds)
LOADS = {
    "6.2": ("vllm", 16.0),  # V0: weights line = memory; the shard bar's 2 s + "Graph capturing finished in 14 secs"
    "6.4": ("vllm", 31.657031),  # V1: "Model loading took ... and N seconds"
    "6.6": ("vllm", 3.04),  # V1 with a drafter load after it
    "6.8": ("vllm", 0.0),  # V0: start and end markers in the same second
    "6.10": ("vllm", None),  # a start marker and no end
    "6.12": ("tgi", 218.658884257),  # the slowest rank
    "6.14": ("torchserve", 2.454),  # the slowest worker's load metric (ms)
    "6.16": ("triton", None),  # a load start without its end
}


@pytest.mark.parametrize("section", sorted(LOADS))
def test_model_load_corpus(section: str) -> None:
    server, seconds = LOADS[section]
    text = blocks()[section][0]
    result = diagnose(text)
    assert result.kind == "model-load"
    assert result.facts == {"load_seconds": seconds, "server": server}


def test_more_servers_and_the_runbook_line() -> None:
    assert parse("[2024-07-15 08:14:47] Model loaded in 164.2 seconds").load_seconds == 164.2
    ollama = 'time=2024-06-01T10:00:03Z level=INFO source=server.go:545 msg="llama runner started in 7.52 seconds"'
    assert parse(ollama).facts() == {"load_seconds": 7.52, "server": "ollama"}
    triton = (
        "I0501 10:50:06.556296 11894 model_lifecycle.cc:459] loading: VehicleREID_onnx:1\n"
        "I0501 10:52:16.756296 11894 model_lifecycle.cc:694] successfully loaded 'VehicleREID_onnx' version 1\n"
    )
    assert parse(triton).facts() == {"load_seconds": pytest.approx(130.2), "server": "triton"}
    tp2 = (
        "(Worker_TP0 pid=1) INFO 05-06 20:59:59 [gpu_model_runner.py:4879] Model loading took 12 GiB memory and "
        "30.5 seconds\n(Worker_TP1 pid=2) INFO 05-06 21:00:01 [gpu_model_runner.py:4879] Model loading took 12 GiB "
        "memory and 32.5 seconds\n"
    )
    assert parse(tp2).load_seconds == 32.5  # parallel workers: the slowest, not the sum
    slow = diagnose("[2024-07-15 08:14:47] Model loaded in 164.2 seconds")
    assert [f.id for f in slow.findings] == ["K8S-LAT-003"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_model_load_no_crash(text: str) -> None:
    result = parse(text)
    assert result.load_seconds is None or result.load_seconds >= 0
    if text.strip():
        assert set(diagnose(text, kind="model-load").facts) == {"load_seconds", "server"}


def test_runbook_latency_spike(tmp_path: Path) -> None:
    scene = scenarios.latency_snapshot()
    directory = scenarios.write_snapshot(scene, tmp_path / "s5")
    result = diagnose_latency(load_snapshot(directory), scene["logs"], scene["facts"], scene["metrics"])
    ids = [f.id for f in result.findings]
    assert {"K8S-LAT-001", "K8S-LAT-002", "K8S-LAT-003", "K8S-LAT-004", "K8S-LAT-005", "K8S-LAT-006"} <= set(ids)
    assert "GPU-THM-001" in ids and "GPU-THM-003" in ids  # the host audit's own rules on the node's facts
    assert result.load is not None and result.load.load_seconds == 164.2
    assert [r.reason for r in result.restarts] == ["OOMKilled"]
    assert [d.kind for d in result.disruptions] == ["evicted"]
    assert result.throttled == pytest.approx(0.31)
    assert [n.pod for n in result.neighbours] == ["data/etl-batch-5f6d7-xyz12"]  # the DaemonSet pod is not one
    fixes = dict(result.fixes)
    assert yaml.safe_load(fixes["K8S-LAT-001"]) == {"resources": {"memory": "48Gi"}}
    assert yaml.safe_load(fixes["K8S-LAT-003"])["model"] == {"cache": {"enabled": True}}
    assert yaml.safe_load(fixes["K8S-LAT-005"])["dedicated"] == {"enabled": True}


def test_a_healthy_server_has_no_findings() -> None:
    scene = scenarios.latency_snapshot()
    pod = scene["pod"]
    pod["status"]["containerStatuses"][0]["restartCount"] = 0
    pod["status"]["containerStatuses"][0].pop("lastState")
    container = pod["spec"]["containers"][0]
    container["readinessProbe"] = {"httpGet": {"path": "/health", "port": 8000}}
    container["startupProbe"] = {"httpGet": {"path": "/health", "port": 8000}, "failureThreshold": 90}
    from remediation.k8s.objects import node_from_dict, pod_from_dict
    from remediation.k8s.snapshot import Snapshot

    state = Snapshot(pod_from_dict(pod), tuple(node_from_dict(n) for n in scene["nodes"]), (pod_from_dict(pod),))
    result = diagnose_latency(state, "INFO 07-15 08:14:47 x.py:1] Model loading took 9 GiB memory and 12.0 seconds")
    assert result.findings == ()


def test_spot_reclaim_and_drain_from_events() -> None:
    from remediation.k8s.objects import event_from_dict, node_from_dict, pod_from_dict
    from remediation.k8s.snapshot import Snapshot

    scene = scenarios.latency_snapshot()
    node = scenarios.node(scene["pod"]["spec"]["nodeName"], "spot", "Standard_NC24ads_A100_v4", "24", "200Gi",
                          gpus=1, spot=True)
    pod = scene["pod"]
    pod["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                    "message": "Eviction API: evicting"}]
    events = [scenarios.event(node, "PreemptScheduled", "VM is scheduled for Preempt (spot eviction)",
                              component="node-problem-detector", kind="Node")]
    state = Snapshot(pod_from_dict(pod), (node_from_dict(node),), (), tuple(event_from_dict(e) for e in events))
    result = diagnose_latency(state)
    assert {d.kind for d in result.disruptions} == {"drain", "spot_reclaim"}
    assert any("spot node" in note for note in result.notes)


def test_cpu_throttling_metrics() -> None:
    text = (
        'container_cpu_cfs_periods_total{container="a",namespace="n",pod="p"} 100\n'
        'container_cpu_cfs_throttled_periods_total{container="a",namespace="n",pod="p"} 40\n'
        'container_cpu_cfs_periods_total{container="",namespace="n",pod="p"} 100\n'
        "garbage line\n"
    )
    assert cpu_throttling(text) == {"n/p": 0.4}


def test_alert_rules_parse_and_check() -> None:
    doc = yaml.safe_load(render_rules(temp_c=78, pending_minutes=15))
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert set(alerts) == {"GpuTemperatureHigh", "GpuXidError", "GpuXidErrorApplication", "GpuPodPending",
                           "GpuPodUnschedulable"}
    assert "DCGM_FI_DEV_GPU_TEMP" in alerts["GpuTemperatureHigh"]["expr"] and "> 78" in alerts[
        "GpuTemperatureHigh"]["expr"]
    assert "DCGM_FI_DEV_XID_ERRORS" in alerts["GpuXidError"]["expr"]
    assert 'resource="nvidia_com_gpu"' in alerts["GpuPodPending"]["expr"] and alerts["GpuPodPending"]["for"] == "15m"
    for rule in alerts.values():
        promql_parser.parse(rule["expr"])  # raises on invalid PromQL
    operator = yaml.safe_load(render_rules(format="prometheusrule"))
    assert operator["kind"] == "PrometheusRule" and operator["spec"]["groups"] == yaml.safe_load(render_rules())[
        "groups"]
    with pytest.raises(TemplateError, match="for"):
        check_rules({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "for": "ten"}]}]})


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    """promtool where it is installed (Debian package prometheus); the parser check above runs everywhere."""
    promtool = shutil.which("promtool")
    rules = tmp_path / "rules.yml"
    rules.write_text(render_rules())
    if promtool is None:
        assert yaml.safe_load(rules.read_text())["groups"]
        return
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout
