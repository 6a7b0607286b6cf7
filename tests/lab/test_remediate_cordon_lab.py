"""`invoke remediate --yes` on lab hosts: cordon ownership and a firing alert. Three hosts, each with the lab's
default harden finding (GPU-KRN-002): gpu-1 carries a person's cordon marker (kept, the host left alone), gpu-2 is
cordoned by the loop for its harden run and uncordoned after the passed gate, gpu-3 has a firing alert in the
Alertmanager stand-in on <prefix>.250 (blocked)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from lab.config import test_prefix as lab_prefix
from lab.services.alertmanager import FakeAlertmanager
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
PREFIX = "127.0.99"
MARKER = "/etc/gpufleet/cordoned"
FOREIGN = "ops (jane): HBM errors under investigation, ticket INC-4411\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("remediate-cordon")
    lab = make_lab(tmp, PREFIX, 3)
    am = None
    try:
        am = FakeAlertmanager(host=f"{lab_prefix(PREFIX)}.250").start()
        yield {"lab": lab, "am": am, "state": tmp / "state"}
    finally:
        if am is not None:
            am.stop()
        lab.down(purge=True)


def invoke(fleet: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    lab = fleet["lab"]
    env = {**os.environ, "INVOKE_LAB_STATE_DIR": str(lab.paths.state),
           "INVOKE_REMEDIATE_STATE_DIR": str(fleet["state"]), "INVOKE_REMEDIATE_IMDS_ENDPOINT": "",
           "INVOKE_REMEDIATE_ALERTMANAGER_URL": fleet["am"].url, "INVOKE_REMEDIATE_MAX_IN_FLIGHT_PCT": "100",
           "COLUMNS": "220"}
    exe = ROOT / ".venv/bin/invoke"
    return subprocess.run([str(exe) if exe.exists() else "invoke", "remediate", "--inventory",
                           str(lab.cfg.inventory_path), *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          check=False, timeout=300)


def test_a_foreign_cordon_is_kept_ours_is_lifted_after_the_gate_and_a_firing_alert_blocks(
        fleet: dict[str, Any]) -> None:
    lab, am = fleet["lab"], fleet["am"]
    foreign = lab.host_path("gpu-1", MARKER)
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_text(FOREIGN)
    am.fire({"alertname": "GpuXidCritical", "instance": "gpu-3:9100", "severity": "critical"})
    am.fire({"alertname": "Muted", "instance": "gpu-2:9100"}, silenced=True)  # silenced: does not block

    r = invoke(fleet, "--yes", "--format", "json")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr  # two hosts blocked
    doc = json.loads(r.stdout)
    out = {h["host"]: h["outcome"] for h in doc["hosts"]}
    assert out["gpu-1"]["status"] == "blocked", out["gpu-1"]
    assert out["gpu-1"]["why"].startswith(f"cordoned by someone else ({MARKER}): ops (jane): HBM errors")
    assert foreign.read_text() == FOREIGN  # never touched
    assert out["gpu-2"]["status"] == "fixed" and out["gpu-2"]["why"].startswith("gate passed"), out["gpu-2"]
    assert out["gpu-2"]["cordon"] == f"uncordoned (our marker {MARKER} removed)"  # set by this run, so removed
    assert not lab.host_path("gpu-2", MARKER).exists()
    assert out["gpu-3"]["status"] == "blocked", out["gpu-3"]
    assert out["gpu-3"]["why"].startswith("firing alert: GpuXidCritical (critical) (Alertmanager)")
    assert not lab.host_path("gpu-3", MARKER).exists()  # a blocked host is never cordoned
    assert any(q.startswith("GET /api/v2/alerts?active=true&silenced=false&inhibited=false") for q in am.requests)
    assert not any("firing alerts not checked" in n for n in doc["notes"])
