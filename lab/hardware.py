"""The simulated GPUs of a lab host: the ``hw/gpus`` key=value file the lab's NVML answers from.

The file lives outside the host's root filesystem (hardware is not something the host can edit) and is
bound read-only at ``/run/gpulab/hw/gpus`` inside it. Its format is described in ``lab/native/README.md``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from remediation.core.skus import SIZES, VmSize

from .errors import LabError

# NVML clocks event reason bits (nvmlClocksEventReason*)
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40

State = dict[str, str]

# Sizes whose GPUs are joined by NVSwitch: they run NVIDIA's fabric manager (nv-fabricmanager) beside the
# persistence daemon. ND A100 v4, NDm A100 v4, ND H100 v5, ND H200 v5 and ND GB200 v6 (HGX/NVL boards); not NDv2
# (V100 NVLink hybrid cube mesh, no NVSwitch) nor ND MI300X v5 (AMD).
NVSWITCH_SIZES = frozenset(
    (
        "Standard_ND96asr_v4",
        "Standard_ND96amsr_A100_v4",
        "Standard_ND96isr_H100_v5",
        "Standard_ND96isr_H200_v5",
        "Standard_ND128isr_NDR_GB200_v6",
    )
)


def size_of(sku: str) -> VmSize:
    size = SIZES.get(sku)
    if size is None or size.gpu is None:
        known = sorted(n for n, s in SIZES.items() if s.gpu is not None)
        raise LabError(f"unknown VM size {sku!r} for the lab; known: {', '.join(known)}")
    return size


def healthy_state(host: str, sku: str) -> State:
    size = size_of(sku)
    gpu = size.nvml
    state: State = {"sku": sku, "hang": "0", "gpu_count": str(size.gpu_count)}
    state["nvswitch"] = "1" if sku in NVSWITCH_SIZES else "0"  # the driver package starts nv-fabricmanager on 1
    for i in range(size.gpu_count):
        p = f"gpu.{i}."
        total = gpu.memory_mib * 1024 * 1024
        state.update(
            {
                p + "name": gpu.name,
                p + "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{host}.gpu{i}.gpulab")),
                p + "serial": f"1{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host}.gpu{i}.serial').int % 10**12:012d}",
                p + "pci_bus_id": f"{i + 1:08X}:00:00.0",
                p + "pci_device_id": f"0x{gpu.pci_device_id:08X}",
                p + "pci_subsystem_id": "0x151F10DE",
                p + "memory_total": str(total),
                p + "memory_used": str(4 * 1024 * 1024),
                p + "temperature": "34",
                p + "temp_shutdown": str(gpu.temp_shutdown_c),
                p + "temp_slowdown": str(gpu.temp_slowdown_c),
                p + "temp_gpu_max": str(gpu.temp_gpu_max_c),
                p + "temp_mem_max": "95",
                p + "power_mw": "46000",
                p + "power_limit_mw": str(gpu.power_limit_w * 1000),
                p + "util_gpu": "0",
                p + "util_memory": "0",
                p + "clock_graphics": "210",
                p + "clock_sm": "210",
                p + "clock_mem": str(gpu.max_memory_mhz),
                p + "max_clock_graphics": str(gpu.max_graphics_mhz),
                p + "max_clock_sm": str(gpu.max_graphics_mhz),
                p + "max_clock_mem": str(gpu.max_memory_mhz),
                p + "clocks_event_reasons": f"0x{GPU_IDLE:x}",
                p + "ecc_mode": "1",
                p + "ecc_volatile_corrected": "0",
                p + "ecc_volatile_uncorrected": "0",
                p + "ecc_aggregate_corrected": "0",
                p + "ecc_aggregate_uncorrected": "0",
                p + "retired_sbe": "0",
                p + "retired_dbe": "0",
                p + "retired_pending": "0",
                p + "remapped_correctable": "0",
                p + "remapped_uncorrectable": "0",
                p + "remap_pending": "0",
                p + "remap_failure": "0",
                p + "persistence_mode": "1",
                p + "pstate": "0",
                p + "lost": "0",
                p + "procs": "",
            }
        )
    return state


def read_state(path: Path) -> State:
    state: State = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            state[k.strip()] = v.strip()
    return state


def write_state(path: Path, state: State) -> None:
    """Replace the file atomically (the NVML library may be reading it)."""
    for key, value in state.items():
        if "\n" in key or "\n" in value or "=" in key:
            raise LabError(f"invalid hardware state entry {key!r}")
    text = "# gpulab simulated GPU hardware state (see lab/native/README.md)\n"
    text += "".join(f"{k}={v}\n" for k, v in state.items())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def gpu_count(state: State) -> int:
    return int(state.get("gpu_count", "0"))


def pci_short(state: State, index: int) -> str:
    """``00000002:00:00.0`` -> ``0002:00:00`` as the kernel's ``Xid (PCI:...)`` prints it."""
    full = state.get(f"gpu.{index}.pci_bus_id", f"{index + 1:08X}:00:00.0")
    domain, bus, dev_fn = full.split(":")
    return f"{domain[-4:].lower()}:{bus.lower()}:{dev_fn.split('.')[0].lower()}"


def pci_long(state: State, index: int) -> str:
    """``00000002:00:00.0`` -> ``0002:00:00.0`` as NVRM's ``GPU ...`` lines print it."""
    return pci_short(state, index) + "." + state.get(f"gpu.{index}.pci_bus_id", "0.0").rsplit(".", 1)[-1]
