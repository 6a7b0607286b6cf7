"""Model shapes for the planner: what a model's parameters are, module by module.

A :class:`ModelSpec` lists one transformer layer's linear modules (with their qualified names, as peft sees them),
the layer's norm parameters, the embeddings and the head. From that list come, exactly as transformers and peft
count them:

- the parameter count (``sum(p.numel() for p in model.parameters())``; tied embeddings counted once);
- the LoRA trainable count: ``r * (in + out)`` for every targeted linear module (a fused module such as Phi-3's
  ``qkv_proj`` is one module: its A matrix is shared), a target matching a module whose qualified name equals it or
  ends with ``.<target>`` (peft's rule), ``all-linear`` meaning every linear module but the output head.

Three ways in: :data:`BUILTIN` (``--model NAME``), :func:`spec_from_config` (a Hugging Face ``config.json``, parsed
offline, with the pitfalls of fused and multi-query models), :func:`spec_from_params` (``--params N``: a Llama-shaped
model of about that size, for when only the count is known).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from remediation.train.errors import TrainError

__all__ = [
    "BUILTIN",
    "FAMILIES",
    "Linear",
    "ModelSpec",
    "builtin",
    "load_config",
    "lora_params",
    "spec_from_config",
    "spec_from_params",
    "substitution",
]

#: Activation families (how a layer's saved tensors are counted, see :mod:`remediation.train.plan`).
FAMILIES = ("gated", "falcon", "gpt2")


@dataclass(frozen=True)
class Linear:
    """One linear (or GPT-2 ``Conv1D``) module of a layer, named as peft matches it (``self_attn.q_proj``)."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, shaped enough to count its parameters and its activations."""

    name: str
    family: str  # one of FAMILIES
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # MLP hidden width (gated: per branch)
    vocab: int
    max_positions: int
    tied_embeddings: bool
    layer_linears: tuple[Linear, ...]
    layer_norm_tensors: tuple[int, ...]  # sizes of one layer's norm weights (and biases)
    embedding_params: int  # token embeddings, plus learned position embeddings where the model has them
    final_norm_tensors: tuple[int, ...]
    default_lora_targets: tuple[str, ...]
    source: str = "built-in"  # built-in | config FILE | --params N
    dropout: float = 0.0  # activation dropout in the layer (GPT-2: 0.1)

    @property
    def head_params(self) -> int:
        """The output head's own parameters (0 when it is tied to the input embeddings)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def layer_norm_params(self) -> int:
        return sum(self.layer_norm_tensors)

    @property
    def final_norm_params(self) -> int:
        return sum(self.final_norm_tensors)

    @property
    def layer_params(self) -> int:
        return sum(m.params for m in self.layer_linears) + self.layer_norm_params

    @property
    def params(self) -> int:
        """Every parameter, tied embeddings counted once (what ``model.parameters()`` yields)."""
        return self.embedding_params + self.layers * self.layer_params + self.final_norm_params + self.head_params

    @property
    def linear_params(self) -> int:
        """Parameters of the layers' linear modules (what 4-bit quantization packs)."""
        return self.layers * sum(m.params for m in self.layer_linears)

    @property
    def largest_linear(self) -> int:
        return max(m.params for m in self.layer_linears)

    @property
    def param_tensors(self) -> tuple[int, ...]:
        """The sizes of every parameter tensor (weights and biases apart), as an optimizer sees them."""
        per_layer: list[int] = []
        for m in self.layer_linears:
            per_layer.append(m.in_features * m.out_features)
            if m.bias:
                per_layer.append(m.out_features)
        sizes = [self.vocab * self.hidden]
        if self.embedding_params != self.vocab * self.hidden:
            sizes.append(self.embedding_params - self.vocab * self.hidden)  # learned positions (or --params' rest)
        for _ in range(self.layers):
            sizes.extend(per_layer)
            sizes.extend(self.layer_norm_tensors)
        sizes.extend(self.final_norm_tensors)
        if not self.tied_embeddings:
            sizes.append(self.vocab * self.hidden)
        return tuple(sizes)

    def linear_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.layer_linears)

    def lora_modules(self, targets: Sequence[str]) -> tuple[Linear, ...]:
        """The layer's modules that ``target_modules=targets`` adapts; raises for a target that matches none."""
        wanted = list(targets) or list(self.default_lora_targets)
        if any(t in ("all-linear", "all_linear") for t in wanted):
            return self.layer_linears
        chosen: list[Linear] = []
        for target in wanted:
            hits = [m for m in self.layer_linears if m.name == target or m.name.endswith("." + target)]
            if not hits:
                names = ", ".join(n.rsplit(".", 1)[-1] for n in self.linear_names())
                raise TrainError(
                    f"--lora-targets {target!r} matches no module of {self.name} (its linear modules: {names}; "
                    "or all-linear)"
                )
            chosen.extend(m for m in hits if m not in chosen)
        return tuple(chosen)


