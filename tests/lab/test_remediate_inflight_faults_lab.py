"""Faults that arrive while a scheduled `invoke remediate --yes` run is at work, on lab hosts.

Four hosts, each with the lab's default harden finding (GPU-KRN-002); the in-flight cap is 1, so the run works
through them one batch at a time (gpu-1, gpu-2, gpu-3, gpu-4). While gpu-1's batch is in flight (its attempt is in
the state file), the test:
- takes the dpkg lock on gpu-3 (apt runs there now): its batch's re-probe sees it, the host is left alone;
- makes a GPU of gpu-4 fall off the bus (Xid 79): the plan never weighed it, so gpu-4 is left alone too, not hardened
  on top of a lost GPU;
- starts a second run, as an overlapping timer would: it waits for the state file's lock and gives up with one line
  and exit 4, changing nothing.
The next run (the lock released) hardens gpu-3 and escalates gpu-4's Xid 79 with a page."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.config import test_prefix as lab_prefix
from lab.faults import inject
from lab.services.alert_webhook import AlertReceiver
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
PREFIX = "127.0.105"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("remediate-inflight")
    lab = make_lab(tmp, PREFIX, 4)
    receiver = None
    try:
        receiver = AlertReceiver(host=f"{lab_prefix(PREFIX)}.251").start()
        yield {"lab": lab, "receiver": receiver, "state": tmp / "state"}
    finally:
        if receiver is not None:
            receiver.stop()
        lab.down(purge=True)


def command(fleet: dict[str, Any], *args: str) -> tuple[list[str], dict[str, str]]:
    lab = fleet["lab"]
    env = {**os.environ, "INVOKE_LAB_STATE_DIR": str(lab.paths.state),
           "INVOKE_REMEDIATE_STATE_DIR": str(fleet["state"]), "INVOKE_REMEDIATE_IMDS_ENDPOINT": "",
           "INVOKE_REMEDIATE_WEBHOOK_URL": fleet["receiver"].webhook_url,
           "INVOKE_REMEDIATE_LOAD_GATE_SECONDS": "1", "COLUMNS": "220"}
    exe = ROOT / ".venv/bin/invoke"
    return [str(exe) if exe.exists() else "invoke", "remediate", "--inventory", str(lab.cfg.inventory_path),
            *args], env


def invoke(fleet: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = command(fleet, *args)
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=400)


def in_flight(state_file: Path) -> set[str]:
    try:
        doc = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return set()  # not written yet, or being replaced
    return {a["host"] for a in doc.get("attempts", []) if a.get("ok") is None and a.get("outcome") is None}


def harden_finding(fleet: dict[str, Any], host: str) -> bool:
    """Whether ``host`` still shows GPU-KRN-002 (its apt settings untouched), by the plan of a --check run."""
    doc = json.loads(invoke(fleet, "--check", "--format", "json").stdout)
    return "GPU-KRN-002" in {f["finding"] for h in doc["hosts"] if h["host"] == host for f in h["findings"]}


def test_faults_during_a_run_are_seen_before_acting_and_a_second_run_does_not_overlap(fleet: dict[str, Any]) -> None:
    lab = fleet["lab"]
    state_file = fleet["state"] / "remediate" / "gpu.json"
    argv, env = command(fleet, "--yes", "--format", "json")
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 180
        while "gpu-1" not in in_flight(state_file):
            assert run.poll() is None, "the run ended before gpu-1 was in flight: " + run.communicate()[0][-2000:]
            assert time.monotonic() < deadline, "gpu-1's attempt never showed in flight"
            time.sleep(0.2)
        inject(lab, "gpu-3", "apt-lock")
        inject(lab, "gpu-4", "xid-79")
        started = time.monotonic()
        second = invoke(fleet, "--yes")  # a timer firing while the first run still works
        waited = time.monotonic() - started
        out, err = run.communicate(timeout=400)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()

    assert second.returncode == 4, second.stdout[-2000:] + second.stderr
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "lock" in lines[0] and str(state_file) in lines[0], second.stderr
    assert 9 <= waited < 60  # it waited for the lock (10 s), then gave up

    assert run.returncode == 1, out[-4000:] + err  # hosts left alone
    doc = json.loads(out)
    status = {h["host"]: h["outcome"] for h in doc["hosts"]}
    assert status["gpu-1"]["status"] == "fixed" and status["gpu-2"]["status"] == "fixed", status
    assert status["gpu-3"]["status"] == "blocked" and "dpkg lock held" in status["gpu-3"]["why"], status["gpu-3"]
    assert status["gpu-4"]["status"] == "blocked", status["gpu-4"]
    assert status["gpu-4"]["why"].startswith("new since the plan: GPU-HW-001"), status["gpu-4"]
    state = json.loads(state_file.read_text())
    assert {a["host"] for a in state["attempts"]} == {"gpu-1", "gpu-2"}  # nothing tried on gpu-3 or gpu-4
    assert harden_finding(fleet, "gpu-3") and harden_finding(fleet, "gpu-4")  # their apt settings untouched

    lab.run_in_host("gpu-3", ["pkill", "-f", "lock-frontend"])  # apt is done
    deadline = time.monotonic() + 30
    while not (again := invoke(fleet, "--yes", "--format", "json")).stdout or "dpkg lock held" in again.stdout:
        assert time.monotonic() < deadline, again.stdout[-2000:] + again.stderr
        time.sleep(1)
    doc = json.loads(again.stdout)
    status = {h["host"]: h["outcome"] for h in doc["hosts"]}
    assert status["gpu-3"]["status"] == "fixed", status["gpu-3"]
    pages = {(p.labels["host"], p.labels["finding_id"]) for p in fleet["receiver"].pages}
    assert ("gpu-4", "GPU-HW-001") in pages
    assert {(e["host"], e["finding"]) for e in doc["escalations"]} >= {("gpu-4", "GPU-HW-001")}
