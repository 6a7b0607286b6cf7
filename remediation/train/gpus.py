"""GPU memory capacities for ``--gpu NAME``, ``--gpu-memory SIZE`` and ``--from-host HOST``.

Capacities are what NVML reports as the framebuffer total (``nvmlDeviceGetMemoryInfo().total``). The models the
fleet's Azure VM sizes carry come from :mod:`remediation.core.skus` (one table of record); the others are here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from remediation.core import skus
from remediation.train.errors import TrainError

__all__ = ["GPUS", "GpuCapacity", "gpu", "parse_size", "substitution"]

MiB = 1024**2


@dataclass(frozen=True)
class GpuCapacity:
    name: str  # the canonical --gpu name
    model: str  # as NVML names it
    memory_mib: int

    @property
    def bytes(self) -> int:
        return self.memory_mib * MiB


def _from_sku(name: str, model: skus.GpuModel) -> GpuCapacity:
    return GpuCapacity(name, model.name, model.memory_mib)


GPUS: dict[str, GpuCapacity] = {
    g.name: g
    for g in (
        _from_sku("A100-80GB", skus.A100_80GB_PCIE),
        _from_sku("A100-40GB", skus.A100_40GB_SXM4),
        _from_sku("H100-80GB", skus.H100_80GB_HBM3),
        _from_sku("H100-NVL", skus.H100_NVL),
        _from_sku("T4", skus.T4),
        GpuCapacity("H200", "NVIDIA H200", 143771),
        GpuCapacity("A10", "NVIDIA A10", 23028),
        GpuCapacity("A10G", "NVIDIA A10G", 23028),
        GpuCapacity("L4", "NVIDIA L4", 23034),
        GpuCapacity("L40S", "NVIDIA L40S", 46068),
        GpuCapacity("V100-16GB", "Tesla V100-SXM2-16GB", 16384),
        GpuCapacity("V100-32GB", "Tesla V100-SXM2-32GB", 32768),
        GpuCapacity("RTX-4090", "NVIDIA GeForce RTX 4090", 24564),
    )
}

_ALIASES = {"a100": "A100-80GB", "h100": "H100-80GB", "v100": "V100-16GB", "4090": "RTX-4090", "a10g": "A10G"}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("geforce", ""))


_BY_KEY = {_key(g.name): g for g in GPUS.values()} | {_key(g.model): g for g in GPUS.values()}
_BY_KEY |= {_key(a): GPUS[c] for a, c in _ALIASES.items()}
_BY_KEY |= {_key(g.name.replace("GB", "")): g for g in GPUS.values() if g.name.endswith("GB")}


def gpu(name: str) -> GpuCapacity:
    """The GPU called ``name`` (``A100-80GB``, ``a100 80``, ``NVIDIA H100 80GB HBM3``, ``H200``, ...)."""
    hit = _BY_KEY.get(_key(name))
    if hit is None:
        raise TrainError(f"--gpu {name!r} is not known ({', '.join(GPUS)}); pass --gpu-memory 80GiB instead")
    return hit


def substitution(name: str) -> str | None:
    """A note when ``name`` stands for one of several GPUs and was read as one of them (``A100`` -> A100-80GB)."""
    key = _key(name)
    alias = next((c for a, c in _ALIASES.items() if _key(a) == key), None)
    if alias is None or key in (_key(alias), _key(GPUS[alias].model)):
        return None
    g = GPUS[alias]
    others = ", ".join(n for n in GPUS if n != g.name and _key(n).startswith(key))
    return f"--gpu {name} is planned as {g.name} ({g.memory_mib} MiB)" + (
        f"; name the exact model ({others}) if yours differs" if others else ""
    )


_UNITS = {"b": 1, "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "mi": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3, "t": 1000**4, "tb": 1000**4,
          "tib": 1024**4, "ti": 1024**4}


def parse_size(text: str, flag: str = "--gpu-memory") -> int:
    """``80GiB``, ``80 GB``, ``80G``, ``81920MiB`` -> bytes (GB and G = 10^9, GiB and Gi = 2^30).

    A bare number is refused: ``80`` is far more often meant as GB than as 80 bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is not None and not unit:
        raise TrainError(f"{flag} {text.strip()}: give a unit, e.g. {m.group(1)}GB (or {m.group(1)}GiB)")
    if m is None or unit not in _UNITS:
        raise TrainError(f"{flag} {text!r} is not a size; write it like 80GiB, 48GB or 24564MiB")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise TrainError(f"{flag} {text!r} must be more than 0")
    return value
