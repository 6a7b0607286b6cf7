"""The driver extension's documented limits as planning rules: refused hosts (Secure Boot, releases per driver type,
AMD sizes) with their reason and the apt path; the gate that takes the extension's word for the driver version."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from remediation.azure import restore
from remediation.azure.limits import driver_type, refusal
from remediation.core.checks import Policy, run_checks
from remediation.core.facts import facts_from_dict
from remediation.host.audit import HostAudit
from remediation.restore.methods import AzureExtensionMethod
from remediation.restore.rules import Action
from remediation.rollout.journal import journal_from_dict
from remediation.transport.fanout import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
VM_ID = "/subscriptions/S1/resourceGroups/rg-gpu/providers/Microsoft.Compute/virtualMachines/gpu-vm-2"
VARS = {"azure_vm_resource_id": VM_ID, "azure_nvidia_driver_extension_version": "1.9",
        "azure_vm_size": "Standard_NC24ads_A100_v4", "nvidia_driver_expected_version": "535.183.01"}


def _doc(name: str, *, secure_boot: bool | None = False, release: str = "22.04") -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(json.loads((FIXTURES / name).read_text()))
    if secure_boot is not None:
        doc["secure_boot"] = {"enabled": secure_boot, "source": "efivars"}
    os_release = doc["system"]["os_release"]
    os_release["VERSION_ID"] = release
    os_release["PRETTY_NAME"] = f"Ubuntu {release} LTS"
    return doc


def _audit(doc: dict[str, Any], **vars_: Any) -> HostAudit:
    facts = facts_from_dict(doc, host="gpu-2")
    findings = run_checks(facts, Policy(expected_driver_version="535.183.01"))
    return HostAudit("gpu-2", Status.OK, facts, tuple(findings), None, 0.1, {**VARS, **vars_})


def _plan(doc: dict[str, Any], **vars_: Any) -> Any:
    return restore.plan_host(_audit(doc, **vars_), force=False, cordon_marker=None)


def test_an_s1_host_within_the_limits_is_planned_for_the_extension() -> None:
    d = _plan(_doc("s1_unattended_kernel.json"))
    assert d.action is Action.REBUILD and d.changes_host
    assert d.expected_version is None  # the extension installs the latest supported driver
    assert d.steps[-1] == "gate: NVML answers with the driver version the extension reports"


def test_a_secure_boot_host_is_refused_with_the_reason_and_the_signed_package() -> None:
    doc = _doc("s1_unattended_kernel.json", secure_boot=True)
    d = _plan(doc)
    kernel = doc["system"]["kernel"]
    assert not d.changes_host and d.action is Action.REBUILD
    assert d.blocked is not None and "\n" not in d.blocked
    assert d.blocked.startswith("--method azure-extension refused: Secure Boot is on (efivars)")
    assert "does not support Secure Boot" in d.blocked
    assert "--method apt" in d.blocked and f"linux-modules-nvidia-535-{kernel}" in d.blocked


def test_a_secure_boot_host_is_refused_even_when_its_vm_is_not_mapped() -> None:
    """The host's own line, not a whole-run mapping error: nothing about the VM matters on such a host."""
    d = _plan(_doc("s1_unattended_kernel.json", secure_boot=True), azure_vm_resource_id=None)
    assert d.blocked is not None and "Secure Boot is on" in d.blocked


def test_secure_boot_state_unknown_is_refused() -> None:
    d = _plan(_doc("s1_unattended_kernel.json", secure_boot=None))
    assert d.blocked is not None and "Secure Boot state unknown" in d.blocked and "--method apt" in d.blocked


@pytest.mark.parametrize(
    ("release", "size", "settings", "refused"),
    [
        ("24.04", "Standard_NC24ads_A100_v4", {}, "does not support Ubuntu 24.04 for CUDA drivers"),
        ("24.04", "Standard_NC24ads_A100_v4", {"installGridNC": True}, None),
        ("24.04", "Standard_NV36ads_A10_v5", {}, None),
        ("24.04", None, {}, "supports Ubuntu 24.04 for GRID drivers only and the driver type cannot be told"),
        ("22.04", None, {}, None),
        ("20.04", "Standard_ND96asr_v4", {}, None),
        ("24.10", "Standard_NV36ads_A10_v5", {}, "does not support Ubuntu 24.10 for GRID drivers"),
        ("24.10", None, {}, "does not support Ubuntu 24.10"),
        ("22.04", "Standard_NV32as_v4", {}, "installs NVIDIA drivers only"),
    ],
)
def test_releases_per_driver_type(release: str, size: str | None, settings: dict[str, Any],
                                  refused: str | None) -> None:
    extra: dict[str, Any] = {"azure_vm_size": size}
    if settings:
        extra["azure_nvidia_driver_extension_settings"] = settings
    d = _plan(_doc("s1_unattended_kernel.json", release=release), **extra)
    if refused is None:
        assert d.changes_host, d.blocked
    else:
        assert not d.changes_host and d.blocked is not None and refused in d.blocked, d.blocked
        assert "\n" not in d.blocked