def lora_params(spec: ModelSpec, r: int, targets: Sequence[str]) -> int:
    """Trainable LoRA parameters (``bias="none"``, no ``modules_to_save``): what peft prints as trainable."""
    if r < 1:
        raise TrainError(f"--lora-r {r} must be at least 1")
    return spec.layers * sum(r * (m.in_features + m.out_features) for m in spec.lora_modules(targets))


# --- families -------------------------------------------------------------------------------------------------


def gated(
    name: str,
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    max_positions: int,
    tied: bool,
    head_dim: int | None = None,
    qkv_bias: bool = False,
    o_bias: bool = False,
    mlp_bias: bool = False,
    fused: bool = False,
    qk_norm: bool = False,
    norms_per_layer: int = 2,
    source: str = "built-in",
) -> ModelSpec:
    """Llama-style blocks (Llama, Mistral, Qwen2/3, Gemma; Phi-3 with ``fused``): RMSNorm, RoPE, GQA, gated MLP."""
    hd = head_dim or hidden // heads
    q, kv = heads * hd, kv_heads * hd
    if fused:  # Phi-3: one qkv_proj and one gate_up_proj
        linears: tuple[Linear, ...] = (
            Linear("self_attn.qkv_proj", hidden, q + 2 * kv, qkv_bias),
            Linear("self_attn.o_proj", q, hidden, o_bias),
            Linear("mlp.gate_up_proj", hidden, 2 * intermediate, mlp_bias),
            Linear("mlp.down_proj", intermediate, hidden, mlp_bias),
        )
        default: tuple[str, ...] = ("qkv_proj",)
    else:
        linears = (
            Linear("self_attn.q_proj", hidden, q, qkv_bias),
            Linear("self_attn.k_proj", hidden, kv, qkv_bias),
            Linear("self_attn.v_proj", hidden, kv, qkv_bias),
            Linear("self_attn.o_proj", q, hidden, o_bias),
            Linear("mlp.gate_proj", hidden, intermediate, mlp_bias),
            Linear("mlp.up_proj", hidden, intermediate, mlp_bias),
            Linear("mlp.down_proj", intermediate, hidden, mlp_bias),
        )
        default = ("q_proj", "v_proj")
    return ModelSpec(
        name=name,
        family="gated",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hd,
        intermediate=intermediate,
        vocab=vocab,
        max_positions=max_positions,
        tied_embeddings=tied,
        layer_linears=linears,
        layer_norm_tensors=(hidden,) * norms_per_layer + ((hd, hd) if qk_norm else ()),
        embedding_params=vocab * hidden,
        final_norm_tensors=(hidden,),
        default_lora_targets=default,
        source=source,
    )


