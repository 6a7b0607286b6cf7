"""The inventory variables the flows read (beyond the roles' own, which ``roles/*/meta/argument_specs.yml`` document).

``inventories/example/group_vars/gpu.yml`` sets or shows every one of these; ``tests/unit/test_example_inventory.py``
checks that each variable in it is either a role variable or one named here.
"""

from __future__ import annotations

__all__ = ["FLOW_VARIABLES"]

#: name -> what reads it and what it means.
FLOW_VARIABLES: dict[str, str] = {
    "nvidia_driver_expected_version": "the fleet's NVIDIA driver (upstream version): the audit's GPU-DRV-005, the "
    "apt restore's gate, installs (the extension method's gate takes the version the extension reports)",
    "nvidia_driver_branch": "the driver branch, whole (535, 535-server, 535-open), for installs (GPU-DRV-003)",
    "gpu_expected_count": "GPUs per host (the audit's GPU-HW-003); default from the VM size",
    "azure_vm_size": "the VM size (Standard_NC24ads_A100_v4): GPU count and model from remediation/core/skus.py; the "
    "driver extension's driver type (NC/ND: CUDA, NV: GRID) and so its supported releases",
    "driver_restore_method": "apt | azure-extension: how `invoke driver-restore --method auto` restores the host",
    "gpufleet_cordoned": "true: every changing flow leaves the host alone (also the marker /etc/gpufleet/cordoned)",
    "azure_vm_resource_id": "the host's Azure VM (ARM id), for the driver extension",
    "azure_subscription_id": "with azure_resource_group + azure_vm_name instead of azure_vm_resource_id",
    "azure_resource_group": "the VM's resource group",
    "azure_vm_name": "the VM's name",
    "azure_nvidia_driver_extension_version": "NvidiaGpuDriverLinux typeHandlerVersion (never guessed)",
    "azure_nvidia_driver_extension_settings": "the extension's public settings",
    "azure_nvidia_driver_extension_auto_upgrade_minor": "autoUpgradeMinorVersion of the re-added extension",
    "harden_batch": "playbooks/harden.yml: hosts per batch (serial), default 25%",
    "harden_max_fail_percentage": "playbooks/harden.yml: failed hosts per batch that stop the play, default 10",
    "driver_restore_batch": "playbooks/driver_restore.yml: hosts per batch, default 1",
    "kernel_update_batch": "playbooks/kernel_update.yml: hosts per batch, default 1",
    "kernel_update_max_fail_percentage": "playbooks/kernel_update.yml: failed hosts per batch that stop the play, "
    "default 0",
}
