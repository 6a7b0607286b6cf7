"""`invoke remediate --yes --allow-reboot` on lab hosts, gated under load. Two hosts, both with the lab's default
harden finding, acted on in one batch (cap 2): gpu-1 has the S1 fault (a kernel update left the driver without its
module), fixed through the driver restore with a reboot, then gated: finding gone, NVML answers, and the lab NVML's
load hook under the load gate's host program; gpu-2 has the fails-under-load fault (healthy while idle, its GPU lost
under load): hardened, its re-audit passes, its load gate fails -> the loop halts, gpu-2 is escalated (a packet)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
PREFIX = "127.0.118"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("remediate-gate")
    lab = make_lab(tmp, PREFIX, 2)
    try:
        inject(lab, "gpu-1", "kernel-upgrade")
        inject(lab, "gpu-2", "fails-under-load")
        yield {"lab": lab, "state": tmp / "state"}
    finally:
        lab.down(purge=True)


def invoke(fleet: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    lab = fleet["lab"]
    env = {**os.environ, "INVOKE_LAB_STATE_DIR": str(lab.paths.state),
           "INVOKE_REMEDIATE_STATE_DIR": str(fleet["state"]), "INVOKE_REMEDIATE_IMDS_ENDPOINT": "",
           "INVOKE_REMEDIATE_MAX_IN_FLIGHT": "2", "INVOKE_REMEDIATE_MAX_IN_FLIGHT_PCT": "100",
           "INVOKE_REMEDIATE_LOAD_GATE_SECONDS": "3", "COLUMNS": "220"}
    exe = ROOT / ".venv/bin/invoke"
    return subprocess.run([str(exe) if exe.exists() else "invoke", "remediate", "--inventory",
                           str(lab.cfg.inventory_path), *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          check=False, timeout=400)


def test_s1_restored_and_gated_under_load_and_a_host_failing_under_load_halts_and_escalates(
    fleet: dict[str, Any],
) -> None:
    lab = fleet["lab"]
    boot_before = lab.host_path("gpu-1", "/proc/sys/kernel/random/boot_id").read_text().strip()
    r = invoke(fleet, "--yes", "--allow-reboot", "--format", "json")
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr  # gpu-2's gate failed
    doc = json.loads(r.stdout)
    out = {h["host"]: h["outcome"] for h in doc["hosts"]}

    s1 = out["gpu-1"]
    assert s1["status"] == "fixed" and "GPU-DRV-001" in s1["findings"], s1
    assert "driver-restore" in s1["actions"] and s1["attempt"] == "ok"
    assert s1["why"].startswith("gate passed: ") and "GPU-DRV-001" in s1["why"] and "NVML answers" in s1["why"]
    assert "; load gate passed: 2 GPU(s) under lab load" in s1["why"] and "utilisation 100 %" in s1["why"], s1["why"]
    assert lab.host_path("gpu-1", "/proc/sys/kernel/random/boot_id").read_text().strip() != boot_before  # rebooted
    assert not lab.host_path("gpu-1", "/run/gpulab/load").exists()  # the hook's file is gone after the load
    # the evidence was kept before the reboot: the packet's facts are of the boot before it, with the incident report
    kept = json.loads((Path(s1["evidence"]) / "packet.json").read_text())
    assert kept["boot_id"] == boot_before and kept["finding"]["id"] == "GPU-DRV-001"
    assert kept["incident_report"] and "GPU-DRV-001" in kept["incident_report"]
    assert out["gpu-2"]["evidence"] is None  # hardened only: no reboot possible, no evidence packet

    bad = out["gpu-2"]
    assert bad["status"] == "failed" and bad["attempt"] == "permanent", bad
    assert bad["why"].startswith("gate: load gate: GPU 0: NVML failed under load (GPU is lost"), bad["why"]
    assert doc["halted"].startswith("gpu-2: gate: load gate:")
    esc = [e for e in doc["escalations"] if e["host"] == "gpu-2"]
    assert esc and all("under load" in e["why"] for e in esc)
    packet = json.loads((Path(esc[0]["packet"]) / "packet.json").read_text())
    assert packet["finding"]["id"] == esc[0]["finding"]
    assert "load gate: when available" in " ".join(doc["notes"])