def test_another_distribution_is_refused() -> None:
    doc = _doc("s1_unattended_kernel.json")
    doc["system"]["os_release"].update({"ID": "rhel", "VERSION_ID": "8.2", "PRETTY_NAME": "Red Hat 8.2"})
    facts = facts_from_dict(doc, host="gpu-2")
    why = refusal(facts, VARS)
    assert why is not None and why.startswith("Red Hat 8.2 is not an Ubuntu release")


def test_driver_type_follows_the_vm_family() -> None:
    assert driver_type("Standard_NC24ads_A100_v4", {})[0] == "CUDA"
    assert driver_type("standard_nd96isr_h100_v5", {})[0] == "CUDA"
    assert driver_type("Standard_ND96isr_H100_v5", {"installGridND": "true"})[0] == "GRID"
    assert driver_type("Standard_NV12ads_A10_v5", {})[0] == "GRID"
    assert driver_type("Standard_ND96isr_MI300X_v5", {})[0] == "AMD"
    assert driver_type("Standard_D4s_v5", {})[0] is None
    assert driver_type(None, {}) == (None, "azure_vm_size is not set for this host")


def test_a_healthy_host_is_not_refused_it_needs_nothing() -> None:
    d = _plan(_doc("healthy.json", secure_boot=True))
    assert d.action is Action.NONE and d.blocked is None


# --- the gate ---------------------------------------------------------------------------------------------------

def _journal(reported: str | None) -> Any:
    after = {"typeHandlerVersion": "1.9", "settings": {}, "statusMessages": [], "reportedDriverVersion": reported}
    return journal_from_dict({
        "schema": "gpufleet.restore-journal/1", "run_id": "r1", "host": "gpu-2", "action": "rebuild",
        "started_at": "", "status": "applied",
        "changes": [{"kind": "driver_packages", "before": json.dumps({"nvidia-driver-535": "535.183.01-0ubuntu1"})},
                    {"kind": "azure_extension", "path": VM_ID + "/extensions/NvidiaGpuDriverLinux",
                     "before": None, "after": json.dumps(after)}],
    })


def _healthy_after(version: str) -> HostAudit:
    doc = _doc("healthy.json")
    doc["nvml"]["driver_version"] = version
    return _audit(doc)


def test_the_gate_accepts_the_extensions_driver_without_a_pinned_version() -> None:
    plan = _plan(_doc("s1_unattended_kernel.json"))
    gate = AzureExtensionMethod().verify(plan, _healthy_after("535.216.01"), _journal("535.216.01"))
    assert gate.ok and "535.216.01, the version the extension reported" in gate.detail
    # Even when the inventory pins another version (the extension installs the latest unless told otherwise).
    pinned = AzureExtensionMethod().verify(plan.__class__(**{**plan.__dict__, "expected_version": "535.183.01"}),
                                           _healthy_after("535.216.01"), _journal("535.216.01"))
    assert pinned.ok


def test_the_gate_refuses_a_driver_other_than_the_one_reported() -> None:
    plan = _plan(_doc("s1_unattended_kernel.json"))
    gate = AzureExtensionMethod().verify(plan, _healthy_after("535.183.01"), _journal("535.216.01"))
    assert not gate.ok and gate.detail == "driver 535.183.01 != 535.216.01, the version the extension reported"
    short = AzureExtensionMethod().verify(plan, _healthy_after("535.161.08"), _journal("535.161"))
    assert short.ok  # the extension named the version without its last field


def test_the_gate_without_a_reported_version_says_so_and_still_needs_nvml() -> None:
    plan = _plan(_doc("s1_unattended_kernel.json"))
    gate = AzureExtensionMethod().verify(plan, _healthy_after("535.216.01"), _journal(None))
    assert gate.ok and "named no driver version" in gate.detail
    down = AzureExtensionMethod().verify(plan, _audit(_doc("s1_unattended_kernel.json")), _journal("535.216.01"))
    assert not down.ok and down.detail.startswith("NVML")


def test_the_journal_describes_the_recorded_packages() -> None:
    changes = [c.describe() for c in _journal("535.216.01").changes]
    assert changes[0] == ("recorded the NVIDIA packages before the extension ran (nvidia-driver-535"
                          " 535.183.01-0ubuntu1)")
    assert "(driver 535.216.01 reported)" in changes[1]


def test_package_lines_from_the_host_are_parsed_strictly() -> None:
    text = ("nvidia-driver-535\t535.183.01-0ubuntu0.22.04.1\tii \n"
            "nvidia-dkms-535\t535.183.01-0ubuntu0.22.04.1\trc \n"  # removed, config left: not installed
            "nvidia-utils-535;rm -rf /\t1\tii \n"  # not a package name: dropped, never reaches apt
            "libnvidia-compute-535\t$(reboot)\tii \n"
            "garbage\n")
    assert restore.parse_packages(text) == {"nvidia-driver-535": "535.183.01-0ubuntu0.22.04.1"}


def test_a_journal_record_from_the_host_never_passes_an_option_to_apt() -> None:
    assert restore._recorded({"nvidia-driver-535": "535.183.01-0ubuntu1", "-oDPkg::Pre-Invoke::": "touch /x",
                              "nvidia-utils-535": "$(id)"}) == {"nvidia-driver-535": "535.183.01-0ubuntu1"}
    with pytest.raises(ValueError, match="not a mapping"):
        restore._recorded(["nvidia-driver-535"])
