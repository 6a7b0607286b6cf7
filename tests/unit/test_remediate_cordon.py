"""Cordon ownership and the loop's new blockers: the rules (pure), the Alertmanager stand-in and the client on
loopback, and a run wired to a stand-in hold (cordon set before acting, lifted after a passed gate, kept after a
failed one, a foreign cordon blocking)."""

from __future__ import annotations

import base64
import datetime as _dt
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from lab.services.alertmanager import FakeAlertmanager
from remediation.config import RemediateSettings
from remediation.hostside import hostcordon
from remediation.remediate.aks import auto_repair
from remediation.remediate.alerts import fetch_alerts, host_names, match
from remediation.remediate.cordon import (
    AT,
    BY,
    OWNER,
    REASON,
    RUN,
    Kind,
    cordon_patch,
    marker,
    node_cordon,
    uncordon_patch,
    vm_cordon,
)
from remediation.remediate.hold import FleetHold
from remediation.remediate.policy import Action
from remediation.rollout.cordon import marker_record
from remediation.transport.inventory import Host
from tests.unit.test_remediate_act import NOW, Fleet, audit_of, decision, run

RUN_ID = "20250101T000000Z-abc123"


def mine(run_id: str = RUN_ID) -> str:
    return json.dumps(marker(run_id, "invoke remediate: harden for GPU-KRN-002 on gpu-1", ["GPU-KRN-002"], NOW))


# --- ownership rules ------------------------------------------------------------------------------------------------


def test_vm_cordon_ownership() -> None:
    assert vm_cordon({}, None, RUN_ID).kind is Kind.NONE
    assert vm_cordon({}, mine(), RUN_ID).kind is Kind.OURS and vm_cordon({}, mine(), RUN_ID).blocks is None
    earlier = vm_cordon({}, mine("20241231T000000Z-old"), RUN_ID)
    assert earlier.kind is Kind.EARLIER and "a person checks the host" in (earlier.blocks or "")
    free = vm_cordon({}, "ops: bad HBM, ticket 4411\n", RUN_ID)
    assert free.kind is Kind.FOREIGN
    assert free.blocks == "cordoned by someone else (/etc/gpufleet/cordoned): ops: bad HBM, ticket 4411 " \
                          "(never undone by the loop)"
    other = vm_cordon({}, json.dumps({"owner": "nvsentinel", "reason": "Xid 79", "run_id": RUN_ID}), RUN_ID)
    assert other.kind is Kind.FOREIGN and (other.blocks or "").startswith("cordoned by nvsentinel: Xid 79")
    flag = vm_cordon({"gpufleet_cordoned": "yes"}, None, RUN_ID)
    assert flag.kind is Kind.FOREIGN and "gpufleet_cordoned: true" in (flag.blocks or "")


def test_the_marker_fits_the_rollouts_read_and_names_who_why_when() -> None:
    long = marker(RUN_ID, "x" * 1000, [f"GPU-KRN-{i:03}" for i in range(20)], NOW)
    text = json.dumps(long, sort_keys=True)
    assert len(text.encode()) <= 400 and marker_record(text) == long
    assert long["owner"] == OWNER and long["at"] == "2025-06-04T12:00:00+00:00" and long["run_id"] == RUN_ID
    assert marker_record("free text") is None and marker_record('["a"]') is None


def node(unschedulable: bool = False, annotations: dict[str, str] | None = None, rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"name": "aks-gpu-0", "resourceVersion": rv, "annotations": annotations or {}},
            "spec": {"unschedulable": True} if unschedulable else {}}


def test_node_cordon_ownership() -> None:
    assert node_cordon(node(), RUN_ID).kind is Kind.NONE
    foreign = node_cordon(node(True), RUN_ID)
    assert foreign.kind is Kind.FOREIGN and "no gpufleet.io/cordoned-by annotation" in (foreign.blocks or "")
    ours = {BY: OWNER, RUN: RUN_ID, REASON: "why", AT: "2025-06-04T12:00:00+00:00"}
    assert node_cordon(node(True, ours), RUN_ID).kind is Kind.OURS
    assert node_cordon(node(True, {**ours, RUN: "older"}), RUN_ID).kind is Kind.EARLIER
    assert node_cordon(node(True, {**ours, BY: "kured"}), RUN_ID).kind is Kind.FOREIGN
    # our annotation left on a node someone uncordoned: no cordon
    assert node_cordon(node(False, ours), RUN_ID).kind is Kind.NONE


