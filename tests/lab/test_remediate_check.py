"""`invoke remediate --check --format json` on lab hosts: the plan from a real audit (an S1 host, an ECC host, two
fresh ones), with the default policy and guards; nothing changes on the hosts and no state is written. Without
--check or --yes, and no terminal to ask on, the task refuses. Acting: tests/lab/test_remediate_act_lab.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.faults import inject
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("remediate"), "127.0.83", 4)
    try:
        inject(lab, "gpu-1", "ecc")
        inject(lab, "gpu-2", "kernel-upgrade")
        yield lab
    finally:
        lab.down(purge=True)


def invoke(fleet, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    env = {**os.environ, "INVOKE_LAB_STATE_DIR": str(fleet.paths.state), "INVOKE_REMEDIATE_STATE_DIR": str(state_dir),
           "COLUMNS": "200"}
    exe = ROOT / ".venv/bin/invoke"
    return subprocess.run([str(exe) if exe.exists() else "invoke", "remediate", "--inventory",
                           str(fleet.cfg.inventory_path), *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          check=False, timeout=300)


def test_check_prints_the_plan_as_a_document_and_changes_nothing(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state_dir = tmp_path / "state"
    r = invoke(fleet, state_dir, "--check", "--format", "json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpufleet.remediate-plan/1" and doc["fleet"] == "gpu"
    hosts = {h["host"]: {f["finding"]: f for f in h["findings"]} for h in doc["hosts"]}
    assert sorted(hosts) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert all(h["boot_id"] for h in doc["hosts"])  # the dedupe key reads the probe's boot id

    ecc = hosts["gpu-1"]
    assert ecc["GPU-HW-003"]["decision"] == "escalate" and ecc["GPU-HW-003"]["action"] == "escalate"
    assert ecc["GPU-KRN-002"]["decision"] == "auto" and ecc["GPU-KRN-002"]["action"] == "harden"
    assert "attempt 1 of 3, 2 left after it" in ecc["GPU-KRN-002"]["why"]

    s1 = hosts["gpu-2"]
    assert s1["GPU-DRV-001"]["decision"] == "blocked" and s1["GPU-DRV-001"]["action"] == "driver-restore"
    assert "allowed only inside a maintenance window or with --allow-reboot" in s1["GPU-DRV-001"]["why"]
    for name in ("gpu-2", "gpu-3", "gpu-4"):  # one host in flight at a time (cap 1 of 4 hosts)
        assert hosts[name]["GPU-KRN-002"]["decision"] == "blocked", hosts[name]
        assert "in-flight cap reached" in hosts[name]["GPU-KRN-002"]["why"]

    breaker = doc["guards"]["breaker"]
    assert breaker["tripped"] is False and breaker["unhealthy"] == ["gpu-1", "gpu-2"]  # 50 % is not above 50 %
    assert not state_dir.exists() or not any(state_dir.rglob("*.json"))  # --check writes no state

    reboot = invoke(fleet, state_dir, "--check", "--format", "json", "--allow-reboot", "--limit", "gpu-2")
    assert reboot.returncode == 0, reboot.stderr
    (only,) = json.loads(reboot.stdout)["hosts"]
    assert {f["finding"]: f["decision"] for f in only["findings"]}["GPU-DRV-001"] == "auto"

    table = invoke(fleet, state_dir, "--check")
    assert table.returncode == 0, table.stderr
    assert "remediate plan, fleet gpu" in table.stdout and "circuit breaker: closed" in table.stdout
    assert "nothing was changed and the state was not written" in table.stdout


def test_without_check_or_yes_and_no_terminal_it_refuses_to_act(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = invoke(fleet, tmp_path)
    assert r.returncode == 2
    assert "remediate changes hosts and there is no terminal to confirm on: pass --yes" in r.stderr
    assert r.stdout == "" and not any(tmp_path.rglob("*.json"))
