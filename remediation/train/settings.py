"""``train:`` in invoke.yaml: the planner's planning assumptions and the monitor's bounds (every one also a flag
where a user would change it per run)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainSettings"]


@dataclass(frozen=True)
class TrainSettings:
    gpu: str = "A100-80GB"  # the GPU planned for when neither --gpu, --gpu-memory nor --from-host is given
    regime: str = "bf16"
    optimizer: str = "adamw"
    cuda_context_mib: int = 768  # CUDA context, kernels and driver reserve outside PyTorch's allocator
    allocator_overhead: float = 0.08  # reserved-but-unallocated share on top of the allocated peak
    headroom: float = 0.05  # recommendations keep this share of the GPU free
    lora_r: int = 16
    lora_dropout: float = 0.05
    monitor_interval: float = 5.0  # seconds between samples (nvidia-smi -l 5)
    monitor_count: int = 12  # samples when neither --count nor --duration is given
    monitor_max_seconds: float = 3600.0  # the longest run one command may ask for
    monitor_chunk_seconds: float = 60.0  # samples travel back (and reach the CSV) at least this often
    connect_timeout: float = 10.0