def test_node_patches_are_merge_patches_with_the_resource_version() -> None:
    p = cordon_patch(RUN_ID, "why", NOW, "7")
    assert p["spec"] == {"unschedulable": True} and p["metadata"]["resourceVersion"] == "7"
    assert p["metadata"]["labels"] == {BY: OWNER}
    assert p["metadata"]["annotations"] == {BY: OWNER, REASON: "why", AT: "2025-06-04T12:00:00+00:00", RUN: RUN_ID}
    u = uncordon_patch("8")
    assert u["spec"] == {"unschedulable": None} and set(u["metadata"]["annotations"].values()) == {None}


def test_host_program_sets_only_when_absent_and_removes_only_its_own(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "gpufleet" / "cordoned")
    rec = json.loads(mine())

    def call(**req: Any) -> dict[str, Any]:
        hostcordon.main([base64.b64encode(json.dumps({"path": path, **req}).encode()).decode()])
        return dict(json.loads(capsys.readouterr().out))

    assert call(op="uncordon", owner=OWNER, run_id=RUN_ID) == {"result": "absent"}
    assert call(op="cordon", record=rec) == {"result": "set"}
    assert json.loads(Path(path).read_text()) == rec
    held = call(op="cordon", record=rec)
    assert held["result"] == "held" and json.loads(held["text"]) == rec
    assert call(op="uncordon", owner=OWNER, run_id="another-run")["result"] == "not-ours"
    assert call(op="uncordon", owner=OWNER, run_id=RUN_ID) == {"result": "removed"}
    Path(path).write_text("ops: keep out\n")
    assert call(op="cordon", record=rec) == {"result": "held", "text": "ops: keep out\n"}
    assert call(op="uncordon", owner=OWNER, run_id=RUN_ID)["result"] == "not-ours"
    assert Path(path).read_text() == "ops: keep out\n"  # a foreign marker is never removed
    assert [p.name for p in Path(path).parent.iterdir()] == ["cordoned"]  # no temporary file left
    assert call(op="bogus")["result"] == "error"


# --- auto-repair and alerts ----------------------------------------------------------------------------------------


