"""The measured points the planner is calibrated and checked on (development half of
tests/fixtures/corpus/memory-dev.md, section 8 and section 7), and the planner's error on them.

Only rows whose model, method, regime, batch and sequence length are stated are used as numbers; rows with
"n/s" fields are not. Capacity rows (the longest sequence that fits, or an OOM) are checked as constraints.
``bench/train_calibration.py`` prints the table that the README carries, refits :data:`ACTIVATION_SCALE` and
prints the leave-one-out errors (:func:`loo_rows`: the scale refitted without each peak point).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from remediation.train import plan as planner
from remediation.train.models import builtin, spec_from_params
from remediation.train.plan import PlanInput

__all__ = [
    "CAPACITY_POINTS",
    "PEAK_POINTS",
    "CapacityPoint",
    "LooRow",
    "PeakPoint",
    "capacity_rows",
    "fit_scale",
    "loo_rows",
    "loo_worst_under",
    "peak_rows",
]

GiB = 1024**3


@dataclass(frozen=True)
class PeakPoint:
    id: str
    what: str
    input: PlanInput
    measured_bytes: int  # max_memory_allocated


@dataclass(frozen=True)
class CapacityPoint:
    id: str
    what: str
    input: PlanInput  # capacity set; seq_len the length that fits (fits=True) or any length (fits=False)
    fits: bool
    listed_seq: int | None = None  # for "longest sequence that fits" rows


def _llama32_3b(**kw: object) -> PlanInput:
    return PlanInput(builtin("Llama-3.2-3B"), regime="bf16", batch=4, seq_len=768, **kw)  # type: ignore[arg-type]


PEAK_POINTS: tuple[PeakPoint, ...] = (
    PeakPoint("P2", "Llama-3.2-3B full FT, pure bf16, AdamW, batch 4, seq 768 (peft method comparison)",
              _llama32_3b(), 37_241_225_216),
    PeakPoint("P2-LoRA", "Llama-3.2-3B LoRA r=32 q,v, bf16, batch 4, seq 768 (same benchmark, section 7)",
              _llama32_3b(method="lora", lora_r=32, lora_targets=("q_proj", "v_proj"), lora_dropout=0.0),
              22_270_000_000),
    PeakPoint("L11", "Llama-2-7b LoRA r=32 q,v, bf16, AdamW, batch 2, seq 512 (LitGPT, A10G)",
              PlanInput(builtin("Llama-2-7b"), regime="bf16", method="lora", lora_r=32,
                        lora_targets=("q_proj", "v_proj"), batch=2, seq_len=512), 19_770_000_000),
    PeakPoint("L1", "Falcon-7B LoRA r=32 on query_key_value, bf16, batch 1, seq 512 (LitGPT, A10G)",
              PlanInput(builtin("Falcon-7B"), regime="bf16", method="lora", lora_r=32,
                        lora_targets=("query_key_value",), batch=1, seq_len=512), 16_690_000_000),
)

_U1 = PlanInput(builtin("Llama-3-8B"), regime="bf16", method="qlora", lora_r=32, lora_targets=("all-linear",),
                lora_dropout=0.0, batch=1, grad_checkpointing=True)
_U3 = replace(_U1, model=builtin("Llama-3-70B"))

CAPACITY_POINTS: tuple[CapacityPoint, ...] = (
    *(
        CapacityPoint(f"U1@{gb}GB", f"Llama-3.1-8B QLoRA r=32 all-linear, HF + FA2: {seq:,} tokens fit in {gb} GB",
                      replace(_U1, seq_len=seq, capacity_bytes=gb * GiB), True, seq)
        for gb, seq in ((12, 932), (16, 2551), (24, 5789), (40, 12264), (48, 15502), (80, 28454))
    ),
    CapacityPoint("U1@8GB", "Llama-3.1-8B QLoRA r=32 all-linear: OOM in 8 GB",
                  replace(_U1, seq_len=256, capacity_bytes=8 * GiB), False),
    CapacityPoint("U3@80GB", "Llama-3.3-70B QLoRA r=32 all-linear: 6,916 tokens fit in 80 GB",
                  replace(_U3, seq_len=6916, capacity_bytes=80 * GiB), True, 6916),
    CapacityPoint("U3@48GB", "Llama-3.3-70B QLoRA r=32 all-linear: OOM in 48 GB",
                  replace(_U3, seq_len=256, capacity_bytes=48 * GiB), False),
    CapacityPoint("L13", "Llama-3-8B full FT bf16, batch 4, seq 512 on 4x A10G (sharded): OOM",
                  PlanInput(builtin("Llama-3-8B"), regime="bf16", batch=4, seq_len=512, gpus=4, zero_stage=3,
                            capacity_bytes=23028 * 1024**2), False),
    CapacityPoint("F4", "mt0-xxl (12.9 B) full FT on A100 80GB: OOM",
                  PlanInput(spec_from_params(12_900_000_000), regime="bf16", batch=1, seq_len=512,
                            capacity_bytes=81920 * 1024**2), False),
)


def peak_rows(
    scale: float | None = None, points: tuple[PeakPoint, ...] = PEAK_POINTS
) -> list[tuple[PeakPoint, int, float]]:
    """(point, predicted allocated peak, relative error) for every peak point (``points``)."""
    rows = []
    with _scale(scale):
        for point in points:
            predicted = planner.plan(point.input.checked()).peak_allocated
            rows.append((point, predicted, predicted / point.measured_bytes - 1))
    return rows


def capacity_rows(scale: float | None = None) -> list[tuple[CapacityPoint, bool, int | None]]:
    """(point, the planner agrees, the longest sequence the planner says fits) for every capacity point."""
    rows = []
    with _scale(scale):
        for point in CAPACITY_POINTS:
            p = point.input.checked()
            result = planner.plan(p)
            fits = bool(result.fits)
            longest = None
            if point.listed_seq is not None:
                longest = _longest(_fits_at(p))
            rows.append((point, fits == point.fits, longest))
    return rows


def _fits_at(p: PlanInput) -> Callable[[int], bool]:
    def fits(seq: int) -> bool:
        return bool(planner.plan(replace(p, seq_len=seq)).fits)

    return fits


def _longest(fits: Callable[[int], bool]) -> int:
    lo, hi = 0, 1 << 20
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _scale:
    """Temporarily use another ACTIVATION_SCALE (for the fit)."""

    def __init__(self, value: float | None) -> None:
        self.value = value
        self.saved = planner.ACTIVATION_SCALE

    def __enter__(self) -> None:
        if self.value is not None:
            planner.ACTIVATION_SCALE = self.value

    def __exit__(self, *exc: object) -> None:
        planner.ACTIVATION_SCALE = self.saved


def fit_scale(
    lo: float = 0.8, hi: float = 1.4, step: float = 0.005, points: tuple[PeakPoint, ...] = PEAK_POINTS
) -> float:
    """The ACTIVATION_SCALE with the least sum of squared relative errors on the peak points (``points``)."""
    best, best_err = lo, float("inf")
    value = lo
    while value <= hi + 1e-9:
        err = sum(e * e for _, _, e in peak_rows(round(value, 4), points))
        if err < best_err:
            best, best_err = round(value, 4), err
        value += step
    return best


@dataclass(frozen=True)
class LooRow:
    point: PeakPoint
    scale: float  # ACTIVATION_SCALE fitted without the point (the only fitted constant)
    predicted: int  # allocated peak with that scale
    error: float  # signed: negative is an under-prediction (optimistic: an OOM risk)


def loo_rows() -> list[LooRow]:
    """Leave-one-out on the peak points: ACTIVATION_SCALE refitted without each point, the point then predicted."""
    rows = []
    for i, point in enumerate(PEAK_POINTS):
        scale = fit_scale(points=PEAK_POINTS[:i] + PEAK_POINTS[i + 1:])
        _, predicted, error = peak_rows(scale, (point,))[0]
        rows.append(LooRow(point, scale, predicted, error))
    return rows


def loo_worst_under() -> float:
    """The largest leave-one-out under-prediction on the peak points, as a positive fraction (0 if none is under)."""
    return max([0.0] + [-row.error for row in loo_rows()])
