"""The live path: the real ``kubernetes`` client, a kubeconfig, the API stand-in on loopback; and the tasks."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.services import k8s_scenarios as scenarios
from lab.services.k8s_api import FakeKubeApi, kubeconfig
from remediation.k8s.errors import K8sApiError, SnapshotError
from remediation.k8s.live import fetch_snapshot
from remediation.k8s.pending import diagnose_pending

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]


@pytest.fixture(scope="module")
def api() -> Iterator[FakeKubeApi]:
    cluster = scenarios.runbook_cluster()
    with FakeKubeApi(cluster["pods"], cluster["nodes"], cluster["events"]) as server:
        yield server


@pytest.fixture(scope="module")
def config(api: FakeKubeApi, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kubeconfig(api, tmp_path_factory.mktemp("kube") / "config")


def test_live_snapshot_through_the_real_client(api: FakeKubeApi, config: Path) -> None:
    state = fetch_snapshot("training-job-7b-xyz", "ml-team", str(config), timeout=5)
    assert state.pod is not None and state.pod.key == "ml-team/training-job-7b-xyz"
    assert len(state.nodes) == 12 and len(state.pod_events()) == 1
    result = diagnose_pending("", state)
    assert result.verdict == "constraint" and result.fix is not None
    assert "sku=gpu:NoSchedule" in result.findings[0].summary
    sent = [r for r in api.requests if "events" in r]
    assert sent and "fieldSelector=involvedObject.name%3Dtraining-job-7b-xyz" in sent[-1]


def test_missing_pod_is_bad_input(config: Path) -> None:
    with pytest.raises(SnapshotError, match="not found"):
        fetch_snapshot("nope", "ml-team", str(config), timeout=5)


def test_wrong_token_and_no_server(api: FakeKubeApi, tmp_path: Path) -> None:
    bad = kubeconfig(api, tmp_path / "bad")
    bad.write_text(bad.read_text().replace(api.token, "wrong-token"))
    with pytest.raises(K8sApiError, match="HTTP 401"):
        fetch_snapshot("training-job-7b-xyz", "ml-team", str(bad), timeout=5)
    closed = FakeKubeApi()
    gone = kubeconfig(closed, tmp_path / "gone")
    closed._server.server_close()  # the port is no longer served
    with pytest.raises(K8sApiError, match="cannot connect"):
        fetch_snapshot("training-job-7b-xyz", "ml-team", str(gone), timeout=2)
    with pytest.raises(K8sApiError, match="not found"):
        fetch_snapshot("x", "y", str(tmp_path / "missing"))


def test_stand_in_serves_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FakeKubeApi(host="10.0.0.1")


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INVOKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_task_live_and_json(config: Path) -> None:
    result = _invoke("k8s.diagnose-pending", "--pod", "training-job-7b-xyz", "--namespace", "ml-team", "--kubeconfig",
                     str(config), "--format", "json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "constraint" and doc["total_nodes"] == 12
    assert doc["fix"]["tolerations"] == [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert doc["scheduled_on_after_fix"].startswith("aks-gpunp-")


def test_tasks_exit_codes(tmp_path: Path) -> None:
    snap = scenarios.write_snapshot(scenarios.capacity_cluster(), tmp_path / "cap")
    result = _invoke("k8s.diagnose-pending", "--snapshot", str(snap), "--cluster", "myAKS")
    assert result.returncode == 1 and "K8S-PEND-008" in result.stdout and "invoke quota.plan" in result.stdout
    events = tmp_path / "events.txt"
    events.write_text(scenarios.MESSAGE_135 + "\n")
    assert _invoke("k8s.diagnose-pending", "--events", str(events)).returncode == 1
    bad = _invoke("k8s.diagnose-pending", "--snapshot", str(tmp_path / "none"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a directory" in bad.stderr
    assert _invoke("k8s.diagnose-pending").returncode == 2
    render = _invoke("k8s.render", "training-job", "--values", "templates/k8s/examples/training-job.yaml",
                     "--set", "gpu.count=-1")
    assert render.returncode == 2 and "gpu.count" in render.stderr
    rendered = _invoke("k8s.render", "inference", "--values", "templates/k8s/examples/inference.yaml")
    assert rendered.returncode == 0 and "kind: Deployment" in rendered.stdout and "kind: Service" in rendered.stdout
    latency = scenarios.write_snapshot(scenarios.latency_snapshot(), tmp_path / "lat")
    slow = _invoke("k8s.diagnose-latency", "--snapshot", str(latency), "--format", "json")
    assert slow.returncode == 1 and json.loads(slow.stdout)["load_seconds"] == 164.2
    alerts = _invoke("k8s.alerts", "--pending-minutes", "20")
    assert alerts.returncode == 0 and "for: 20m" in alerts.stdout


def test_demo_scene() -> None:
    from rich.console import Console

    from demo import SceneContext
    from demo.k8s import run

    console = Console(record=True, width=140)
    assert run(SceneContext(console=console, root=ROOT, lab=None, hosts=0)) is True  # type: ignore[arg-type]
    shown = console.export_text()
    assert "sku=gpu:NoSchedule" in shown and "K8S-LAT-001" in shown


def test_live_135_dra_cluster_hidden_taint(tmp_path: Path) -> None:
    """Issue 23: a 1.35 cluster with DRA on. The stand-in emits the scheduler's message as FitError.Error() writes
    it (the DynamicResources "no new claims to deallocate" clause, the taint key hidden): the message alone is
    ambiguous with the hint to replay; the live replay names sku=gpu and tolerates it."""
    cluster = scenarios.hidden_taint_cluster()
    with FakeKubeApi(cluster["pods"], cluster["nodes"], cluster["events"], version=cluster["version"]) as server:
        config = kubeconfig(server, tmp_path / "config")
        assert server.answer("GET", "/version", f"Bearer {server.token}")[1]["gitVersion"] == "v1.35.0"
        state = fetch_snapshot("training-job-7b-xyz", "ml-team", str(config), timeout=5)
    event = state.pod_events()[0].message
    assert "no new claims to deallocate, preemption:" in event and "untolerated taint(s)" in event
    text_only = diagnose_pending(event)
    assert text_only.verdict == "ambiguous"
    assert [f.id for f in text_only.findings] == ["K8S-PEND-001", "K8S-PEND-004"]
    assert "--pod P --namespace NS" in text_only.findings[0].summary
    live = diagnose_pending("", state)
    assert live.message is not None and live.message.postfilter == "no new claims to deallocate"
    assert live.message.count("insufficient_gpu") == 9
    assert live.verdict == "constraint" and live.fix is not None
    assert "sku=gpu:NoSchedule" in live.findings[0].summary