def falcon(
    name: str,
    *,
    hidden: int,
    layers: int,
    heads: int,
    vocab: int,
    max_positions: int,
    kv_heads: int,
    new_decoder_architecture: bool = False,
    parallel_attn: bool = True,
    bias: bool = False,
    ffn_hidden: int | None = None,
    tied: bool = True,
    layer_norms: int | None = None,
    source: str = "built-in",
) -> ModelSpec:
    """Falcon: fused ``query_key_value`` (multi-query: one K/V head), GeLU MLP, LayerNorm with bias."""
    hd = hidden // heads
    ffn = ffn_hidden or 4 * hidden
    qkv_out = (heads + 2 * kv_heads) * hd
    if layer_norms is None:
        layer_norms = 2 if (new_decoder_architecture or not parallel_attn) else 1
    linears = (
        Linear("self_attention.query_key_value", hidden, qkv_out, bias),
        Linear("self_attention.dense", hidden, hidden, bias),
        Linear("mlp.dense_h_to_4h", hidden, ffn, bias),
        Linear("mlp.dense_4h_to_h", ffn, hidden, bias),
    )
    return ModelSpec(
        name=name,
        family="falcon",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hd,
        intermediate=ffn,
        vocab=vocab,
        max_positions=max_positions,
        tied_embeddings=tied,
        layer_linears=linears,
        layer_norm_tensors=(hidden,) * (2 * layer_norms),
        embedding_params=vocab * hidden,
        final_norm_tensors=(hidden, hidden),
        default_lora_targets=("query_key_value",),
        source=source,
    )


def gpt2(
    name: str,
    *,
    hidden: int,
    layers: int,
    heads: int,
    vocab: int,
    max_positions: int,
    inner: int | None = None,
    dropout: float = 0.1,
    source: str = "built-in",
) -> ModelSpec:
    """GPT-2: ``Conv1D`` modules with biases, learned position embeddings, LayerNorm, tied head."""
    ffn = inner or 4 * hidden
    linears = (
        Linear("attn.c_attn", hidden, 3 * hidden, True),
        Linear("attn.c_proj", hidden, hidden, True),
        Linear("mlp.c_fc", hidden, ffn, True),
        Linear("mlp.c_proj", ffn, hidden, True),
    )
    return ModelSpec(
        name=name,
        family="gpt2",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=ffn,
        vocab=vocab,
        max_positions=max_positions,
        tied_embeddings=True,
        layer_linears=linears,
        layer_norm_tensors=(hidden,) * 4,
        embedding_params=vocab * hidden + max_positions * hidden,
        final_norm_tensors=(hidden, hidden),
        default_lora_targets=("c_attn",),
        source=source,
        dropout=dropout,
    )


# --- the built-in table ---------------------------------------------------------------------------------------

_BUILTIN_SPECS: tuple[ModelSpec, ...] = (
    gated("Llama-2-7b", hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, vocab=32000,
          max_positions=4096, tied=False),
    gated("Llama-2-13b", hidden=5120, layers=40, heads=40, kv_heads=40, intermediate=13824, vocab=32000,
          max_positions=4096, tied=False),
    gated("Llama-2-70b", hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672, vocab=32000,
          max_positions=4096, tied=False),
    gated("Llama-3-8B", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256,
          max_positions=8192, tied=False),
    gated("Llama-3-70B", hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672, vocab=128256,
          max_positions=8192, tied=False),
    gated("Llama-3.2-1B", hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256,
          max_positions=131072, tied=True, head_dim=64),
    gated("Llama-3.2-3B", hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, vocab=128256,
          max_positions=131072, tied=True, head_dim=128),
    gated("Mistral-7B", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=32000,
          max_positions=32768, tied=False),
    gated("Phi-3-mini", hidden=3072, layers=32, heads=32, kv_heads=32, intermediate=8192, vocab=32064,
          max_positions=4096, tied=False, fused=True),
    gated("Qwen2-7B", hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064,
          max_positions=131072, tied=False, qkv_bias=True),
    gated("Gemma-2b", hidden=2048, layers=18, heads=8, kv_heads=1, intermediate=16384, vocab=256000,
          max_positions=8192, tied=True, head_dim=256),
    gated("Gemma-7b", hidden=3072, layers=28, heads=16, kv_heads=16, intermediate=24576, vocab=256000,
          max_positions=8192, tied=True, head_dim=256),
    falcon("Falcon-7B", hidden=4544, layers=32, heads=71, kv_heads=1, vocab=65024, max_positions=2048),
    gpt2("GPT-2", hidden=768, layers=12, heads=12, vocab=50257, max_positions=1024),
)

