"""AKS node pools and the NVIDIA driver VM extension through the product's client, against the local ARM service."""

from __future__ import annotations

from typing import Any

import pytest

from lab.services.arm import AgentResult, ArmService, Cluster, Extension, VirtualMachine
from remediation.azure.aks import pools_report
from remediation.azure.errors import ArmError, AzureInputError
from remediation.azure.extension import (
    ExtensionConfig,
    VmRef,
    extension_config,
    extension_state,
    reinstall,
    vm_ref,
)
from tests.arm.armtest import SUB, make_client

GPU_POOL = {"name": "gpunp", "vmSize": "Standard_NC24ads_A100_v4", "count": 3, "minCount": 1, "maxCount": 3,
            "enableAutoScaling": True, "nodeTaints": ["sku=gpu:NoSchedule"]}



def test_pool_at_max_count_and_quota_headroom(arm: ArmService) -> None:
    arm.add_cluster(SUB, "myRG", "myAKS", Cluster("eastus", [
        GPU_POOL,
        {"name": "gpu2", "vmSize": "Standard_NC24ads_A100_v4", "count": 0, "minCount": 0, "maxCount": 2,
         "enableAutoScaling": True},
        {"name": "system", "vmSize": "Standard_D4s_v5", "count": 3, "minCount": 3, "maxCount": 5,
         "enableAutoScaling": True, "mode": "System"},
    ]))
    report = pools_report(make_client(arm), "myAKS", "myRG")
    pools = {p.name: p for p in report.pools}
    assert pools["gpunp"].at_max and not pools["gpu2"].at_max and not pools["system"].is_gpu
    ids = {(f.id, f.summary) for f in report.findings}
    assert any(i == "AZ-AKS-001" and "myAKS/gpunp" in s for i, s in ids)
    assert any(i == "AZ-AKS-003" and "myAKS/gpunp" in s for i, s in ids)  # tainted: pods need the toleration
    assert any(i == "AZ-AKS-002" and "myAKS/gpu2" in s for i, s in ids)  # GPU pool without the taint
    # gpu2 may grow by 2 x 24 vCPUs = 48; the A100 family has 96 - 72 = 24 left: short by 24.
    head = {h.usage.name: h for h in report.headroom}
    assert head["standardNCADSA100v4Family"].needed == 48 and not head["standardNCADSA100v4Family"].fits
    assert head["cores"].fits
    quota = [f for f in report.findings if f.id == "AZ-QUOTA-003"]
    assert len(quota) == 1 and "--vcpus 120" in quota[0].evidence[1] and "--location eastus" in quota[0].evidence[1]
    assert report.exit_code == 1


def test_pools_with_headroom_and_taints_are_clean(arm: ArmService) -> None:
    arm.add_cluster(SUB, "myRG", "ok", Cluster("eastus", [{**GPU_POOL, "count": 1, "maxCount": 2}]))  # +24 of 24 left
    report = pools_report(make_client(arm), "ok", "myRG")
    assert [f.id for f in report.findings] == ["AZ-AKS-003"] and report.exit_code == 0


def test_missing_cluster_is_arms_error(arm: ArmService) -> None:
    with pytest.raises(ArmError, match="404 ResourceNotFound") as info:
        pools_report(make_client(arm), "nope", "myRG")
    assert info.value.exit_code == 3


def _vm(arm: ArmService, with_extension: bool = True) -> VirtualMachine:
    vm = VirtualMachine("eastus")
    if with_extension:
        vm.extensions["nvidia"] = Extension("nvidia", "Microsoft.HpcCompute", "NvidiaGpuDriverLinux", "1.6",
                                            {"installCUDA": True}, True)
    arm.add_vm(SUB, "rg-gpu", "gpu-vm-2", vm)
    return vm


def test_extension_is_removed_and_re_added_with_the_configured_version(arm: ArmService) -> None:
    vm = _vm(arm)
    seen: list[Any] = []
    config = ExtensionConfig("1.9", {"updateOS": False}, True)
    result = reinstall(make_client(arm), VmRef(None, "rg-gpu", "gpu-vm-2"), config,
                       journal=lambda ext_id, before, after: seen.append((ext_id, before, after)))
    assert result.ok, result.error
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in arm.arm_requests() if r.method != "GET"] == [
        ("DELETE", "nvidia"), ("PUT", "nvidia")]
    put = next(r for r in arm.arm_requests() if r.method == "PUT")
    assert put.body["properties"] == {"publisher": "Microsoft.HpcCompute", "type": "NvidiaGpuDriverLinux",
                                      "typeHandlerVersion": "1.9", "autoUpgradeMinorVersion": True,
                                      "settings": {"updateOS": False}}
    assert seen and seen[0][1]["typeHandlerVersion"] == "1.6" and seen[0][2]["typeHandlerVersion"] == "1.9"
    # The journal hook ran before the DELETE.
    assert vm.extensions["nvidia"].version == "1.9" and vm.extensions["nvidia"].state == "Succeeded"
    assert any("Enable succeeded" in m for m in result.messages)
    assert any(r.path.endswith("/operations/" + r.path.rsplit("/", 1)[-1]) for r in arm.arm_requests()
               if "/operations/" in r.path)


