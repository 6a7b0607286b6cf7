"""Azure GPU VM sizes: vCPUs, GPUs (how many, which model), and the quota family each size is counted in.

Used by the audit (a host with fewer GPUs than its size is broken), by the lab (to shape its hosts: only sizes with an
NVML model, ``VmSize.gpu``, can be simulated) and by ``invoke quota.plan`` / ``aks.pools`` (GPUs -> VMs -> vCPUs of a
quota family). Figures (vCPUs, GPUs, quota family) from Azure's published size tables and the Resource SKUs API's
``family`` field for the current GPU series: NCasT4_v3, NC A10 v4, NC A100 v4, NCads H100 v5, NCCads H100 v5, NDv2,
ND A100 v4, NDm A100 v4, ND H100 v5, ND H200 v5, ND MI300X v5, ND GB200 v6, NVv3, NVv4, NVads A10 v5. Sizes retired
before today (NC, NCv2, NCv3, ND, NV) are not in the table; their quota families still show in a region's usage list
and are kept in :data:`RETIRED_FAMILIES` so quota commands recognise them.

``gpu_count`` is the number of GPUs the guest sees (what NVML and ``nvidia.com/gpu`` count); a size that gets a
slice of one physical GPU (NVv4, NVads A10 v5) sees one GPU and has ``gpu_share`` below 1. Quota family names are
compared case-insensitively everywhere: Azure itself spells them both ways (``StandardNCADSA100v4Family`` in the SKU
list, ``standardNCADSA100v4Family`` in usages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "GPU_FAMILY_PATTERN",
    "RETIRED_FAMILIES",
    "SIZES",
    "GpuModel",
    "VmSize",
    "expected_gpu_count",
    "families",
    "family_name",
    "is_gpu_family",
    "size",
    "sizes_in_family",
]


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
    gpu_count: int  # GPUs the guest sees
    gpu: GpuModel | None  # the NVML model the lab simulates; None: not simulated (the figures below still hold)
    vcpus: int = 0
    family: str = ""  # quota family (Microsoft.Compute usage name), e.g. standardNCADSA100v4Family
    gpu_model: str = ""  # the accelerator, in words
    gpu_share: Fraction = Fraction(1)  # of one physical GPU, per GPU the guest sees

    @property
    def nvml(self) -> GpuModel:
        """The NVML model of this size's GPU; ``KeyError`` for a size the lab does not simulate."""
        if self.gpu is None:
            raise KeyError(f"{self.name}: no NVML model in the size table (the lab cannot simulate it)")
        return self.gpu


A100_80GB_PCIE = GpuModel("NVIDIA A100 80GB PCIe", 81920, 0x20B510DE, 300, 1410, 1512, 92, 89, 85)
A100_40GB_SXM4 = GpuModel("NVIDIA A100-SXM4-40GB", 40960, 0x20B010DE, 400, 1410, 1215, 92, 89, 85)
H100_80GB_HBM3 = GpuModel("NVIDIA H100 80GB HBM3", 81559, 0x233010DE, 700, 1980, 2619, 92, 89, 87)
H100_NVL = GpuModel("NVIDIA H100 NVL", 95830, 0x232110DE, 400, 1785, 2619, 92, 89, 87)
T4 = GpuModel("Tesla T4", 15360, 0x1EB810DE, 70, 1590, 5001, 96, 93, 87)

_NCAST4 = "standardNCASv3_T4Family"
_NCA10 = "StandardNCADSA10v4Family"
_NCA100 = "StandardNCADSA100v4Family"
_NCH100 = "StandardNCadsH100v5Family"
_NCCH100 = "StandardNCCads2023Family"
_NDV2 = "standardNDSv2Family"
_NDA100 = "standardNDASv4_A100Family"
_NDMA100 = "standardNDAMSv4_A100Family"
_NDH100 = "standardNDSH100v5Family"
_NDH200 = "standardNDISRH200V5Family"
_NDMI300X = "standardNDISv5MI300XFamily"
_NDGB200 = "standardNDISRGB200V6NDRFamily"
_NVV3 = "standardNVSv3Family"
_NVV4 = "standardNVSv4Family"
_NVA10 = "StandardNVADSA10v5Family"


def _s(
    name: str, vcpus: int, gpus: int, family: str, model: str, gpu: GpuModel | None = None, share: str = "1"
) -> VmSize:
    return VmSize(name, gpus, gpu, vcpus, family, model, Fraction(share))


