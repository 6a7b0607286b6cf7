"""`invoke remediate --yes` on lab hosts: it acts. Three hosts, each with the lab's default harden finding
(GPU-KRN-002): gpu-1 also has an ECC fault (escalated: a packet, a page to the webhook stand-in), gpu-3 has a
pending Azure Scheduled Event (the IMDS stand-in on <prefix>.250; left alone). gpu-1 and gpu-2 are hardened, one
batch each (cap 1), and gated. A second run pages nothing again and reads the first run's attempts (the budget)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.config import test_prefix as lab_prefix
from lab.faults import inject
from lab.services.alert_webhook import AlertReceiver
from lab.services.imds import FakeImds
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
PREFIX = "127.0.84"
VMS = {"gpu-1": "gpu-vm-1", "gpu-2": "gpu-vm-2", "gpu-3": "gpu-vm-3"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("remediate-act")
    lab = make_lab(tmp, PREFIX, 3, host_overrides={h: {"azure_vm_name": vm} for h, vm in VMS.items()})
    imds = receiver = None
    try:
        inject(lab, "gpu-1", "ecc")
        imds = FakeImds(host=f"{lab_prefix(PREFIX)}.250").start()
        receiver = AlertReceiver(host=f"{lab_prefix(PREFIX)}.251").start()
        yield {"lab": lab, "imds": imds, "receiver": receiver, "state": tmp / "state"}
    finally:
        for service in (imds, receiver):
            if service is not None:
                service.stop()
        lab.down(purge=True)


def invoke(fleet: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    lab = fleet["lab"]
    env = {**os.environ, "INVOKE_LAB_STATE_DIR": str(lab.paths.state),
           "INVOKE_REMEDIATE_STATE_DIR": str(fleet["state"]),
           "INVOKE_REMEDIATE_IMDS_ENDPOINT": fleet["imds"].endpoint,
           "INVOKE_REMEDIATE_WEBHOOK_URL": fleet["receiver"].webhook_url, "COLUMNS": "220"}
    exe = ROOT / ".venv/bin/invoke"
    return subprocess.run([str(exe) if exe.exists() else "invoke", "remediate", "--inventory",
                           str(lab.cfg.inventory_path), *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          check=False, timeout=300)


def test_acting_fixes_escalates_pages_once_and_leaves_a_scheduled_event_alone(fleet: dict[str, Any]) -> None:
    imds: FakeImds = fleet["imds"]
    receiver: AlertReceiver = fleet["receiver"]
    event = imds.schedule("Redeploy", ["gpu-vm-3"], in_seconds=6 * 3600, description="Host hardware degraded")

    r = invoke(fleet, "--yes", "--format", "json")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr  # an escalation and a blocked host
    doc = json.loads(r.stdout)
    out = {h["host"]: h["outcome"] for h in doc["hosts"]}
    assert out["gpu-1"]["status"] == "fixed" and "GPU-KRN-002" in out["gpu-1"]["findings"], out["gpu-1"]
    assert out["gpu-1"]["why"].startswith("gate passed: GPU-KRN-002, GPU-KRN-003, GPU-KRN-004 gone, NVML answers")
    assert out["gpu-2"]["status"] == "fixed" and out["gpu-2"]["attempt"] == "ok", out["gpu-2"]
    assert out["gpu-3"]["status"] == "blocked" and event in out["gpu-3"]["why"], out["gpu-3"]
    assert "Azure Scheduled Events: wait" in out["gpu-3"]["why"]
    escalated = {e["finding"]: e for e in doc["escalations"]}
    assert len(escalated) == len(doc["escalations"])  # one escalation per (host, finding, boot)
    assert {(e["host"], e["page"]) for e in escalated.values()} == {("gpu-1", "sent")}
    assert all(f.startswith("GPU-HW-") for f in escalated)
    esc = escalated["GPU-HW-003"]
    packet = json.loads((Path(esc["packet"]) / "packet.json").read_text())
    assert packet["dedupe_key"] == esc["dedupe_key"] and packet["finding"]["id"] == "GPU-HW-003"
    assert sorted((p.labels["host"], p.labels["finding_id"]) for p in receiver.pages) == [
        ("gpu-1", f) for f in sorted(escalated)]
    state = json.loads((fleet["state"] / "remediate" / "gpu.json").read_text())
    # one harden run per host fixed three findings: three attempts recorded at one time, one of the budget
    assert {(a["host"], a["ok"]) for a in state["attempts"]} == {("gpu-1", True), ("gpu-2", True)}
    assert len({(a["host"], a["at"]) for a in state["attempts"]}) == 2

    again = invoke(fleet, "--yes")  # the table view, with the outcome per host
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr
    assert "remediate run, fleet gpu" in again.stdout and "already paged" in again.stdout
    assert len(receiver.deliveries) == len(escalated)  # paged once across two runs
    second = invoke(fleet, "--check", "--format", "json")
    hosts = {h["host"]: h for h in json.loads(second.stdout)["hosts"]}
    assert hosts["gpu-1"]["attempts"]["used"] == 1 and hosts["gpu-2"]["attempts"]["used"] == 1  # the budget holds
    assert "GPU-KRN-002" not in {f["finding"] for f in hosts["gpu-2"]["findings"]}
    assert {f["finding"]: f["decision"] for f in hosts["gpu-3"]["findings"]}["GPU-KRN-002"] == "auto"


def test_an_event_due_now_is_left_to_the_platform_escalated_and_paged_once(fleet: dict[str, Any]) -> None:
    """gpu-3 still has its harden finding; now a Reboot for its VM is due in 5 minutes (inside the 30-minute horizon):
    the loop leaves the host alone, writes an AZ-SE-001 packet and pages once; a later run does not page again."""
    imds: FakeImds = fleet["imds"]
    receiver: AlertReceiver = fleet["receiver"]
    imds.clear()
    event = imds.schedule("Reboot", ["gpu-vm-3"], in_seconds=300, description="Host OS update")
    before = len(receiver.deliveries)

    r = invoke(fleet, "--yes", "--format", "json")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr
    doc = json.loads(r.stdout)
    out = {h["host"]: h["outcome"] for h in doc["hosts"]}
    assert out["gpu-3"]["status"] == "escalated" and "AZ-SE-001" in out["gpu-3"]["why"], out["gpu-3"]
    assert event in out["gpu-3"]["why"] and "horizon" in out["gpu-3"]["why"]
    (esc,) = [e for e in doc["escalations"] if e["finding"] == "AZ-SE-001"]
    assert esc["host"] == "gpu-3" and esc["page"] == "sent"
    packet = json.loads((Path(esc["packet"]) / "packet.json").read_text())
    assert any(event in line for line in packet["finding"]["evidence"])
    assert any("GPU-KRN-002" in line for line in packet["finding"]["evidence"])
    pages = [p for p in receiver.pages if p.labels["finding_id"] == "AZ-SE-001"]
    assert [p.labels["host"] for p in pages] == ["gpu-3"] and len(receiver.deliveries) == before + 1
    # nothing was done on gpu-3: its harden finding is still there, and no attempt was recorded for it
    state = json.loads((fleet["state"] / "remediate" / "gpu.json").read_text())
    assert "gpu-3" not in {a["host"] for a in state["attempts"]}
    check = json.loads(invoke(fleet, "--check", "--format", "json").stdout)
    assert "GPU-KRN-002" in {f["finding"] for h in check["hosts"] if h["host"] == "gpu-3" for f in h["findings"]}

    again = invoke(fleet, "--yes", "--format", "json")
    esc2 = [e for e in json.loads(again.stdout)["escalations"] if e["finding"] == "AZ-SE-001"]
    assert [e["page"][:12] for e in esc2] == ["already page"] and len(receiver.deliveries) == before + 1
