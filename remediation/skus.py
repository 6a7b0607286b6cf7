"""Azure GPU VM sizes: how many GPUs of which model each one has.

Used by the audit (a host with fewer GPUs than its size is broken) and by the lab (to shape its hosts).
Figures from Azure's published size tables (NC A100 v4, ND A100 v4, ND H100 v5, NC H100 v5, NCasT4 v3).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str  # as NVML reports it
    memory_mib: int
    pci_device_id: int  # NVML pciDeviceId: device << 16 | vendor
    power_limit_w: int
    max_graphics_mhz: int
    max_memory_mhz: int
    temp_shutdown_c: int
    temp_slowdown_c: int
    temp_gpu_max_c: int


@dataclass(frozen=True)
class VmSize:
    name: str
    gpu_count: int
    gpu: GpuModel


A100_80GB_PCIE = GpuModel("NVIDIA A100 80GB PCIe", 81920, 0x20B510DE, 300, 1410, 1512, 92, 89, 85)
A100_40GB_SXM4 = GpuModel("NVIDIA A100-SXM4-40GB", 40960, 0x20B010DE, 400, 1410, 1215, 92, 89, 85)
H100_80GB_HBM3 = GpuModel("NVIDIA H100 80GB HBM3", 81559, 0x233010DE, 700, 1980, 2619, 92, 89, 87)
H100_NVL = GpuModel("NVIDIA H100 NVL", 95830, 0x232110DE, 400, 1785, 2619, 92, 89, 87)
T4 = GpuModel("Tesla T4", 15360, 0x1EB810DE, 70, 1590, 5001, 96, 93, 87)

SIZES: dict[str, VmSize] = {
    s.name: s
    for s in (
        VmSize("Standard_NC24ads_A100_v4", 1, A100_80GB_PCIE),
        VmSize("Standard_NC48ads_A100_v4", 2, A100_80GB_PCIE),
        VmSize("Standard_NC96ads_A100_v4", 4, A100_80GB_PCIE),
        VmSize("Standard_ND96asr_v4", 8, A100_40GB_SXM4),
        VmSize("Standard_ND96isr_H100_v5", 8, H100_80GB_HBM3),
        VmSize("Standard_NC40ads_H100_v5", 1, H100_NVL),
        VmSize("Standard_NC80adis_H100_v5", 2, H100_NVL),
        VmSize("Standard_NC4as_T4_v3", 1, T4),
        VmSize("Standard_NC64as_T4_v3", 4, T4),
    )
}


def expected_gpu_count(size: str | None) -> int | None:
    """GPUs an Azure VM size has, or None for a size this table does not know."""
    if not size:
        return None
    entry = SIZES.get(size)
    return entry.gpu_count if entry else None