SIZES: dict[str, VmSize] = {
    s.name: s
    for s in (
        # NC family: compute (CUDA) workloads
        _s("Standard_NC4as_T4_v3", 4, 1, _NCAST4, "NVIDIA T4 16GB", T4),
        _s("Standard_NC8as_T4_v3", 8, 1, _NCAST4, "NVIDIA T4 16GB", T4),
        _s("Standard_NC16as_T4_v3", 16, 1, _NCAST4, "NVIDIA T4 16GB", T4),
        _s("Standard_NC64as_T4_v3", 64, 4, _NCAST4, "NVIDIA T4 16GB", T4),
        _s("Standard_NC8ads_A10_v4", 8, 1, _NCA10, "NVIDIA A10 24GB"),
        _s("Standard_NC16ads_A10_v4", 16, 1, _NCA10, "NVIDIA A10 24GB"),
        _s("Standard_NC32ads_A10_v4", 32, 2, _NCA10, "NVIDIA A10 24GB"),
        _s("Standard_NC24ads_A100_v4", 24, 1, _NCA100, "NVIDIA A100 80GB PCIe", A100_80GB_PCIE),
        _s("Standard_NC48ads_A100_v4", 48, 2, _NCA100, "NVIDIA A100 80GB PCIe", A100_80GB_PCIE),
        _s("Standard_NC96ads_A100_v4", 96, 4, _NCA100, "NVIDIA A100 80GB PCIe", A100_80GB_PCIE),
        _s("Standard_NC40ads_H100_v5", 40, 1, _NCH100, "NVIDIA H100 NVL 94GB", H100_NVL),
        _s("Standard_NC80adis_H100_v5", 80, 2, _NCH100, "NVIDIA H100 NVL 94GB", H100_NVL),
        _s("Standard_NCC40ads_H100_v5", 40, 1, _NCCH100, "NVIDIA H100 NVL 94GB (confidential)", H100_NVL),
        # ND family: large-scale training (NVLink, InfiniBand)
        _s("Standard_ND40rs_v2", 40, 8, _NDV2, "NVIDIA V100 32GB SXM2"),
        _s("Standard_ND96asr_v4", 96, 8, _NDA100, "NVIDIA A100 40GB SXM4", A100_40GB_SXM4),
        _s("Standard_ND96amsr_A100_v4", 96, 8, _NDMA100, "NVIDIA A100 80GB SXM4"),
        _s("Standard_ND96isr_H100_v5", 96, 8, _NDH100, "NVIDIA H100 80GB HBM3", H100_80GB_HBM3),
        _s("Standard_ND96isr_H200_v5", 96, 8, _NDH200, "NVIDIA H200 141GB"),
        _s("Standard_ND96isr_MI300X_v5", 96, 8, _NDMI300X, "AMD Instinct MI300X 192GB"),
        _s("Standard_ND128isr_NDR_GB200_v6", 128, 4, _NDGB200, "NVIDIA GB200 (Blackwell) 192GB"),
        # NV family: visualisation / VDI; NVv4 and NVads A10 v5 give a slice of one GPU
        _s("Standard_NV12s_v3", 12, 1, _NVV3, "NVIDIA Tesla M60 8GB"),
        _s("Standard_NV24s_v3", 24, 2, _NVV3, "NVIDIA Tesla M60 8GB"),
        _s("Standard_NV48s_v3", 48, 4, _NVV3, "NVIDIA Tesla M60 8GB"),
        _s("Standard_NV4as_v4", 4, 1, _NVV4, "AMD Radeon Instinct MI25", share="1/8"),
        _s("Standard_NV8as_v4", 8, 1, _NVV4, "AMD Radeon Instinct MI25", share="1/4"),
        _s("Standard_NV16as_v4", 16, 1, _NVV4, "AMD Radeon Instinct MI25", share="1/2"),
        _s("Standard_NV32as_v4", 32, 1, _NVV4, "AMD Radeon Instinct MI25"),
        _s("Standard_NV6ads_A10_v5", 6, 1, _NVA10, "NVIDIA A10 24GB", share="1/6"),
        _s("Standard_NV12ads_A10_v5", 12, 1, _NVA10, "NVIDIA A10 24GB", share="1/3"),
        _s("Standard_NV18ads_A10_v5", 18, 1, _NVA10, "NVIDIA A10 24GB", share="1/2"),
        _s("Standard_NV36ads_A10_v5", 36, 1, _NVA10, "NVIDIA A10 24GB"),
        _s("Standard_NV36adms_A10_v5", 36, 1, _NVA10, "NVIDIA A10 24GB"),
        _s("Standard_NV72ads_A10_v5", 72, 2, _NVA10, "NVIDIA A10 24GB"),
    )
}

#: Quota families of GPU sizes Azure has retired: still listed in a region's usages, no longer deployable.
RETIRED_FAMILIES: tuple[str, ...] = (
    "standardNCFamily",
    "standardNCPromoFamily",
    "standardNCSv2Family",
    "standardNCSv3Family",
    "standardNDSFamily",
    "standardNVFamily",
    "standardNVPromoFamily",
    "standardNVSv2Family",
)

#: What a GPU quota family's name looks like (N-series: NC, ND, NG, NV), for families newer than this table.
GPU_FAMILY_PATTERN = re.compile(r"^standardN[CDGV]", re.IGNORECASE)

_BY_LOWER = {s.name.lower(): s for s in SIZES.values()}


def expected_gpu_count(size: str | None) -> int | None:
    """GPUs an Azure VM size has, or None for a size this table does not know."""
    if not size:
        return None
    entry = SIZES.get(size) or _BY_LOWER.get(size.lower())
    return entry.gpu_count if entry else None


def size(name: str) -> VmSize | None:
    """The size called ``name`` (case-insensitive), or None."""
    return _BY_LOWER.get(name.strip().lower())


def families() -> dict[str, str]:
    """Every GPU quota family this table knows (current and retired): lower-case name -> name as Azure spells it."""
    out = {s.family.lower(): s.family for s in SIZES.values()}
    out.update({f.lower(): f for f in RETIRED_FAMILIES})
    return out


def family_name(name: str) -> str | None:
    """``name`` as this table spells the family (case-insensitive match), or None for a family it does not know."""
    return families().get(name.strip().lower())


def is_gpu_family(name: str) -> bool:
    """A GPU quota family: one this table knows, or one named like an N-series family."""
    return family_name(name) is not None or bool(GPU_FAMILY_PATTERN.match(name.strip()))


def sizes_in_family(family: str) -> list[VmSize]:
    """The current sizes counted in ``family`` (case-insensitive), smallest first."""
    key = family.strip().lower()
    return sorted((s for s in SIZES.values() if s.family.lower() == key), key=lambda s: (s.vcpus, s.name))
