"""The local ARM service plays the NVIDIA GPU driver extension's documented limits (Microsoft Learn,
hpccompute-gpu-linux): Secure Boot is not supported (the install never ends: ARM times it out), each driver type
has its Ubuntu releases (exit code 12 elsewhere), the instance view names the driver the extension installed; and
the product reads that version back."""

from __future__ import annotations

import pytest

from lab.services.arm import AgentResult, ArmService, Extension, VirtualMachine
from remediation.azure.extension import ExtensionConfig, VmRef, reinstall
from remediation.azure.limits import reported_driver_version
from tests.arm.armtest import SUB, make_client

VM_REF = VmRef(None, "rg-gpu", "gpu-vm-7")


def _vm(arm: ArmService, **kw: object) -> VirtualMachine:
    vm = VirtualMachine("eastus", **kw)  # type: ignore[arg-type]
    vm.extensions["nvidiagpudriverlinux"] = Extension("NvidiaGpuDriverLinux", "Microsoft.HpcCompute",
                                                      "NvidiaGpuDriverLinux", "1.6", {}, True)
    arm.add_vm(SUB, "rg-gpu", "gpu-vm-7", vm)
    return vm


def test_a_trusted_launch_vm_times_out_as_arm_reports_it(arm: ArmService) -> None:
    vm = _vm(arm, secure_boot=True)
    client = make_client(arm)
    machine = client.get(VM_REF.path(SUB), "2024-11-01")
    assert machine["properties"]["securityProfile"] == {
        "securityType": "TrustedLaunch", "uefiSettings": {"secureBootEnabled": True, "vTpmEnabled": True}}
    result = reinstall(client, VM_REF, ExtensionConfig("1.9"))
    assert not result.ok
    assert "VMExtensionProvisioningTimeout" in (result.error or "")
    assert "has timed out" in (result.error or "")
    assert vm.extensions["nvidiagpudriverlinux"].state == "Failed"
    assert result.after is not None and any("Transitioning" in m for m in result.after.messages)


@pytest.mark.parametrize(
    ("size", "release", "settings", "ok"),
    [
        ("Standard_NC24ads_A100_v4", "24.04", {}, False),  # no source lists CUDA on 24.04
        ("Standard_NC24ads_A100_v4", "22.04", {}, True),
        ("Standard_NC24ads_A100_v4", "24.04", {"installGridNC": True}, True),  # GRID on an NC size
        ("Standard_NV36ads_A10_v5", "24.04", {}, True),  # GRID: 22.04 and 24.04 LTS
        ("Standard_NV36ads_A10_v5", "23.10", {}, False),
    ],
)
def test_each_driver_type_has_its_releases(arm: ArmService, size: str, release: str, settings: dict[str, object],
                                           ok: bool) -> None:
    _vm(arm, size=size, os_version=release)
    result = reinstall(make_client(arm), VM_REF, ExtensionConfig("1.9", settings))
    assert result.ok is ok, result.error
    if not ok:
        assert "exit code 12: Image offer not supported" in (result.error or "")
        assert f"ubuntu {release}" in (result.error or "")


def test_an_amd_size_is_not_the_extensions(arm: ArmService) -> None:
    _vm(arm, size="Standard_NV32as_v4")
    result = reinstall(make_client(arm), VM_REF, ExtensionConfig("1.9"))
    assert not result.ok and "exit code 13: VM size not supported" in (result.error or "")


def test_the_instance_view_names_the_installed_driver(arm: ArmService) -> None:
    _vm(arm)
    arm.agent = lambda vm, ext: AgentResult(True, (
        "Enable succeeded: NVIDIA driver 535.216.01 installed for kernel 6.5.0-1025-azure (nvidia-driver-535"
        " 535.216.01-0ubuntu0.22.04.1)", "The VM was restarted to load the driver"))
    try:
        result = reinstall(make_client(arm), VM_REF, ExtensionConfig("1.9"))
    finally:
        arm.agent = None
    assert result.ok and reported_driver_version(result.messages) == "535.216.01"


@pytest.mark.parametrize(
    ("messages", "version"),
    [
        (["[Info] Provisioning succeeded Enable succeeded: NVIDIA driver 535.216.01 installed"], "535.216.01"),
        (["installed CUDA 12.2 with driver 535.54.03 (typeHandlerVersion 1.9)"], "535.54.03"),
        (["driver ok for kernel 6.5.0-1025.26~22.04.1", "typeHandlerVersion 1.9"], None),
        (["settings driverVersion 12.2"], None),
        (["Enable failed with exit code 12: Image offer not supported"], None),
        (["driver 535.183.01 removed", "NVIDIA driver 550.127.05 installed"], "550.127.05"),  # the last one wins
    ],
)
def test_reported_driver_version(messages: list[str], version: str | None) -> None:
    assert reported_driver_version(messages) == version
