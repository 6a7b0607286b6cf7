"""The probe's documents from a real H200 (tests/fixtures/real-gpu-h200/README.md) through the audit's own path:
the facts loader accepts them, no check finds anything wrong with a healthy GPU, and the GPU work a job puts on the
device is seen both ways the restore's guard reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remediation.core.checks import run_checks
from remediation.core.checks.policy import Policy
from remediation.core.facts import facts_from_dict
from remediation.restore.rules import decide

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-gpu-h200"


def _doc(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((REAL / name).read_text())


@pytest.mark.parametrize(
    "name", ["probe-root-idle.json", "probe-root-job.json", "probe-user-job.json", "probe-daemon-job.json"]
)
def test_a_healthy_real_gpu_has_no_findings(name: str) -> None:
    facts = facts_from_dict(_doc(name), host="h200")
    assert not facts.nvml.failed
    assert run_checks(facts, Policy()) == ()


def test_a_job_on_the_real_gpu_is_seen_by_nvml_and_by_the_device_scan() -> None:
    doc = _doc("probe-root-job.json")
    nvml_pids = {p["pid"] for g in doc["nvml"]["gpus"] for p in g["processes"]}
    scan_pids = {u["pid"] for u in doc["device_users"]["users"] if not u["service"]}
    assert nvml_pids == scan_pids == {452}
    facts = facts_from_dict(doc, host="h200")
    assert facts.nvml.ok and facts.nvml.gpus[0].name == "NVIDIA H200"


def test_a_driver_daemon_with_a_cut_comm_is_a_service_on_the_real_gpu() -> None:
    """The kernel cuts comm to 15 characters (nvidia-persiste); the probe names the process by its executable."""
    facts = facts_from_dict(_doc("probe-daemon-job.json"), host="h200")
    by_comm = {u.comm: u for u in facts.device_users.users}
    assert by_comm["nvidia-persiste"].service and by_comm["nvidia-persiste"].exe == "nvidia-persistenced"
    assert not by_comm["python3"].service
    assert {p.pid for g in facts.nvml.gpus for p in g.processes} == {by_comm["python3"].pid}


def test_an_unprivileged_probe_on_the_real_gpu_cannot_clear_a_restore() -> None:
    """As a user without sudo the scan sees nobody's processes: with NVML failing, the restore must refuse."""
    doc = _doc("probe-user-euid.json")
    assert facts_from_dict(doc, host="h200").unprivileged
    doc["nvml"] = {"ok": False, "error_class": "version_mismatch", "error": "Driver/library version mismatch",
                   "error_code": 18, "gpus": []}
    facts = facts_from_dict(doc, host="h200")
    findings = run_checks(facts, Policy())
    assert "GPU-DRV-002" in {f.id for f in findings}
    decision = decide("h200", facts, findings, {"nvidia_driver_expected_version": "580.159.04"})
    assert decision.blocked is not None and "ansible_become: true" in decision.blocked