#: ``--model`` names (case-insensitive; ``meta-llama/Llama-2-7b-hf`` style Hub ids also accepted).
BUILTIN: dict[str, ModelSpec] = {s.name.lower(): s for s in _BUILTIN_SPECS}

_ALIASES = {
    "llama-2-7b-hf": "llama-2-7b",
    "llama-2-13b-hf": "llama-2-13b",
    "llama-2-70b-hf": "llama-2-70b",
    "meta-llama-3-8b": "llama-3-8b",
    "llama-3.1-8b": "llama-3-8b",
    "meta-llama-3-70b": "llama-3-70b",
    "llama-3.1-70b": "llama-3-70b",
    "mistral-7b-v0.1": "mistral-7b",
    "phi-3-mini-4k-instruct": "phi-3-mini",
    "falcon-7b": "falcon-7b",
    "gpt2": "gpt-2",
    "gemma-2b": "gemma-2b",
    "gemma-7b": "gemma-7b",
}


#: Names the table reads as another model of the same shapes (what differs, for the note).
_SUBSTITUTED = {
    "llama-3.1-8b": "same layers and parameter count, but 8192 positions here, not Llama-3.1's 131072",
    "llama-3.1-70b": "same layers and parameter count, but 8192 positions here, not Llama-3.1's 131072",
}


def substitution(name: str) -> str | None:
    """A note when ``--model name`` is planned as a built-in model of another name (Llama-3.1-8B -> Llama-3-8B)."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    spec = builtin(name)
    if re.sub(r"-hf$", "", key) == spec.name.lower():
        return None
    why = _SUBSTITUTED.get(re.sub(r"-(instruct|chat|hf)$", "", key))
    return f"--model {name} is planned as the built-in {spec.name}" + (f" ({why})" if why else "")


def builtin(name: str) -> ModelSpec:
    """The built-in model called ``name`` (``Llama-2-7b``, ``meta-llama/Llama-2-7b-hf``, ...)."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = _ALIASES.get(key, key)
    key = re.sub(r"-(instruct|chat|hf)$", "", key)
    key = _ALIASES.get(key, key)
    if key in BUILTIN:
        return BUILTIN[key]
    names = ", ".join(s.name for s in _BUILTIN_SPECS)
    raise TrainError(
        f"--model {name!r} is not in the built-in table ({names}); pass --config config.json or --params N"
    )


# --- Hugging Face config.json ---------------------------------------------------------------------------------