def test_a_vm_without_the_extension_gets_it_added(arm: ArmService) -> None:
    _vm(arm, with_extension=False)
    result = reinstall(make_client(arm), VmRef(SUB, "rg-gpu", "gpu-vm-2"), ExtensionConfig("1.9"))
    assert result.ok and result.before is None
    assert [r.method for r in arm.arm_requests() if r.method != "GET"] == ["PUT"]


def test_failed_provisioning_reports_the_extensions_messages(arm: ArmService) -> None:
    _vm(arm)
    arm.agent = lambda vm, ext: AgentResult(False, ("Enable failed: nvidia-smi did not run after the install",))
    try:
        result = reinstall(make_client(arm), VmRef(None, "rg-gpu", "gpu-vm-2"), ExtensionConfig("1.9"))
    finally:
        arm.agent = None
    assert not result.ok
    assert "provisioning Failed" in (result.error or "") and "nvidia-smi did not run" in (result.error or "")


def test_journal_failure_changes_nothing(arm: ArmService) -> None:
    _vm(arm)

    def refuse(*_: Any) -> None:
        raise AzureInputError("could not write the restore journal on the host")

    with pytest.raises(AzureInputError):
        reinstall(make_client(arm), VmRef(None, "rg-gpu", "gpu-vm-2"), ExtensionConfig("1.9"), journal=refuse)
    assert [r.method for r in arm.arm_requests()] == ["GET", "GET"]


def test_extension_state_reads_the_instance_view_and_a_missing_one_is_none(arm: ArmService) -> None:
    _vm(arm)
    client = make_client(arm)
    result = reinstall(client, VmRef(None, "rg-gpu", "gpu-vm-2"), ExtensionConfig("1.9"))
    state = extension_state(client, result.extension_id)
    assert state is not None and (state.type_handler_version, state.provisioning_state) == ("1.9", "Succeeded")
    assert any("Enable succeeded" in m for m in state.messages)
    assert extension_state(client, result.extension_id.rsplit("/", 1)[0] + "/other") is None


def test_missing_vm_is_arms_error(arm: ArmService) -> None:
    with pytest.raises(ArmError, match="404 ResourceNotFound"):
        reinstall(make_client(arm), VmRef(None, "rg-gpu", "nope"), ExtensionConfig("1.9"))


@pytest.mark.parametrize(
    ("hostvars", "error"),
    [
        ({}, "is not mapped to an Azure VM: set azure_vm_resource_id, or azure_resource_group and azure_vm_name"),
        ({"azure_resource_group": "rg"}, "is not mapped to an Azure VM"),
        ({"azure_vm_resource_id": "/subscriptions/x/vm"}, "is not a VM resource ID"),
        ({"azure_resource_group": "rg", "azure_vm_name": "a b"}, "is not an Azure resource name"),
    ],
)
def test_vm_mapping_errors_name_the_inventory_variable(hostvars: dict[str, str], error: str) -> None:
    with pytest.raises(AzureInputError, match=error):
        vm_ref("gpu-2", hostvars)


def test_vm_mapping_forms() -> None:
    rid = "/subscriptions/S1/resourceGroups/rg-a/providers/Microsoft.Compute/virtualMachines/vm-1"
    assert vm_ref("h", {"azure_vm_resource_id": rid}) == VmRef("S1", "rg-a", "vm-1")
    assert vm_ref("h", {"azure_resource_group": "rg", "azure_vm_name": "v"}) == VmRef(None, "rg", "v")
    with pytest.raises(AzureInputError, match="never guessed"):
        extension_config("h", {})
    with pytest.raises(AzureInputError, match=r"not a version like 1\.9"):
        extension_config("h", {"azure_nvidia_driver_extension_version": 1.10})  # YAML 1.10 unquoted is 1.1
    assert extension_config("h", {"azure_nvidia_driver_extension_version": "1.10"}).type_handler_version == "1.10"
