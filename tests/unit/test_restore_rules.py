"""The restore's planning rules, from real facts documents (fixtures) shaped per case."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from remediation.core.checks import Policy, run_checks
from remediation.core.facts import facts_from_dict
from remediation.restore.rules import Action, decide

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
VARS = {"nvidia_driver_expected_version": "535.183.01", "nvidia_driver_branch": "535"}


def _doc(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def _pick(pred) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    for p in sorted(FIXTURES.glob("*.json")):
        d = json.loads(p.read_text())
        if isinstance(d, dict) and str(d.get("schema", "")).startswith("gpufleet.facts/") and pred(d):
            return d
    pytest.fail(f"no facts fixture in {FIXTURES} matches this case: add one")


def _decide(doc: dict[str, Any], vars_: dict[str, Any] | None = None, **kw: Any):  # type: ignore[no-untyped-def]
    facts = facts_from_dict(doc, host="h")
    findings = run_checks(facts, Policy(expected_driver_version="535.183.01"))
    return decide("h", facts, findings, vars_ if vars_ is not None else VARS, **kw)


def _module_missing() -> dict[str, Any]:
    return _pick(lambda d: (d.get("nvml") or {}).get("error_class") == "driver_not_loaded"
                 and len((d.get("packages") or {}).get("kernels") or []) >= 2)


def _healthy() -> dict[str, Any]:
    return _pick(lambda d: (d.get("nvml") or {}).get("ok") is True and (d.get("packages") or {}).get("nvidia"))


def test_module_missing_rebuilds_with_headers_and_pinned_version() -> None:
    d = _decide(_module_missing())
    assert d.action is Action.REBUILD and d.changes_host
    assert d.driver_version and d.driver_version.startswith("535.")
    assert any(p.startswith("linux-headers-") for p in d.install_packages) or "already installed" in d.steps[0]
    assert "nvidia-driver-535" in d.hold_packages
    assert d.needs_reboot


def test_prefer_previous_kernel_boots_the_kernel_with_a_module() -> None:
    d = _decide(_module_missing(), prefer="previous-kernel")
    assert d.action is Action.PREVIOUS_KERNEL
    assert d.target_kernel and d.target_kernel != d.booted_kernel
    assert d.to_dict()["grub_default"] == f"Advanced options for Ubuntu>Ubuntu, with Linux {d.target_kernel}"
    assert not d.install_packages


def test_gpu_lost_is_not_a_driver_problem() -> None:
    doc = copy.deepcopy(_healthy())
    doc["nvml"]["ok"] = False
    doc["nvml"]["error_class"] = "gpu_lost"
    doc["nvml"]["gpus"][-1] = {"index": len(doc["nvml"]["gpus"]) - 1, "ok": False, "error_class": "gpu_lost",
                               "error": "GPU is lost"}
    d = _decide(doc)
    assert d.action is Action.NOT_DRIVER and not d.changes_host
    assert "not a driver problem" in d.reason and "redeploy" in d.reason


def test_healthy_needs_nothing_and_running_processes_block_a_restore() -> None:
    assert _decide(_healthy()).action is Action.NONE
    doc = _module_missing()
    d = _decide(doc)
    assert d.changes_host
    # NVML lists compute processes on a host it answers on: a restore there (predictive rebuild) waits for them.
    busy = copy.deepcopy(_healthy())
    busy["nvml"]["gpus"][0]["processes"] = [{"pid": 4242, "used_memory": 1, "name": "python3"}]
    assert "pid 4242" in (_decide(busy).blocked or "pid 4242")


def _mismatch_with(users: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What the probe reports for a driver/library mismatch: NVML init fails, so no GPUs and no NVML processes."""
    doc = json.loads((FIXTURES / "version_mismatch.json").read_text())
    assert doc["nvml"]["ok"] is False and doc["nvml"]["gpus"] == []
    if users is None:
        doc.pop("device_users", None)  # an older probe, or /proc unreadable
    else:
        doc["device_users"] = {"users": users, "unreadable": 0, "truncated": False}
    return doc


MISMATCH_VARS = {**VARS, "nvidia_driver_expected_version": "535.216.01"}  # the userspace the fixture upgraded to


def test_a_mismatch_host_with_a_job_holding_the_gpu_is_refused_without_force() -> None:
    job = {"pid": 3121, "comm": "python3", "devices": ["/dev/nvidia0", "/dev/nvidiactl"], "gpus": [0],
           "service": False}
    blocked = _decide(_mismatch_with([job]), MISMATCH_VARS)
    assert blocked.action is Action.REBOOT and not blocked.changes_host
    assert "pid 3121 (python3) holds GPU 0" in (blocked.blocked or "")
    assert _decide(_mismatch_with([job]), MISMATCH_VARS, force=True).changes_host


def test_driver_services_holding_the_devices_do_not_block() -> None:
    service = {"pid": 812, "comm": "nvidia-persistenced", "devices": ["/dev/nvidiactl"], "gpus": [],
               "service": True}
    assert _decide(_mismatch_with([service]), MISMATCH_VARS).changes_host
    assert _decide(_mismatch_with([]), MISMATCH_VARS).changes_host