_GATED_TYPES = {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"}


def load_config(path: str | Path) -> dict[str, Any]:
    """A ``config.json`` as a mapping; raises :class:`TrainError` naming the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise TrainError(f"--config {path}: cannot read it ({exc.strerror}); pass a Hugging Face config.json") from None
    except ValueError as exc:
        raise TrainError(f"--config {path}: not JSON ({exc}); pass a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise TrainError(f"--config {path}: a JSON object is expected, got {type(data).__name__}")
    return data


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 0:
            raise TrainError(f"config key {key!r} must be a whole number, got {value!r}")
        return int(value)
    if default is not None:
        return default
    raise TrainError(f"config has no {' / '.join(repr(k) for k in keys)}: is it a Hugging Face config.json?")


def spec_from_config(cfg: Mapping[str, Any], name: str = "config") -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face config mapping (no download, no transformers import)."""
    model_type = str(cfg.get("model_type") or "").lower()
    src = f"config {name}"
    if model_type in _GATED_TYPES:
        hidden = _int(cfg, "hidden_size")
        heads = _int(cfg, "num_attention_heads")
        attention_bias = bool(cfg.get("attention_bias", False))
        qkv_bias = model_type == "qwen2" or attention_bias
        tied_default = model_type == "gemma"
        return gated(
            name,
            hidden=hidden,
            layers=_int(cfg, "num_hidden_layers"),
            heads=heads,
            kv_heads=_int(cfg, "num_key_value_heads", default=heads),
            intermediate=_int(cfg, "intermediate_size"),
            vocab=_int(cfg, "vocab_size"),
            max_positions=_int(cfg, "max_position_embeddings", default=0),
            tied=bool(cfg.get("tie_word_embeddings", tied_default)),
            head_dim=_int(cfg, "head_dim", default=0) or None,
            qkv_bias=qkv_bias,
            o_bias=attention_bias and model_type not in ("qwen2",),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            fused=model_type == "phi3",
            qk_norm=model_type == "qwen3",
            source=src,
        )
    if model_type in ("falcon", "refinedweb", "refinedwebmodel", "rw"):
        hidden = _int(cfg, "hidden_size", "n_embd")
        heads = _int(cfg, "num_attention_heads", "n_head")
        new_arch = bool(cfg.get("new_decoder_architecture", False))
        if new_arch:
            kv = _int(cfg, "num_kv_heads", "n_head_kv", default=heads)
        elif bool(cfg.get("multi_query", True)):
            kv = 1  # multi-query wins over a num_kv_heads key in old-architecture configs
        else:
            kv = heads
        parallel = bool(cfg.get("parallel_attn", True))
        norms = None
        if new_arch:
            norms = 2 if int(cfg.get("num_ln_in_parallel_attn") or 2) == 2 else 1
        return falcon(
            name,
            hidden=hidden,
            layers=_int(cfg, "num_hidden_layers", "n_layer"),
            heads=heads,
            vocab=_int(cfg, "vocab_size"),
            max_positions=_int(cfg, "max_position_embeddings", default=2048),
            kv_heads=kv,
            new_decoder_architecture=new_arch,
            parallel_attn=parallel,
            bias=bool(cfg.get("bias", False)),
            ffn_hidden=_int(cfg, "ffn_hidden_size", default=0) or None,
            tied=bool(cfg.get("tie_word_embeddings", True)),
            layer_norms=norms,
            source=src,
        )
    if model_type == "gpt2":
        return gpt2(
            name,
            hidden=_int(cfg, "n_embd", "hidden_size"),
            layers=_int(cfg, "n_layer", "num_hidden_layers"),
            heads=_int(cfg, "n_head", "num_attention_heads"),
            vocab=_int(cfg, "vocab_size"),
            max_positions=_int(cfg, "n_positions", "max_position_embeddings"),
            inner=_int(cfg, "n_inner", default=0) or None,
            dropout=float(cfg.get("resid_pdrop", 0.1) or 0.0),
            source=src,
        )
    known = ", ".join(sorted(_GATED_TYPES | {"falcon", "gpt2"}))
    raise TrainError(
        f"config model_type {model_type or '(none)'!r} is not supported (supported: {known}); "
        "pass --params N for a Llama-shaped estimate"
    )


# --- --params N -----------------------------------------------------------------------------------------------


def spec_from_params(count: int, vocab: int = 32000) -> ModelSpec:
    """A Llama-shaped model of about ``count`` parameters (hidden size grown in steps of 128 with depth).

    Only the count is known: the shapes follow the Llama-2 family's proportions (layers ~ hidden / 128,
    intermediate ~ 2.7 x hidden, 128-wide heads). The parameter count reported is the one asked for; the shapes
    drive the activation estimate and are shown as an assumption.
    """
    if count < 1_000_000:
        raise TrainError(f"--params {count} is too small for a transformer; pass the parameter count, e.g. 7e9")
    best: ModelSpec | None = None
    for hidden in range(512, 16385, 128):
        layers = max(2, round(hidden / 128))
        inter = int(math.ceil(hidden * 2.6875 / 256) * 256)
        spec = gated(
            f"{count / 1e9:.3g}B (Llama-shaped)",
            hidden=hidden,
            layers=layers,
            heads=max(1, hidden // 128),
            kv_heads=max(1, hidden // 128),
            intermediate=inter,
            vocab=vocab,
            max_positions=4096,
            tied=False,
            head_dim=128,
            source=f"--params {count}",
        )
        if best is None or abs(spec.params - count) < abs(best.params - count):
            best = spec
    assert best is not None
    # Make the count exact by attributing the difference to the embeddings (shapes stay as estimated).
    return replace(best, embedding_params=best.embedding_params + (count - best.params))
