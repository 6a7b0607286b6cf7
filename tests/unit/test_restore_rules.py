"""The restore's planning rules, from real facts documents (fixtures) shaped per case."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from remediation.checks import Policy, run_checks
from remediation.facts import facts_from_dict
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
    pytest.skip("no fixture for this case")


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
    # A mismatch host still answers per-GPU queries in the field; processes there block unless --force.
    doc2 = copy.deepcopy(_healthy())
    doc2["nvml"]["ok"] = False
    doc2["nvml"]["error_class"] = "version_mismatch"
    doc2["nvml"]["gpus"][0]["processes"] = [{"pid": 4242, "used_memory": 1, "name": "python3"}]
    blocked = _decide(doc2)
    assert blocked.action is Action.REBOOT and blocked.blocked and "pid 4242" in blocked.blocked
    assert not blocked.changes_host
    assert _decide(doc2, force=True).changes_host


def test_cordoned_hosts_are_left_alone() -> None:
    d = _decide(_module_missing(), {**VARS, "gpufleet_cordoned": True})
    assert d.action is Action.SKIP and "gpufleet_cordoned" in (d.blocked or "")
    d = _decide(_module_missing(), cordon_marker="maintenance by alice\n")
    assert d.action is Action.SKIP and "alice" in (d.blocked or "")


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
