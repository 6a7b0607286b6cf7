"""The training-memory planner: what a fine-tuning job needs on each GPU, and the settings that make it fit.

Model states (exact, per tensor dtype):

======================  =======  =====  ===============================  =======  =====================================
regime (``--regime``)   weights  grads  optimizer states (AdamW)         total    what it is
======================  =======  =====  ===============================  =======  =====================================
``bf16``                2        2      4 (m, v in the params' dtype)    8        model loaded in bf16, torch AdamW
``bf16-fp32-states``    2        2      8 (m, v in fp32)                 12       the runbook's table (7B: 14/14/56 GB)
``mixed``               2        2      12 (fp32 master + m, v)          16       ZeRO/DeepSpeed mixed precision
``amp``                 4        4      8                                16       fp32 model under autocast (+2 B/p
                                                                                  of bf16 weight copies in the forward)
``fp32``                4        4      8                                16       fp32 training
======================  =======  =====  ===============================  =======  =====================================

Optimizer states per trainable parameter, ``s`` = the state dtype's bytes (the params' dtype, fp32 in
``bf16-fp32-states``/``mixed``/``amp``): AdamW ``2s``; SGD with momentum ``s``; SGD without momentum 0; 8-bit AdamW
(bitsandbytes) 2 bytes plus a fp32 absmax per 256-element block and state, and fp32 states (8 bytes) for tensors under
4096 elements. torch keeps AdamW's ``step`` counters on the CPU: no GPU bytes. LoRA adapters are fp32 (peft upcasts
them, ``autocast_adapter_dtype=True``): 4 + 4 bytes plus fp32 states, whatever the regime; the frozen base costs its
weights only (QLoRA: NF4, 0.5 byte plus double-quantized constants per linear weight; embeddings, norms and head in
fp32, as peft's ``prepare_model_for_kbit_training`` casts them).

Activations: the tensors autograd saves for backward, counted per token and per layer for each block family
(Korthikanti et al. 2022, redone for SwiGLU, RMSNorm, GQA and FlashAttention: no ``s^2`` term; a frozen module saves
no input for its weight gradient; LoRA saves its fp32 input copy, dropout mask and rank-r output), plus the loss over
the vocabulary (``V`` per token: the fp32 log-softmax kept for backward, its gradient and the gradient of its input
at the start of backward: 12 bytes; the Trainer drops the 16-bit logits before backward). With gradient
checkpointing each layer keeps its input and one layer is recomputed at a time. One factor,
:data:`ACTIVATION_SCALE`, calibrated on measured peaks (README), scales activations and logits for what this count
leaves out (backward temporaries, allocator rounding).

The peak is the larger of two moments: the end of the forward pass (weights, optimizer states from the last step,
every activation, the loss's buffers, the head's gradient; with gradient accumulation, the gradients of the earlier
micro-batches) and the optimizer step (weights, gradients, states, and the foreach AdamW's temporary, a copy of
``v``, unless ``fused``). QLoRA adds, at the end of the forward pass, the largest linear weight dequantized to the
compute dtype (2 bytes per weight) and the fp32 absmax its double-quantized 8-bit absmax is expanded to first (4 bytes
per 64-weight block); its stored NF4 state is in the weights (0.5 byte, an 8-bit absmax per 64 weights, a fp32
constant per 256 absmax blocks). Then the CUDA context and the allocator's reserve on top.

Out of sample: leave-one-out on the development peak points (:data:`ACTIVATION_SCALE` refitted without each point,
the point then predicted; ``bench/train_calibration.py``) under-predicts by at most 4.6 % (Llama-3.2-3B full
fine-tuning), inside the 5 % the issue allows and inside the 5 % ``headroom`` recommendations keep; ``fits`` itself
has no margin. A safety margin of that size on the whole peak was tried and not kept: it makes the planner say OOM
at the listed lengths of four QLoRA capacity points that do fit (Llama-3.1-8B in 12/16/24 GB, 70B in 80 GB).
Those capacity points bound the QLoRA error rather than measure it: at the listed lengths the planner's total is up
to 6.1 % under the GPU (Llama-3.1-8B in 80 GB), which if the lengths are exact maxima means per-token memory for
HF QLoRA with gradient checkpointing about 7-13 % low; no measured QLoRA peak is among the points to derive the term.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from remediation.train.errors import TrainError
from remediation.train.models import ModelSpec, lora_params

__all__ = [
    "ACTIVATION_SCALE",
    "METHODS",
    "OPTIMIZERS",
    "REGIMES",
    "Plan",
    "PlanInput",
    "Recommendation",
    "RegimeBytes",
    "load_note",
    "plan",
    "recommend",
    "single_token_floor",
]

GiB = 1024**3

#: Calibrated on the development points of tests/fixtures/corpus/memory-dev.md (bench/train_calibration.py fits it).
ACTIVATION_SCALE = 1.055


@dataclass(frozen=True)
class RegimeBytes:
    weight: int
    grad: int
    state: int  # bytes of one optimizer state element
    master: int  # fp32 master copy kept by the optimizer
    activation: int  # bytes of one activation element
    autocast_copy: int  # 16-bit weight copies autocast keeps alive through the forward
    description: str


REGIMES: dict[str, RegimeBytes] = {
    "bf16": RegimeBytes(2, 2, 2, 0, 2, 0, "pure bf16: weights, gradients and AdamW states in bf16 (8 B/param)"),
    "bf16-fp32-states": RegimeBytes(
        2, 2, 4, 0, 2, 0, "bf16 weights and gradients, fp32 optimizer states, no master copy (12 B/param: the runbook)"
    ),
    "mixed": RegimeBytes(
        2, 2, 4, 4, 2, 0, "mixed precision: bf16 weights and gradients, fp32 master weights and states (16 B/param)"
    ),
    "amp": RegimeBytes(
        4, 4, 4, 0, 2, 2, "fp32 model under bf16 autocast: fp32 weights, gradients, states + bf16 copies (16+2)"
    ),
    "fp32": RegimeBytes(4, 4, 4, 0, 4, 0, "fp32 training (16 B/param)"),
}
_REGIME_ALIASES = {"runbook": "bf16-fp32-states", "bf16-mixed": "mixed", "fp16": "bf16", "pure-bf16": "bf16"}

OPTIMIZERS = ("adamw", "adamw-8bit", "sgd", "sgd-momentum")
_OPTIMIZER_ALIASES = {
    "adam": "adamw",
    "adamw_torch": "adamw",
    "adamw8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "adamw_bnb_8bit": "adamw-8bit",
    "paged_adamw_8bit": "adamw-8bit",
    "sgd-nesterov": "sgd-momentum",
}
METHODS = ("full", "lora", "qlora")
ATTENTION = ("flash", "eager")

_BNB_MIN_8BIT = 4096  # bitsandbytes keeps 32-bit states for smaller tensors
_BNB_BLOCK = 256
# NF4 with double quantization: 4 bits, an 8-bit absmax per 64 weights, a fp32 constant per 256 absmax blocks.
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)


def _pick(value: str, choices: tuple[str, ...] | dict[str, Any], aliases: dict[str, str], flag: str) -> str:
    key = value.strip().lower()
    key = aliases.get(key, key)
    if key not in choices:
        raise TrainError(f"{flag} {value!r} is not one of {', '.join(choices)}")
    return key


@dataclass(frozen=True)
class PlanInput:
    """Everything the planner needs about one job (validated by :meth:`checked`)."""

    model: ModelSpec
    capacity_bytes: int | None = None
    capacity_source: str = ""
    regime: str = "bf16"
    optimizer: str = "adamw"
    method: str = "full"
    lora_r: int = 16
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.05
    batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    grad_checkpointing: bool = False
    gpus: int = 1
    zero_stage: int = 0
    attention: str = "flash"
    fused_optimizer: bool = False  # torch's default AdamW is foreach: a copy of v during the step
    cuda_context_bytes: int = 768 * 1024**2
    allocator_overhead: float = 0.08
    headroom: float = 0.05
    notes: tuple[str, ...] = ()  # what the input's reading changed (a GPU or model name read as another), shown first

    def checked(self) -> PlanInput:
        """This input with names normalised; raises :class:`TrainError` naming the first bad flag."""
        regime = _pick(self.regime, REGIMES, _REGIME_ALIASES, "--regime")
        optimizer = _pick(self.optimizer, OPTIMIZERS, _OPTIMIZER_ALIASES, "--optimizer")
        method = _pick(self.method, METHODS, {}, "--method")
        attention = _pick(self.attention, ATTENTION, {"sdpa": "flash", "flash_attention_2": "flash"}, "--attention")
        for flag, value in (("--batch", self.batch), ("--seq-len", self.seq_len), ("--grad-accum", self.grad_accum),
                            ("--gpus", self.gpus)):
            if value < 1:
                raise TrainError(f"{flag} {value} must be at least 1")
        if self.zero_stage not in (0, 1, 2, 3):
            raise TrainError(f"--zero-stage {self.zero_stage} must be 0, 1, 2 or 3")
        if self.zero_stage and self.gpus < 2:
            raise TrainError(
                f"--zero-stage {self.zero_stage} shards across GPUs: give --gpus N (2 or more); on one GPU it shards "
                "nothing"
            )
        if self.capacity_bytes is not None and self.capacity_bytes <= 0:
            raise TrainError("the GPU memory must be more than 0 bytes")
        if not 0 <= self.lora_dropout < 1:
            raise TrainError(f"--lora-dropout {self.lora_dropout} must be in [0, 1)")
        if not 0 <= self.allocator_overhead < 1 or not 0 <= self.headroom < 1:
            raise TrainError("train.allocator_overhead and train.headroom must be fractions in [0, 1)")
        out = replace(self, regime=regime, optimizer=optimizer, method=method, attention=attention)
        if method != "full":
            out.model.lora_modules(self.lora_targets)  # raises for an unknown target
            lora_params(out.model, self.lora_r, self.lora_targets)
        return out

    @property
    def effective_batch(self) -> int:
        return self.batch * self.grad_accum * self.gpus

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


@dataclass(frozen=True)
class Plan:
    """The planner's answer for one :class:`PlanInput` (bytes per GPU)."""

    input: PlanInput
    total_params: int
    trainable_params: int
    breakdown: dict[str, int]  # parameters, gradients, optimizer_states, activations, logits, cuda_context, ...
    transients: dict[str, int]  # optimizer_step, autocast_weight_copies, dequantization
    phases: dict[str, int]  # allocated bytes at the end of the forward pass and during the optimizer step
    peak_phase: str
    peak_allocated: int
    peak_bytes: int  # what nvidia-smi would show: allocated peak + allocator reserve + CUDA context
    notes: tuple[str, ...] = ()

    @property
    def model_states(self) -> int:
        b = self.breakdown
        return b["parameters"] + b["gradients"] + b["optimizer_states"]

    @property
    def capacity(self) -> int | None:
        return self.input.capacity_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.peak_bytes <= self.capacity

    @property
    def margin_bytes(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.peak_bytes

    @property
    def comfortable(self) -> bool:
        """Fits with the headroom the recommendations keep."""
        cap = self.capacity
        return cap is not None and self.peak_bytes <= cap * (1 - self.input.headroom)

    @property
    def states_fit(self) -> bool | None:
        """Whether model states alone (plus the CUDA context) fit: if not, no batch or sequence setting helps."""
        cap = self.capacity
        return None if cap is None else self.model_states + self.breakdown["cuda_context"] <= cap


# --- model states ---------------------------------------------------------------------------------------------


def _state_bytes(optimizer: str, state: int, tensors: tuple[int, ...]) -> int:
    """Optimizer state bytes for trainable tensors of the given sizes, states of ``state`` bytes per element."""
    n = sum(tensors)
    if optimizer == "adamw":
        return 2 * state * n
    if optimizer == "sgd-momentum":
        return state * n
    if optimizer == "sgd":
        return 0
    small = sum(t for t in tensors if t < _BNB_MIN_8BIT)
    big = n - small
    return 8 * small + 2 * big + 2 * 4 * math.ceil(big / _BNB_BLOCK)


def _lora_tensors(spec: ModelSpec, r: int, targets: tuple[str, ...]) -> tuple[int, ...]:
    per_layer: list[int] = []
    for m in spec.lora_modules(targets):
        per_layer += [r * m.in_features, r * m.out_features]
    return tuple(per_layer * spec.layers)


def _shard(value: float, gpus: int, on: bool) -> int:
    return math.ceil(value / gpus) if on and gpus > 1 else int(value)


# --- activations ----------------------------------------------------------------------------------------------


def layer_activation_bytes(p: PlanInput, seq_len: int) -> float:
    """Bytes autograd keeps per token for one layer without checkpointing (before :data:`ACTIVATION_SCALE`)."""
    spec, e = p.model, REGIMES[p.regime].activation
    h, hd = spec.hidden, spec.head_dim
    full = p.method == "full"
    lora = {m.name for m in spec.lora_modules(p.lora_targets)} if not full else set()

    def saves_input(name: str) -> bool:
        return full or name in lora

    def lora_extra(name: str, width: int) -> float:
        if name not in lora:
            return 0.0
        mask = width if p.lora_dropout > 0 else 0
        return 4 * width + mask + 4 * p.lora_r  # fp32 input copy (or its dropout), dropout mask, rank-r output

    names = {m.name.rsplit(".", 1)[-1]: m for m in spec.layer_linears}
    total = 0.0
    for m in spec.layer_linears:
        total += lora_extra(m.name, m.in_features)
    q_width, kv_width = spec.heads * hd, spec.kv_heads * hd
    if p.attention == "flash":
        attention = e * (2 * q_width + 2 * kv_width) + 4 * spec.heads  # q, k, v, output; fp32 logsumexp
    else:
        attention = e * (2 * q_width + 2 * kv_width) + (4 + e) * spec.heads * seq_len  # fp32 softmax + its copy

    if spec.family == "gated":
        attn_in = [n for n in names if n in ("q_proj", "k_proj", "v_proj", "qkv_proj")]
        mlp_in = [n for n in names if n in ("gate_proj", "up_proj", "gate_up_proj")]
        # RMSNorm (HF): an fp32 copy of its input, and its output where a consumer saves it
        total += 4 * h + (e * h if any(saves_input(names[n].name) for n in attn_in) else 0)
        total += 4 * h + (e * h if any(saves_input(names[n].name) for n in mlp_in) else 0)
        total += attention
        inter = spec.intermediate
        total += 3 * e * inter  # gate output (activation input), activation output, up output
        total += e * inter if saves_input(names["down_proj"].name) else 0
    elif spec.family == "falcon":
        ln_out = any(saves_input(m.name) for m in spec.layer_linears if m.name.endswith(("query_key_value", "h_to_4h")))
        total += e * h + 8 + (e * h if ln_out else 0)  # LayerNorm input, mean/rstd, output
        total += attention
        total += e * spec.intermediate  # GeLU input
        total += e * spec.intermediate if saves_input(names["dense_4h_to_h"].name) else 0
    else:  # gpt2: Korthikanti's 34 sbh with its dropout masks (1 byte), sequential attention and MLP
        mask = 1 if spec.dropout > 0 else 0
        total += e / 2 * (34 - 3) * h + 3 * mask * h
        total += attention - e * (2 * q_width + 2 * kv_width) + e * 2 * h
        if p.attention == "eager":
            total += (e + mask) * spec.heads * seq_len  # attention dropout output and mask
    return total


def activation_bytes(p: PlanInput, seq_len: int | None = None, batch: int | None = None) -> tuple[int, int]:
    """(activations, logits) bytes on one GPU at the end of the forward pass, scaled by ACTIVATION_SCALE."""
    s = seq_len or p.seq_len
    tokens = (batch or p.batch) * s
    spec, e = p.model, REGIMES[p.regime].activation
    per_layer = layer_activation_bytes(p, s)
    final_norm = (4 + e) * spec.hidden
    if p.grad_checkpointing:
        acts = tokens * (spec.layers * e * spec.hidden + per_layer + final_norm)
    else:
        acts = tokens * (spec.layers * per_layer + final_norm)
    logits = tokens * spec.vocab * 12
    return int(acts * ACTIVATION_SCALE), int(logits * ACTIVATION_SCALE)


# --- the plan -------------------------------------------------------------------------------------------------


def plan(p: PlanInput) -> Plan:
    """The memory plan of one job (``p`` should come through :meth:`PlanInput.checked`)."""
    spec = p.model
    reg = REGIMES[p.regime]
    total = spec.params
    n = p.gpus
    z = p.zero_stage
    notes: list[str] = list(p.notes)
    loading = load_note(p)
    if loading:
        notes.append(loading)
    if p.method == "full":
        trainable = total
        tensors = spec.param_tensors
        weights = total * reg.weight
        grads = total * reg.grad
        states = _state_bytes(p.optimizer, reg.state, tensors) + total * reg.master
        step_tmp = total * reg.state if p.optimizer == "adamw" and not p.fused_optimizer else 0
        if reg.master:
            step_tmp += total * 4  # fp32 gradients for the master step (DeepSpeed's 20 bytes per parameter)
        autocast = spec.linear_params * reg.autocast_copy + (spec.vocab * spec.hidden * reg.autocast_copy)
        head_grad = spec.vocab * spec.hidden * reg.grad
        dequant = 0
    else:
        trainable = lora_params(spec, p.lora_r, p.lora_targets)
        tensors = _lora_tensors(spec, p.lora_r, p.lora_targets)
        if p.method == "qlora":
            # peft's prepare_model_for_kbit_training (the QLoRA recipe) upcasts every parameter that is not 4-bit
            # (embeddings, norms, head) to fp32
            frozen = int(spec.linear_params * NF4_BYTES) + (total - spec.linear_params) * 4
            # one weight dequantized at a time: its compute-dtype (bf16) copy, and the fp32 absmax the double
            # quantization's 8-bit absmax (one per 64-weight block) is first dequantized to
            dequant = 2 * spec.largest_linear + 4 * math.ceil(spec.largest_linear / 64)
            notes.append(
                "QLoRA: NF4 with double quantization for the layers' linear weights; embeddings, norms and head in "
                "fp32, as peft's prepare_model_for_kbit_training leaves them"
            )
        else:
            frozen = total * reg.weight
            dequant = 0
        weights = frozen + trainable * 4
        grads = trainable * 4
        states = _state_bytes(p.optimizer, 4, tensors)
        step_tmp = trainable * 4 if p.optimizer == "adamw" and not p.fused_optimizer else 0
        autocast = spec.linear_params * reg.autocast_copy if p.method == "lora" else 0
        head_grad = 0
    # ZeRO: stage 1 shards optimizer states, 2 also gradients, 3 also parameters (plus a layer gathered at a time)
    states = _shard(states, n, z >= 1)
    step_tmp = _shard(step_tmp, n, z >= 1)
    grads = _shard(grads, n, z >= 2)
    head_grad = _shard(head_grad, n, z >= 2)
    if z >= 3 and n > 1:
        gathered = 2 * spec.layer_params * reg.weight  # the layer in use and the next one, prefetched
        weights = _shard(weights, n, True) + gathered
    acts, logits = activation_bytes(p)
    # With gradient accumulation the gradients of earlier micro-batches are alive through the next forward pass.
    held_grads = grads if p.grad_accum > 1 else head_grad
    forward_end = weights + states + acts + logits + held_grads + autocast + dequant
    step = weights + grads + states + step_tmp
    phases = {"forward_end": forward_end, "optimizer_step": step}
    peak_phase = max(phases, key=lambda k: phases[k])
    peak_alloc = phases[peak_phase]
    overhead = int(peak_alloc * p.allocator_overhead)
    breakdown = {
        "parameters": weights,
        "gradients": grads,
        "optimizer_states": states,
        "activations": acts,
        "logits": logits,
        "cuda_context": p.cuda_context_bytes,
        "allocator_overhead": overhead,
    }
    transients = {"optimizer_step": step_tmp, "autocast_weight_copies": autocast, "dequantization": dequant}
    if p.optimizer == "adamw" and step_tmp >= GiB:
        notes.append("torch AdamW (foreach, the default) holds a copy of v during the step; fused=True avoids it")
    if p.seq_len > spec.max_positions > 0:
        notes.append(f"--seq-len {p.seq_len} is beyond the model's {spec.max_positions} positions")
    return Plan(
        input=p,
        total_params=total,
        trainable_params=trainable,
        breakdown=breakdown,
        transients=transients,
        phases=phases,
        peak_phase=peak_phase,
        peak_allocated=peak_alloc,
        peak_bytes=peak_alloc + overhead + p.cuda_context_bytes,
        notes=tuple(notes),
    )


def load_note(p: PlanInput) -> str | None:
    """How the weights must be loaded for the regime's bytes to hold (None where the default load is right)."""
    if p.method == "qlora" or p.regime not in ("bf16", "bf16-fp32-states"):
        return None
    return (
        f"regime {p.regime}: load the weights in bf16, AutoModelForCausalLM.from_pretrained(MODEL_ID, "
        "torch_dtype=torch.bfloat16) (dtype= in transformers 4.56+); loaded in fp32, bf16=True only autocasts "
        "(--regime amp, 16+2 bytes per parameter)"
    )


def single_token_floor(p: PlanInput) -> Plan:
    """The job at batch 1, one token, gradient checkpointing on: what no batch or sequence setting can go below
    (weights, gradients, optimizer states, the optimizer step's temporaries, the allocator's reserve, the context)."""
    return plan(replace(p, batch=1, grad_accum=1, seq_len=1, grad_checkpointing=True))


# --- recommendations ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """Settings that fit (``fits`` False when nothing tried does), and the plan they give."""

    fits: bool
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    effective_batch: int
    gradient_checkpointing: bool
    method: str
    lora_r: int | None
    lora_targets: tuple[str, ...]
    max_seq_length: int
    max_seq_length_ceiling: int | None  # the longest sequence that fits with these settings
    zero_stage: int
    gpus: int
    steps: tuple[str, ...]  # what was changed, in the runbook's order
    plan: Plan = field(compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "effective_batch": self.effective_batch,
            "gradient_checkpointing": self.gradient_checkpointing,
            "method": self.method,
            "lora_r": self.lora_r,
            "lora_target_modules": list(self.lora_targets),
            "max_seq_length": self.max_seq_length,
            "max_seq_length_ceiling": self.max_seq_length_ceiling,
            "zero_stage": self.zero_stage,
            "gpus": self.gpus,
            "peak_bytes": self.plan.peak_bytes,
            "steps": list(self.steps),
        }


def _largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest x in [1, hi] with fits(x) (fits is monotone: true up to some x), or 0."""
    if hi < 1 or not fits(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _max_seq(p: PlanInput, limit: int = 1 << 20) -> int:
    return _largest(lambda s: plan(replace(p, seq_len=s)).comfortable, limit)


def recommend(p: PlanInput) -> Recommendation:
    """Settings that fit ``p``'s GPU, in the runbook's order.

    1. the largest ``per_device_train_batch_size`` that divides the effective batch and fits, with
       ``gradient_accumulation_steps`` making up the rest (the effective batch is kept exactly);
    2. then gradient checkpointing; 3. then LoRA (r and targets as given, or peft's defaults), then QLoRA;
    4. if still nothing fits at batch 1: a shorter ``max_seq_length``, then ZeRO-3 over more GPUs (to 64).
    Without a capacity, the input itself is returned as the recommendation.
    """
    base = plan(p)
    per_gpu_batch = p.batch * p.grad_accum  # samples one GPU must see per optimizer step
    steps: list[str] = []

    def fits_at(q: PlanInput, b: int) -> bool:
        return plan(replace(q, batch=b)).comfortable

    def result(q: PlanInput, b: int, fits: bool) -> Recommendation:
        accum = per_gpu_batch // b if b and per_gpu_batch % b == 0 else max(1, math.ceil(per_gpu_batch / max(b, 1)))
        final = replace(q, batch=max(b, 1), grad_accum=accum)
        return Recommendation(
            fits=fits,
            per_device_train_batch_size=final.batch,
            gradient_accumulation_steps=final.grad_accum,
            effective_batch=final.batch * final.grad_accum * final.gpus,
            gradient_checkpointing=final.grad_checkpointing,
            method=final.method,
            lora_r=final.lora_r if final.method != "full" else None,
            lora_targets=tuple(final.model.default_lora_targets if not final.lora_targets else final.lora_targets)
            if final.method != "full"
            else (),
            max_seq_length=final.seq_len,
            max_seq_length_ceiling=_max_seq(final) if p.capacity_bytes is not None else None,
            zero_stage=final.zero_stage,
            gpus=final.gpus,
            steps=tuple(steps),
            plan=plan(final),
        )

    if p.capacity_bytes is None:
        return result(p, p.batch, True)

    def best_batch(q: PlanInput) -> int:
        divisors = [d for d in range(per_gpu_batch, 0, -1) if per_gpu_batch % d == 0]
        for d in divisors:
            if fits_at(q, d):
                return d
        return 0

    if base.comfortable:
        # Fits as asked: the largest batch (dividing the per-GPU samples per step) that still fits.
        b = best_batch(p)
        if b > p.batch:
            steps.append(f"per_device_train_batch_size {p.batch} -> {b} fits (fewer accumulation steps)")
        return result(p, max(b, p.batch), True)

    ladder: list[tuple[str, PlanInput]] = []
    floor = single_token_floor(p)
    if not floor.comfortable:
        steps.append(
            f"{p.method} fine-tuning needs {floor.peak_bytes / 1e9:,.1f} GB with a single token per step (weights, "
            "gradients, optimizer states and the step's temporaries): batch and sequence settings cannot help"
        )
    else:
        ladder.append(("smaller per-device batch with gradient accumulation", p))
        if not p.grad_checkpointing:
            ladder.append(("gradient checkpointing", replace(p, grad_checkpointing=True)))
    if p.method == "full":
        lora = replace(p, method="lora", optimizer="adamw")
        ladder.append(("LoRA", lora))
        ladder.append(("LoRA with gradient checkpointing", replace(lora, grad_checkpointing=True)))
    if p.method != "qlora":
        ladder.append(("QLoRA with gradient checkpointing", replace(p, method="qlora", grad_checkpointing=True)))
    for label, q in ladder:
        b = best_batch(q)
        if b:
            steps.append(label)
            return result(q, b, True)
    # Nothing fits at this sequence length: the longest sequence that fits with the lightest settings tried.
    lightest = ladder[-1][1] if ladder else p
    seq = _max_seq(replace(lightest, batch=1))
    if seq >= min(256, p.seq_len):
        steps.append(f"max_seq_length {p.seq_len} -> {seq} (truncate or drop longer examples)")
        return result(replace(lightest, seq_len=seq), 1, True)
    for gpus in (2, 4, 8, 16, 32, 64):
        q = replace(p, gpus=gpus, zero_stage=3, grad_checkpointing=True)
        b = best_batch(q)
        if b:
            steps.append(f"ZeRO-3 over {gpus} GPUs of this size (or a bigger GPU)")
            return result(q, b, True)
    steps.append("nothing tried fits: a bigger GPU")
    return result(lightest, 1, False)
