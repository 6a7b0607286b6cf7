"""Checks on JSON facts fixtures (real probe output from sample host trees and the lab's libnvidia-ml), the
"NVML failed => never healthy" property, unattended-upgrades blacklist semantics and dpkg version ordering."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remediation.core.checks import Policy, run_checks, run_fleet_checks
from remediation.core.checks.blacklist import blacklist_match, invalid_entries, next_kernel_packages
from remediation.core.checks.debversion import compare_versions, version_key
from remediation.core.facts import HostFacts, facts_from_dict
from remediation.core.findings import Finding, Severity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
POLICY = Policy(expected_gpu_count=4)


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def facts(name: str) -> HostFacts:
    return facts_from_dict(load(name))


def findings(name: str, policy: Policy = POLICY) -> tuple[Finding, ...]:
    return run_checks(facts(name), policy)


def ids(found: tuple[Finding, ...]) -> list[str]:
    return [f.id for f in found]


def one(found: tuple[Finding, ...], finding_id: str) -> Finding:
    matching = [f for f in found if f.id == finding_id]
    assert len(matching) == 1, ids(found)
    return matching[0]


def evidence(f: Finding) -> str:
    return "\n".join(f.evidence)


def test_healthy_host_has_no_findings() -> None:
    assert findings("healthy") == ()


def test_s1_unattended_kernel_upgrade() -> None:
    found = findings("s1_unattended_kernel")
    assert ids(found) == ["GPU-DRV-001", "GPU-KRN-002", "GPU-KRN-003", "GPU-KRN-004", "GPU-KRN-006"]
    drv = one(found, "GPU-DRV-001")
    assert drv.severity is Severity.CRITICAL and drv.host == "gpu-s1-01"
    assert "6.5.0-45-generic" in drv.summary and "6.5.0-44-generic" in drv.summary
    text = evidence(drv)
    assert "booted kernel 6.5.0-45-generic; /lib/modules/6.5.0-45-generic has no nvidia.ko" in text
    assert "nvidia module present for: 6.5.0-44-generic" in text
    assert (
        "history.log 2026-12-02 03:14:07: unattended-upgrade installed linux-image-6.5.0-45-generic (6.5.0-45.45)"
        in text
    )
    krn3 = evidence(one(found, "GPU-KRN-003"))
    assert "linux-image-6.5.0-46-generic" in krn3 and "Package-Blacklist (apt-config dump): empty" in krn3
    assert drv.remedy == "invoke driver-restore --limit gpu-s1-01"


def test_s1_driver_installed_by_a_person_is_named() -> None:
    doc = load("s1_unattended_kernel")
    doc["apt_history"]["text"] = doc["apt_history"]["text"].replace(
        "Commandline: /usr/bin/unattended-upgrade", "Commandline: apt-get dist-upgrade\nRequested-By: alice (1001)"
    )
    drv = one(run_checks(facts_from_dict(doc), POLICY), "GPU-DRV-001")
    assert "alice (1001) via apt-get installed linux-image-6.5.0-45-generic" in evidence(drv)


def test_driver_not_installed_is_drv003() -> None:
    doc = load("s1_unattended_kernel")
    doc["packages"]["nvidia"] = {}
    found = run_checks(facts_from_dict(doc), POLICY)
    assert ids(found)[0] == "GPU-DRV-003"


def test_version_mismatch() -> None:
    found = findings("version_mismatch")
    assert ids(found)[0] == "GPU-DRV-002"
    text = evidence(one(found, "GPU-DRV-002"))
    assert "userspace driver 535.216.01 (nvidia-driver-535) vs loaded kernel module 535.183.01" in text
    assert "unattended-upgrade upgraded nvidia-driver-535" in text
    assert "GPU-DRV-007" not in ids(found)  # the API mismatch lines are folded into DRV-002


def test_thermal() -> None:
    found = findings("thermal")
    assert ids(found) == ["GPU-THM-001", "GPU-THM-003"]
    assert "86 °C" in evidence(one(found, "GPU-THM-001"))
    assert "hw_thermal_slowdown" in evidence(one(found, "GPU-THM-003"))


def test_temperature_at_slowdown_is_thm002_only() -> None:
    doc = load("thermal")
    doc["nvml"]["gpus"][1]["temperature_c"] = 89
    found = run_checks(facts_from_dict(doc), POLICY)
    assert "GPU-THM-002" in ids(found) and "GPU-THM-001" not in ids(found)
    assert one(found, "GPU-THM-002").severity is Severity.CRITICAL


@pytest.mark.parametrize(("util", "expected"), [(5, None), (95, Severity.INFO)])
def test_sw_power_cap_alone(util: int, expected: Severity | None) -> None:
    doc = load("healthy")
    gpu = doc["nvml"]["gpus"][0]
    gpu["clocks_event_reasons"] = {"mask": 4, "active": ["sw_power_cap"]}
    gpu["utilization"]["gpu"] = util
    found = run_checks(facts_from_dict(doc), POLICY)
    if expected is None:
        assert found == ()
    else:
        assert one(found, "GPU-THM-003").severity is expected


def test_ecc_pending_remap() -> None:
    found = findings("ecc_pending_remap")
    assert ids(found) == ["GPU-HW-003", "GPU-HW-004", "GPU-HW-005"]
    assert "row remap pending" in evidence(one(found, "GPU-HW-004"))
    assert one(found, "GPU-HW-005").summary.startswith("Xid 63")


@pytest.mark.parametrize(
    ("pages", "expected"),
    [
        ({"single_bit": 40, "double_bit": 22, "pending": False}, ["double-bit retired pages 22 > 15"]),
        ({"single_bit": 50, "double_bit": 13, "pending": False}, ["retired pages 63 >= 63"]),
        ({"single_bit": 40, "double_bit": 15, "pending": False}, []),
    ],
)
def test_dcgm_retired_page_limits(pages: dict[str, Any], expected: list[str]) -> None:
    doc = load("healthy")
    doc["nvml"]["gpus"][0]["retired_pages"] = pages
    found = run_checks(facts_from_dict(doc), POLICY)
    if not expected:
        assert found == ()
    else:
        assert all(e in evidence(one(found, "GPU-HW-004")) for e in expected)


def test_xid79_lost_gpu_is_not_a_driver_problem() -> None:
    found = findings("xid79_lost")
    assert ids(found) == ["GPU-HW-001"]
    hw = found[0]
    assert hw.severity is Severity.CRITICAL
    assert "not a driver problem" in hw.summary
    assert "Xid (PCI:0004:00:00): 79" in evidence(hw)


def test_memory_full_names_the_processes() -> None:
    found = findings("memory_full")
    mem = one(found, "GPU-MEM-001")
    assert "pid 31337 (python3): 78848 MiB" in mem.evidence
    assert "pid 31338 (nvtop): 1024 MiB" in mem.evidence


def test_predictive_newer_kernel_without_module() -> None:
    found = findings("predictive_newer_kernel")
    krn1 = one(found, "GPU-KRN-001")
    assert krn1.severity is Severity.CRITICAL  # a reboot is pending
    text = evidence(krn1)
    assert "installed kernel 6.5.0-46-generic" in text and "newer than booted 6.5.0-45-generic" in text
    assert "reboot required" in text
    assert "6.5.0-47" not in "\n".join(evidence(f) for f in found)  # the --dry-run stanza is no evidence
    # blacklist "linux-image-[0-9]" leaves the headers and the image meta-package open
    krn3 = evidence(one(found, "GPU-KRN-003"))
    assert "linux-image-generic" in krn3 and "linux-headers-6.5.0-46-generic" in krn3
    assert "linux-image-6.5.0-45-generic," not in krn3


def test_predictive_without_pending_reboot_is_a_warning() -> None:
    doc = load("predictive_newer_kernel")
    doc["system"]["reboot_required"] = False
    krn1 = one(run_checks(facts_from_dict(doc), POLICY), "GPU-KRN-001")
    assert krn1.severity is Severity.WARNING and "no reboot pending" in krn1.evidence


def test_gpu_count_below_expected_and_host_override() -> None:
    doc = load("healthy")
    f = facts_from_dict(doc)
    assert "GPU-HW-002" in ids(run_checks(f, Policy(expected_gpu_count=8)))
    assert run_checks(f, Policy(expected_gpu_count=8, host_gpu_count={"gpu-healthy-01": 4})) == ()


def test_persistence_off_and_dpkg_lock() -> None:
    doc = load("healthy")
    doc["nvml"]["gpus"][2]["persistence_mode"] = False
    doc["dpkg_lock"].update({"held": True, "holder_pid": 4711, "holder_comm": "unattended-upgr"})
    found = run_checks(facts_from_dict(doc), POLICY)
    assert ids(found) == ["GPU-APT-001", "GPU-CFG-001"]
    assert "pid 4711 (unattended-upgr)" in one(found, "GPU-APT-001").summary


def test_fleet_drift_against_majority_and_policy() -> None:
    fleet = {name: facts(name) for name in ("healthy", "thermal", "memory_full", "version_mismatch")}
    result = run_fleet_checks(fleet, Policy())
    assert set(result) == set(fleet)
    drift = one(result["version_mismatch"], "GPU-DRV-005")
    assert (
        "driver 535.216.01 (package nvidia-driver-535); expected 535.183.01 (fleet majority (3 of 4 hosts))"
        in drift.evidence
    )
    assert not any(f.id == "GPU-DRV-005" for f in result["healthy"])
    pinned = run_fleet_checks(fleet, Policy(expected_driver_version="550.54.15"))
    assert all(any(f.id == "GPU-DRV-005" for f in found) for found in pinned.values())


def test_fleet_tie_has_no_majority() -> None:
    fleet = {name: facts(name) for name in ("healthy", "version_mismatch")}
    assert not any(f.id == "GPU-DRV-005" for fs in run_fleet_checks(fleet, Policy()).values() for f in fs)


# --- NVML failed => never healthy --------------------------------------------------------------------------

ERROR_CLASSES = [
    "driver_not_loaded",
    "version_mismatch",
    "no_devices",
    "library_not_found",
    "gpu_lost",
    "handle_unknown_error",
    "timeout",
    "other",
    "something-new",
]


@st.composite
def failed_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = load(draw(st.sampled_from(["healthy", "s1_unattended_kernel", "predictive_newer_kernel", "memory_full"])))
    nvml = doc["nvml"]
    nvml["ok"] = draw(st.booleans()) and False
    nvml["error_class"] = draw(st.sampled_from(ERROR_CLASSES))
    nvml["error"] = draw(st.one_of(st.none(), st.text(max_size=40)))
    nvml["error_code"] = draw(st.one_of(st.none(), st.integers(0, 999)))
    nvml["gpus"] = draw(st.sampled_from([[], nvml["gpus"][:1], [{"index": 0, "ok": False, "error_class": "gpu_lost"}]]))
    if draw(st.booleans()):
        doc["packages"] = None
    if draw(st.booleans()):
        doc["packages"] = doc["packages"] and {**doc["packages"], "nvidia": {}}
    if draw(st.booleans()):
        doc["kernel_log"]["lines"] = draw(
            st.lists(
                st.sampled_from(["NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus", "junk", ""]), max_size=3
            )
        )
    doc["system"]["kernel"] = draw(st.sampled_from(["6.5.0-45-generic", "6.5.0-44-generic", "7.0.0-1-custom", None]))
    return doc


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(failed_documents())
def test_failed_nvml_always_has_a_critical_finding(doc: dict[str, Any]) -> None:
    f = facts_from_dict(doc)
    assert f.nvml.failed
    found = run_checks(f, Policy())
    assert any(x.severity is Severity.CRITICAL for x in found), [(x.id, x.severity) for x in found]
    assert all(x.host == f.host for x in found)


# --- unattended-upgrades blacklist semantics -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "blacklist", "match"),
    [
        ("linux-image-6.5.0-46-generic", ["linux-image"], "linux-image"),
        ("linux-image-generic", ["linux-image-[0-9]"], None),
        ("linux-image-6.5.0-46-generic", ["linux-image-[0-9]"], "linux-image-[0-9]"),
        ("linux-image-generic", ["^linux-"], "^linux-"),
        ("linux-image-generic", ["linux-image$"], None),
        ("xlinux-image", ["linux-image"], None),  # re.match: anchored at the start
        ("linux-image-generic", ["linux-image*"], "linux-image*"),  # a regex, not a glob, but still a prefix
        ("libnvidia-compute-535", ["*nvidia*", "nvidia-"], None),  # invalid regex ignored; "nvidia-" is a prefix
        ("libnvidia-compute-535", [".*nvidia"], ".*nvidia"),
    ],
)
def test_blacklist_match(package: str, blacklist: list[str], match: str | None) -> None:
    assert blacklist_match(package, blacklist) == match


def test_invalid_blacklist_entries() -> None:
    assert invalid_entries(["*nvidia*", "linux-image", "(unclosed"]) == ("*nvidia*", "(unclosed")


def test_next_kernel_packages() -> None:
    names = next_kernel_packages("6.5.0-45-generic")
    assert "linux-image-6.5.0-46-generic" in names and "linux-headers-6.5.0-46" in names
    assert next_kernel_packages("6.8.0-1015-azure")[0] == "linux-image-6.8.0-1016-azure"
    assert next_kernel_packages("custom") == ()


def test_blacklist_in_effective_config_protects_everything() -> None:
    doc = load("s1_unattended_kernel")
    doc["unattended_upgrades"]["package_blacklist"] = [
        "linux-image",
        "linux-headers",
        "linux-modules",
        "nvidia-",
        "libnvidia-",
    ]
    found = ids(run_checks(facts_from_dict(doc), POLICY))
    assert "GPU-KRN-003" not in found and "GPU-KRN-004" not in found


# --- dpkg version ordering -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("6.5.0-45.45", "6.5.0-44.44", 1),
        ("1:1.0", "2.0", 1),
        ("1.0~rc1", "1.0", -1),
        ("1.0", "1.0-0", 0),
        ("2.30", "2.4", 1),
        ("1.0a", "1.0", 1),
        ("1.0+b1", "1.0", 1),
        ("1.0~~", "1.0~", -1),
        ("535.183.01-0ubuntu0.22.04.1", "535.183.01-0ubuntu1", -1),
        ("6.5.0.45.45", "6.5.0.44.44", 1),
        ("6.5.0-100-generic", "6.5.0-45-generic", 1),
        ("0:1.2", "1.2", 0),
        ("1.2-3", "1.2-10", -1),
    ],
)
def test_compare_versions(a: str, b: str, expected: int) -> None:
    assert compare_versions(a, b) == expected
    assert compare_versions(b, a) == -expected


def test_version_key_sorts() -> None:
    assert sorted(["1.0", "1.0~rc1", "1:0.9", "0.9"], key=version_key) == ["0.9", "1.0~rc1", "1.0", "1:0.9"]


_VERSIONS = st.builds(
    lambda epoch, up, rev: f"{epoch}{up}{rev}",
    st.sampled_from(["", "1:", "2:"]),
    st.from_regex(r"\A[0-9][0-9a-z.+~]{0,6}\Z"),
    st.sampled_from(["", "-1", "-0ubuntu1", "-1~deb12u1", "-2"]),
)


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg not installed")
@settings(max_examples=60, deadline=None)
@given(_VERSIONS, _VERSIONS)
def test_compare_versions_agrees_with_dpkg(a: str, b: str) -> None:
    def dpkg(op: str) -> bool:
        return (
            subprocess.run(["dpkg", "--compare-versions", a, op, b], capture_output=True, check=False).returncode == 0
        )

    expected = -1 if dpkg("lt") else (1 if dpkg("gt") else 0)
    assert compare_versions(a, b) == expected


def test_findings_are_frozen_values() -> None:
    f = findings("thermal")[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.id = "x"  # type: ignore[misc]
