"""Model shapes: parameter and LoRA counts exactly as transformers and peft count them.

The real packages build small models from configs (``from_config``: nothing is downloaded) of every family the
planner parses; the planner parses the same ``config.to_dict()`` and must count the same parameters, and the same
trainable LoRA parameters as peft, with ``all - trainable == base``. The full-size figures are checked against the
corpus (tests/fixtures/corpus/memory-dev.md sections 5 and 6).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

from remediation.train.errors import TrainError
from remediation.train.models import BUILTIN, builtin, lora_params, spec_from_config, spec_from_params
from tests.torch_import import torch as import_torch

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the Hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# Section 6 of the corpus: the published parameter counts.
PARAMS = {
    "Llama-2-7b": 6_738_415_616,
    "Llama-2-13b": 13_015_864_320,
    "Llama-2-70b": 68_976_648_192,
    "Llama-3-8B": 8_030_261_248,
    "Llama-3-70B": 70_553_706_496,
    "Llama-3.2-3B": 3_212_749_824,
    "Mistral-7B": 7_241_732_096,
    "Phi-3-mini": 3_821_079_552,
    "Qwen2-7B": 7_615_616_512,
    "Falcon-7B": 6_921_720_704,
    "GPT-2": 124_439_808,
}


@pytest.mark.parametrize(("name", "count"), sorted(PARAMS.items()))
def test_builtin_parameter_counts(name: str, count: int) -> None:
    assert builtin(name).params == count


QV = ("q_proj", "v_proj")
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL = ("all-linear",)


@pytest.mark.parametrize(
    ("model", "r", "targets", "trainable", "total"),
    [
        # the runbook's LoRA: Llama-2-7b, r=16, q_proj+v_proj
        ("Llama-2-7b", 16, QV, 8_388_608, 6_746_804_224),
        ("Llama-2-7b", 8, QV, 4_194_304, 6_742_609_920),
        ("Llama-2-7b", 16, QKVO, 16_777_216, 6_755_192_832),
        ("Llama-2-7b", 16, ALL, 39_976_960, 6_778_392_576),
        ("Llama-2-7b", 64, ALL, 159_907_840, 6_898_323_456),
        ("Llama-3-8B", 16, ALL, 41_943_040, 8_072_204_288),
        ("Llama-3-8B", 8, QV, 3_407_872, 8_033_669_120),
        ("Mistral-7B", 16, QV, 6_815_744, 7_248_547_840),
        ("Llama-3.2-3B", 32, QV, 9_175_040, 3_221_924_864),
        ("Phi-3-mini", 16, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), 25_165_824, None),
        ("Falcon-7B", 16, ("query_key_value",), 4_718_592, None),
        ("GPT-2", 8, ("c_attn",), 294_912, None),
    ],
)
def test_lora_counts_by_formula(
    model: str, r: int, targets: tuple[str, ...], trainable: int, total: int | None
) -> None:
    spec = builtin(model)
    assert lora_params(spec, r, targets) == trainable
    if total is not None:
        assert spec.params + lora_params(spec, r, targets) == total


def test_default_targets_are_peft_defaults() -> None:
    assert builtin("Llama-2-7b").default_lora_targets == QV
    assert builtin("Phi-3-mini").default_lora_targets == ("qkv_proj",)
    assert builtin("Falcon-7B").default_lora_targets == ("query_key_value",)
    assert builtin("GPT-2").default_lora_targets == ("c_attn",)
    assert lora_params(builtin("Llama-2-7b"), 16, ()) == 8_388_608


def test_names_and_errors() -> None:
    assert builtin("meta-llama/Llama-2-7b-hf") is BUILTIN["llama-2-7b"]
    assert builtin("microsoft/Phi-3-mini-4k-instruct").name == "Phi-3-mini"
    with pytest.raises(TrainError, match="built-in table"):
        builtin("llama-9")
    with pytest.raises(TrainError, match=r"matches no module.*q_proj"):
        lora_params(builtin("Llama-2-7b"), 16, ("qkv_proj",))
    with pytest.raises(TrainError, match="not supported"):
        spec_from_config({"model_type": "t5", "d_model": 512})
    with pytest.raises(TrainError, match="whole number"):
        spec_from_config({"model_type": "llama", "hidden_size": "4096"})


def test_config_pitfalls() -> None:
    # Falcon-7b's newer config: num_kv_heads 71 next to multi_query true: multi-query wins (qkv out = h + 2 * 64)
    falcon = spec_from_config(
        {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
         "num_kv_heads": 71, "multi_query": True, "parallel_attn": True, "bias": False, "vocab_size": 65024,
         "new_decoder_architecture": False}
    )
    assert falcon.layer_linears[0].out_features == 4544 + 2 * 64
    assert falcon.params == PARAMS["Falcon-7B"]
    gpt2 = spec_from_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
                             "vocab_size": 50257, "n_inner": None})
    assert gpt2.params == PARAMS["GPT-2"]
    phi3 = spec_from_config({"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32,
                             "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 8192,
                             "vocab_size": 32064, "tie_word_embeddings": False})
    assert phi3.params == PARAMS["Phi-3-mini"]
    assert next(m.name for m in phi3.layer_linears) == "self_attn.qkv_proj"
    qwen = spec_from_config({"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
                             "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                             "vocab_size": 152064, "tie_word_embeddings": False})
    assert qwen.params == PARAMS["Qwen2-7B"]


def test_params_only_model_keeps_the_count() -> None:
    spec = spec_from_params(7_000_000_000)
    assert spec.params == 7_000_000_000
    assert 3000 < spec.hidden < 5000 and 20 < spec.layers < 45


# --- the real transformers and peft on small local configs ----------------------------------------------------

SMALL = {"vocab_size": 1000, "max_position_embeddings": 256}
GATED = {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-gqa": ("llama", {**SMALL, **GATED}),
    "llama-bias": ("llama", {**SMALL, **GATED, "attention_bias": True, "mlp_bias": True}),
    "llama-tied": ("llama", {**SMALL, **GATED, "tie_word_embeddings": True, "head_dim": 32}),
    "mistral": ("mistral", {**SMALL, **GATED}),
    "qwen2": ("qwen2", {**SMALL, **GATED}),
    "qwen3": ("qwen3", {**SMALL, **GATED, "head_dim": 32}),
    "gemma": ("gemma", {**SMALL, **GATED, "num_key_value_heads": 1, "head_dim": 32}),
    "phi3": ("phi3", {**SMALL, **GATED, "num_key_value_heads": 4, "pad_token_id": 0, "eos_token_id": 0,
                      "bos_token_id": 0}),
    "falcon-mqa": ("falcon", {**SMALL, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                              "multi_query": True, "num_kv_heads": 4, "parallel_attn": True, "bias": False,
                              "new_decoder_architecture": False, "bos_token_id": 0, "eos_token_id": 0}),
    "falcon-sequential-bias": ("falcon", {**SMALL, "hidden_size": 64, "num_hidden_layers": 2,
                                          "num_attention_heads": 4, "multi_query": False, "parallel_attn": False,
                                          "bias": True, "new_decoder_architecture": False, "bos_token_id": 0,
                                          "eos_token_id": 0}),
    "falcon-new-arch": ("falcon", {**SMALL, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                   "num_kv_heads": 2, "new_decoder_architecture": True, "bias": False,
                                   "bos_token_id": 0, "eos_token_id": 0}),
    "gpt2": ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 1000,
                      "bos_token_id": 0, "eos_token_id": 0}),
}


def _build(model_type: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    import_torch()
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config, AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_parameter_count_equals_transformers(case: str) -> None:
    model_type, kwargs = CONFIGS[case]
    config, model = _build(model_type, kwargs)
    spec = spec_from_config(config.to_dict(), case)
    assert spec.params == sum(p.numel() for p in model.parameters())
    sizes = sorted(p.numel() for p in model.parameters())
    assert sorted(spec.param_tensors) == sizes  # tensor by tensor (8-bit AdamW keeps small tensors in 32 bits)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_lora_trainable_equals_peft(case: str) -> None:
    from peft import LoraConfig, get_peft_model

    model_type, kwargs = CONFIGS[case]
    config, _ = _build(model_type, kwargs)
    spec = spec_from_config(config.to_dict(), case)
    names = [m.name.rsplit(".", 1)[-1] for m in spec.layer_linears]
    for r, targets in ((4, list(spec.default_lora_targets)), (8, "all-linear"), (2, names[-2:])):
        _, model = _build(model_type, kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = get_peft_model(model, LoraConfig(r=r, target_modules=targets))
        trainable, everything = peft_model.get_nb_trainable_parameters()
        expected = lora_params(spec, r, [targets] if isinstance(targets, str) else targets)
        assert trainable == expected, (case, r, targets)
        assert everything - trainable == spec.params  # all params = base + LoRA


def test_print_trainable_parameters_line(capsys: pytest.CaptureFixture[str]) -> None:
    """What peft prints is what the planner says (the runbook's model.print_trainable_parameters())."""
    from peft import LoraConfig, get_peft_model

    model_type, kwargs = CONFIGS["llama-gqa"]
    config, model = _build(model_type, kwargs)
    spec = spec_from_config(config.to_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"])).print_trainable_parameters()
    trainable = lora_params(spec, 16, QV)
    total = spec.params + trainable
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"trainable params: {trainable:,} || all params: {total:,} || trainable%: ")