def test_nvml_down_and_no_process_list_is_refused_without_force() -> None:
    d = _decide(_mismatch_with(None), MISMATCH_VARS)
    assert not d.changes_host and "cannot tell whether GPU jobs run" in (d.blocked or "")
    assert _decide(_mismatch_with(None), MISMATCH_VARS, force=True).changes_host


def test_cordoned_hosts_are_left_alone() -> None:
    d = _decide(_module_missing(), {**VARS, "gpufleet_cordoned": True})
    assert d.action is Action.SKIP and "gpufleet_cordoned" in (d.blocked or "")
    d = _decide(_module_missing(), cordon_marker="maintenance by alice\n")
    assert d.action is Action.SKIP and "alice" in (d.blocked or "")



def test_the_roles_recheck_does_not_take_this_runs_own_remediate_marker_for_a_cordon() -> None:
    """The collection's filter (the role's re-check on the host) applies rollout.cordon's rule: the marker the
    remediate run wrote for this very restore run is no cordon; any other marker still is."""
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("restore_filter", ROOT / "plugins" / "filter" / "restore.py")
    assert spec is not None and spec.loader is not None
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    ours = json.dumps({"owner": "gpufleet-remediate", "run_id": "run-1", "reason": "GPU-DRV-001"}) + "\n"

    def decision(marker: str | None, own_run: str | None) -> dict[str, Any]:
        return plugin.gpufleet_restore_decision(_module_missing(), "gpu-1", VARS, "rebuild", False, marker, "auto",
                                                own_run)

    assert decision(ours, "run-1")["blocked"] is None
    for marker, run in ((ours, "run-2"), (ours, None), ("maintenance by alice\n", "run-1"),
                        (json.dumps({"owner": "nvsentinel", "run_id": "run-1"}), "run-1")):
        assert decision(marker, run)["action"] == Action.SKIP.value, (marker, run)

def test_driver_not_installed_installs_expected_version_or_refuses_without_one() -> None:
    doc = copy.deepcopy(_module_missing())
    doc["nvml"]["error_class"] = "library_not_found"
    doc["packages"]["nvidia"] = {}
    doc["packages"]["driver_package"] = None
    doc["packages"]["driver_package_version"] = None
    d = _decide(doc)
    assert d.action is Action.INSTALL
    assert set(d.install_packages) == {"nvidia-driver-535", "nvidia-utils-535", "libnvidia-compute-535"}
    assert _decide(doc, {}).blocked == "nvidia_driver_expected_version is not set for this host"


def test_not_probed_is_left_alone() -> None:
    d = decide("h", None, (), VARS, not_probed="unreachable: connection refused")
    assert d.action is Action.SKIP and d.blocked == "unreachable: connection refused"


def _mismatch_unreadable(users: list[dict[str, Any]], unreadable: int) -> dict[str, Any]:
    doc = _mismatch_with(users)
    doc["device_users"]["unreadable"] = unreadable
    return doc


def test_nvml_down_and_unreadable_descriptors_is_cannot_tell_and_refused() -> None:
    # The probe ran without root: other users' /proc/<pid>/fd are closed to it, so "no job seen" proves nothing.
    d = _decide(_mismatch_unreadable([], 187), MISMATCH_VARS)
    assert not d.changes_host
    why = d.blocked or ""
    assert "cannot tell whether GPU jobs run" in why and "187" in why
    assert "root" in why and "--force" in why
    assert _decide(_mismatch_unreadable([], 187), MISMATCH_VARS, force=True).changes_host


def test_a_probe_run_without_sudo_is_cannot_tell_and_names_ansible_become() -> None:
    # The real H200 showed it: as an unprivileged user the scan sees no user at all while a job holds 8 GiB.
    doc = _mismatch_unreadable([], 0)
    doc["euid"] = 1000
    d = _decide(doc, MISMATCH_VARS)
    why = d.blocked or ""
    assert not d.changes_host and "uid 1000" in why and "ansible_become: true" in why
    doc["euid"] = 0
    assert "cannot tell" not in (_decide(doc, MISMATCH_VARS).blocked or "")


def test_unreadable_descriptors_do_not_block_while_nvml_answers() -> None:
    # NVML lists the compute processes itself when it answers: the /proc scan is only its stand-in.
    doc = copy.deepcopy(_healthy())
    doc["device_users"] = {"users": [], "unreadable": 187, "truncated": False}
    assert "cannot tell" not in (_decide(doc).blocked or "")


def test_the_persistence_daemon_as_the_probe_reports_it_does_not_block() -> None:
    # What a real host shows: comm cut to 15 characters, the executable's name in full.
    daemon = {"pid": 812, "comm": "nvidia-persiste", "exe": "nvidia-persistenced", "devices": ["/dev/nvidia0",
              "/dev/nvidiactl"], "gpus": [0], "service": True}
    assert _decide(_mismatch_unreadable([daemon], 0), MISMATCH_VARS).changes_host
