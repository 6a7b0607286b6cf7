"""Findings about training jobs that run out of GPU memory (runbook S2), from OOM messages and the memory planner."""

from __future__ import annotations

from remediation.core.catalog.entry import CatalogEntry, Runbook
from remediation.core.findings import Scenario, Severity

__all__ = ["ENTRIES"]

_SYMPTOMS = (
    "Your OOM's numbers are in the finding above. Typical (the runbook's example, not read from your text): a "
    "fine-tuning job starts well, runs 10-30 minutes, then crashes: `RuntimeError: CUDA out of memory. Tried to "
    "allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; 77.42 GiB already allocated; 1.08 GiB free; 78.50 GiB "
    'reserved in total by PyTorch)`. "But it worked for the first 500 steps."'
)
_DIAGNOSIS = (
    "- `invoke train.diagnose-oom LOG` (or `invoke diagnose LOG`): the OOM's numbers and what they point at\n"
    "- Log GPU memory continuously: `invoke train.monitor --host <host> --interval 5 --out gpu_memory.csv` (the "
    "runbook's `nvidia-smi --query-gpu=timestamp,memory.used,memory.free,utilization.gpu --format=csv -l 5`)\n"
    "- Compute the memory the job needs: `invoke train.plan --model <model> --gpu <gpu> --batch <batch> "
    "--seq-len <seq-len>` "
    "(7B with Adam in BF16 weights: ~14 GB parameters + ~14 GB gradients + ~56 GB fp32 Adam states = ~84 GB plus "
    "activations)"
)
_ROOT_CAUSE = (
    "Activation memory grows with batch x sequence length: a job whose first batches fit runs out when the data "
    "loader reaches longer sequences (the finding above says which cause your numbers point at; with --model etc. "
    "it uses your own settings). Example (the runbook's incident, not read from your text): batch size 8; early in "
    "training short sequences made small activation tensors, later longer ones grew activation memory past what was "
    "left on the GPU, so the OOM did not come at step 1."
)
_RESOLUTION = (
    "- Immediate: lower the batch and keep the effective batch with accumulation, e.g. for the example's batch 8: "
    "`TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=4)` (effective batch 8; "
    "`invoke train.plan` gives the values for your job)\n"
    "- Better: gradient checkpointing, `model.gradient_checkpointing_enable()` (20-30% slower, 60-80% less "
    "activation memory)\n"
    "- Bigger models: LoRA, `get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=['q_proj', "
    "'v_proj'], lora_dropout=0.05))` (trains <1% of the parameters)\n"
    "- `invoke train.plan ...` prints these settings for the job, ready to paste"
)
_PREVENTION = (
    "- Always compute the memory a job needs before starting it (`invoke train.plan`)\n"
    "- Set `max_seq_length` explicitly to bound activation memory; pad/truncate to it\n"
    "- Use `gradient_accumulation_steps` to keep the effective batch with a small per-GPU batch\n"
    "- If OOM comes at random steps (not always at step N), suspect variable-length sequences"
)


def _s2(**overrides: str) -> Runbook:
    parts = {
        "symptoms": _SYMPTOMS,
        "diagnosis": _DIAGNOSIS,
        "root_cause": _ROOT_CAUSE,
        "resolution": _RESOLUTION,
        "prevention": _PREVENTION,
    }
    parts.update(overrides)
    return Runbook(**parts)


_S2 = Scenario.S2

ENTRIES: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        "TRAIN-OOM-001",
        _S2,
        Severity.CRITICAL,
        "Training ran out of GPU memory",
        "invoke train.plan --model <model> --gpu <gpu> --batch <batch> --seq-len <seq-len> (the settings that fit)",
        _s2(),
    ),
    CatalogEntry(
        "TRAIN-OOM-002",
        _S2,
        Severity.WARNING,
        "GPU memory fragmentation: reserved by PyTorch but unallocated",
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (ROCm: PYTORCH_HIP_ALLOC_CONF)",
        _s2(
            root_cause="PyTorch's caching allocator holds freed blocks for reuse. With tensors of changing sizes "
            "(variable sequence lengths) the cache splits into pieces: the request does not fit in any one of them "
            "although reserved-but-unallocated memory adds up to more than it.",
            resolution="- `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (ROCm: `PYTORCH_HIP_ALLOC_CONF`) lets "
            "segments grow instead of splitting\n- Older PyTorch: `max_split_size_mb:512`\n"
            "- Pad batches to a few fixed lengths (bucketing) so tensor sizes repeat",
        ),
    ),
    CatalogEntry(
        "TRAIN-OOM-003",
        _S2,
        Severity.WARNING,
        "Other processes hold memory on the training GPU",
        "invoke train.monitor --host <host> (memory used over time); stop the other process or use another GPU",
        _s2(
            root_cause="Memory on the GPU is used outside the training process's PyTorch allocator: another "
            "process (a second job, an inference server, a notebook kernel left running) or a leak outside PyTorch. "
            "The job had less memory than the GPU's total.",
            resolution="- `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` on the host (or "
            "`invoke audit --limit <host>`: GPU processes per GPU)\n- Stop the other process, or pin the job to a free "
            "GPU (`CUDA_VISIBLE_DEVICES`)\n- On shared nodes: one GPU per job (Kubernetes `nvidia.com/gpu` limits)",
        ),
    ),
    CatalogEntry(
        "TRAIN-OOM-004",
        _S2,
        Severity.CRITICAL,
        "Activations do not fit: long or variable-length sequences",
        "set max_seq_length (pad/truncate), lower per_device_train_batch_size with gradient_accumulation_steps, "
        "enable gradient checkpointing (invoke train.plan prints the values)",
        _s2(),
    ),
    CatalogEntry(
        "TRAIN-OOM-005",
        _S2,
        Severity.CRITICAL,
        "Model states alone are too big for the GPU",
        "LoRA or QLoRA (invoke train.plan --method lora), ZeRO across GPUs (--gpus <n> --zero-stage 3), or a "
        "bigger GPU",
        _s2(
            root_cause="Parameters, gradients and optimizer states need more memory than the GPU has before any "
            "activation: no batch size or sequence length can make the job fit.",
            resolution="- LoRA: only the adapters are trained (16 bytes per adapter parameter), the base costs its "
            "weights only; QLoRA: the base in 4 bits\n- ZeRO-3 / FSDP: parameters, gradients and optimizer states "
            "sharded across GPUs\n- 8-bit AdamW (2 bytes per parameter of state instead of 8)\n- A GPU with more "
            "memory (`invoke train.plan --gpu H200`)",
        ),
    ),
)