def ev(reason: str, minutes_ago: float) -> dict[str, Any]:
    at = (NOW - _dt.timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")
    return {"reason": reason, "source": {"component": "aks-auto-repair"}, "lastTimestamp": at,
            "involvedObject": {"kind": "Node", "name": "aks-gpu-0"}}


def test_aks_auto_repair_blocks_while_a_step_runs_and_for_an_hour_after() -> None:
    assert auto_repair([], NOW) is None
    assert auto_repair([{"reason": "NodeReady", "lastTimestamp": NOW.isoformat()}], NOW) is None
    running = auto_repair([ev("NodeRebootStart", 2)], NOW)
    assert running is not None and running.startswith("AKS node auto-repair in progress (NodeRebootStart")
    assert "in progress (NodeReimageStart" in (auto_repair([ev("NodeRebootEnd", 20), ev("NodeReimageStart", 3)],
                                                           NOW) or "")
    recent = auto_repair([ev("NodeRebootStart", 30), ev("NodeRebootEnd", 25)], NOW)
    assert recent is not None and "active 25 min ago (NodeRebootEnd)" in recent
    assert auto_repair([ev("NodeRebootStart", 130), ev("NodeRebootEnd", 120)], NOW) is None
    assert auto_repair([ev("NodeRedeployStart", 300)], NOW) is not None  # started, never ended: still in progress


def alert(labels: dict[str, str], state: str = "active") -> dict[str, Any]:
    return {"labels": labels, "status": {"state": state}}


def test_a_firing_alert_names_the_host_by_a_configured_label() -> None:
    names = host_names("gpu-1", {"ansible_host": "10.0.0.5", "k8s_node_name": "aks-gpu-0"})
    assert names == {"gpu-1", "10.0.0.5", "aks-gpu-0"}
    assert match([alert({"alertname": "GpuXid", "instance": "10.0.0.5:9100", "severity": "critical"})], names) \
        == "firing alert: GpuXid (critical) (Alertmanager): the next run looks again"
    assert match([alert({"alertname": "NodeDown", "node": "aks-gpu-0"})], names) is not None
    assert match([alert({"alertname": "X", "instance": "gpu-10:9100"})], names) is None
    assert match([alert({"alertname": "X", "host": "gpu-1"}, state="suppressed")], names) is None
    assert match([alert({"alertname": "X", "hostname": "gpu-1"})], names) is None
    assert match([alert({"alertname": "X", "hostname": "gpu-1"})], names, ("hostname",)) is not None


def test_alertmanager_stand_in_answers_the_v2_filters_and_the_client_fails_closed() -> None:
    with FakeAlertmanager() as am:
        am.fire({"alertname": "GpuXid", "instance": "gpu-1:9100"})
        am.fire({"alertname": "Muted", "instance": "gpu-2:9100"}, silenced=True)
        am.fire({"alertname": "Inhibited", "instance": "gpu-3:9100"}, inhibited=True)
        got = fetch_alerts(am.url, timeout=2)
        assert got.error is None and [a["labels"]["alertname"] for a in got.alerts] == ["GpuXid"]
        assert am.requests[-1] == "GET /api/v2/alerts?active=true&silenced=false&inhibited=false"
        status, every = am.answer("GET", "/api/v2/alerts")
        assert status == 200 and len(every) == 3  # every flag defaults to true
        status, body = am.answer("GET", '/api/v2/alerts?filter=alertname%3D~%22Gpu.%2A%22')
        assert [a["labels"]["alertname"] for a in body] == ["GpuXid"]
        assert am.answer("GET", "/api/v2/alerts?active=maybe")[0] == 400
        assert {"fingerprint", "startsAt", "endsAt", "receivers", "status"} <= set(got.alerts[0])
        am.down = True
        assert "HTTP 503" in (fetch_alerts(am.url, timeout=2).error or "")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = fetch_alerts(f"http://127.0.0.1:{port}", timeout=1)
    assert down.error is not None and "unreachable" in down.error


def test_fleet_hold_checks_alerts_fail_closed_and_says_when_unchecked() -> None:
    hosts = [Host("gpu-1", "127.0.0.1", vars={"k8s_node_name": "aks-gpu-0"})]
    none = FleetHold(RemediateSettings(), hosts, None, RUN_ID, lambda: NOW,  # type: ignore[arg-type]
                     node_api=lambda: Nodes(node()))
    assert "firing alerts not checked (remediate.alertmanager_url is empty)" in none.notes
    assert none.check(hosts) == {}
    from remediation.remediate.alerts import Alerts

    cfg = RemediateSettings(alertmanager_url="http://127.0.0.1:9")
    bad = FleetHold(cfg, hosts, None, RUN_ID, lambda: NOW,  # type: ignore[arg-type]
                    fetch=lambda url, timeout: Alerts(error="Alertmanager x unreachable (refused)"),
                    node_api=lambda: Nodes(node()))
    assert bad.check(hosts) == {"gpu-1": "firing alerts unknown: Alertmanager x unreachable (refused): nothing is "
                                         "changed without them"}


class Nodes:
    """A stand-in :class:`~remediation.remediate.aks.NodeApi` holding one node."""

    def __init__(self, obj: dict[str, Any], events: list[dict[str, Any]] | None = None) -> None:
        self.obj, self.ev, self.patches = obj, events or [], []  # type: list[dict[str, Any]]

    def node(self, name: str) -> dict[str, Any]:
        return self.obj

    def events(self, name: str) -> list[dict[str, Any]]:
        return self.ev

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        from lab.services.k8s_api import merge_patch

        self.patches.append(body)
        self.obj = merge_patch(self.obj, body)
        return self.obj

    def close(self) -> None:
        pass


def test_fleet_hold_cordons_an_aks_node_and_lifts_only_its_own() -> None:
    hosts = [Host("gpu-1", "127.0.0.1", vars={"k8s_node_name": "aks-gpu-0"})]
    nodes = Nodes(node())
    h = FleetHold(RemediateSettings(), hosts, None, RUN_ID, lambda: NOW,  # type: ignore[arg-type]
                  node_api=lambda: nodes)
    assert h.cordon(hosts, {"gpu-1": [decision("GPU-KRN-002")]}) == {}
    assert nodes.obj["spec"]["unschedulable"] is True and nodes.obj["metadata"]["annotations"][RUN] == RUN_ID
    assert h.check(hosts) == {}  # our own cordon does not block this run
    assert h.release(hosts)["gpu-1"].startswith("uncordoned (node aks-gpu-0")
    assert "unschedulable" not in nodes.obj["spec"] and BY not in nodes.obj["metadata"]["annotations"]
    nodes.obj = node(True)  # someone else's
    assert "cordoned by someone else" in h.check(hosts)["gpu-1"]
    assert "cordoned by someone else" in h.cordon(hosts, {"gpu-1": [decision("GPU-KRN-002")]})["gpu-1"]
    nodes.obj, nodes.ev = node(), [ev("NodeRebootStart", 1)]
    assert "AKS node auto-repair in progress" in h.check(hosts)["gpu-1"]


# --- the loop with a stand-in hold ----------------------------------------------------------------------------------


class Hold:
    def __init__(self, blocked: dict[str, str] | None = None) -> None:
        self.run_id = RUN_ID
        self.notes = ("a note",)
        self.blocked = blocked or {}
        self.cordoned: list[str] = []
        self.released: list[str] = []

    def check(self, hosts: Any) -> dict[str, str]:
        return {h.name: why for h in hosts if (why := self.blocked.get(h.name))}

    def cordon(self, hosts: Any, decisions: Any) -> dict[str, str]:
        self.cordoned += [h.name for h in hosts]
        return {}

    def release(self, hosts: Any) -> dict[str, str]:
        self.released += [h.name for h in hosts]
        return {h.name: "uncordoned" for h in hosts}

    def kept(self, name: str) -> str:
        return "left cordoned" if name in self.cordoned and name not in self.released else ""


def test_a_run_cordons_before_acting_lifts_after_the_gate_and_keeps_a_failed_host(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"], "gpu-2": ["GPU-KRN-002"], "gpu-3": ["GPU-KRN-002"]},
                  stubborn=("gpu-3",))
    hold = Hold({"gpu-2": "cordoned by ops: ticket 1"})
    plain = fleet.ports

    def ports() -> Any:
        p = plain()
        p.hold = lambda *a, **kw: hold
        return p

    fleet.ports = ports  # type: ignore[method-assign]
    result = run(fleet, tmp_path, max_in_flight=3, max_in_flight_pct=100.0)
    out = result.outcomes
    assert out["gpu-2"].status.value == "blocked" and out["gpu-2"].why == "cordoned by ops: ticket 1"
    assert fleet.hardened == [["gpu-1", "gpu-3"]] and hold.cordoned == ["gpu-1", "gpu-3"]
    assert out["gpu-1"].status.value == "fixed" and out["gpu-1"].cordon == "uncordoned"
    assert out["gpu-3"].status.value == "failed" and out["gpu-3"].cordon == "left cordoned"
    assert hold.released == ["gpu-1"] and "a note" in result.notes
    assert result.to_dict()["hosts"][0]["outcome"]["cordon"] == "uncordoned"


def test_blocker_reports_a_hold_after_a_failed_reprobe_only() -> None:
    from remediation.remediate.act import blocker

    fresh = audit_of("gpu-1", "GPU-KRN-002")
    assert blocker([decision("GPU-KRN-002")], fresh, None, events_checked=False, held="firing alert: X") \
        == "firing alert: X"
    assert blocker([decision("GPU-KRN-002")], None, None, held="firing alert: X", events_checked=False
                   ).startswith("re-probe failed")  # type: ignore[union-attr]


# --- the AKS cordon through the real client, against the Kubernetes API stand-in on loopback -----------------------


def test_aks_cordon_through_the_kubernetes_client_and_the_stand_in(tmp_path: Path) -> None:
    from lab.services.k8s_api import FakeKubeApi, kubeconfig
    from lab.services.k8s_scenarios import node as make_node

    gpu, other = make_node("aks-gpu-0", "gpunp", "Standard_NC24ads_A100_v4", "24", "220Gi", gpus=1), \
        make_node("aks-gpu-1", "gpunp", "Standard_NC24ads_A100_v4", "24", "220Gi", gpus=1)
    other["spec"]["unschedulable"] = True  # kubectl cordon by a person: no annotation of ours
    repair = {**ev("NodeRebootStart", 1), "metadata": {"name": "r1", "namespace": "default"}}
    repair["involvedObject"] = {"kind": "Node", "name": "aks-gpu-2"}
    with FakeKubeApi(nodes=[gpu, other, make_node("aks-gpu-2", "gpunp", "x", "24", "220Gi")],
                     events=[repair]) as api:
        cfg = RemediateSettings(kubeconfig=str(kubeconfig(api, tmp_path / "kubeconfig")), kube_timeout_s=5)
        hosts = [Host(f"gpu-{i}", "127.0.0.1", vars={"k8s_node_name": f"aks-gpu-{i}"}) for i in range(3)]
        hold = FleetHold(cfg, hosts, None, RUN_ID, lambda: NOW)  # type: ignore[arg-type]
        try:
            blocked = hold.check(hosts)
            assert set(blocked) == {"gpu-1", "gpu-2"}
            assert blocked["gpu-1"].startswith("cordoned by someone else (no gpufleet.io/cordoned-by annotation)")
            assert blocked["gpu-2"].startswith("AKS node auto-repair in progress (NodeRebootStart")
            assert hold.cordon(hosts[:1], {"gpu-0": [decision("GPU-DRV-001", Action.DRIVER_RESTORE, "gpu-0")]}) == {}
            n = api.node("aks-gpu-0")
            assert n["spec"]["unschedulable"] is True and n["metadata"]["labels"][BY] == OWNER
            assert n["metadata"]["annotations"][REASON].startswith("invoke remediate: driver-restore for GPU-DRV-001")
            assert n["metadata"]["annotations"][RUN] == RUN_ID and n["metadata"]["resourceVersion"] == "2"
            assert any(r.startswith("PATCH /api/v1/nodes/aks-gpu-0") for r in api.requests)
            assert hold.release(hosts[:1])["gpu-0"].startswith("uncordoned")
            n = api.node("aks-gpu-0")
            assert "unschedulable" not in n["spec"] and BY not in n["metadata"]["labels"]
            assert not any(k.startswith("gpufleet.io/") for k in n["metadata"]["annotations"])
            assert n["spec"]["providerID"]  # the rest of the node untouched
            assert api.node("aks-gpu-1")["spec"]["unschedulable"] is True  # a foreign cordon is never touched
            assert hold.release(hosts[1:2]) == {}  # not set by this run: nothing to lift
        finally:
            hold.close()
        token = f"Bearer {api.token}"
        stale = json.dumps({"metadata": {"resourceVersion": "1"}, "spec": {"unschedulable": True}}).encode()
        status, body = api.answer("PATCH", "/api/v1/nodes/aks-gpu-0", token, stale, "application/merge-patch+json")
        assert status == 409 and body["reason"] == "Conflict"
        assert api.answer("PATCH", "/api/v1/nodes/aks-gpu-0", token, b"[]", "application/json-patch+json")[0] == 415
        assert api.answer("DELETE", "/api/v1/nodes/aks-gpu-0", token)[0] == 405
