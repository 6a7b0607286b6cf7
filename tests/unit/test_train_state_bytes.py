"""Measured, not estimated: the planner's parameter, gradient and optimizer-state bytes equal the real tensors'.

Small Llama-shaped models are built on the CPU with torch and transformers (``from_config``, nothing downloaded),
trained for one optimizer step in each regime and optimizer that stock torch can build, and the bytes of every
parameter, gradient and optimizer-state tensor are added up (AdamW's ``step`` counters are CPU scalars in torch, not
GPU memory, so they are not state bytes). ``bf16-fp32-states`` (bf16 weights with fp32 AdamW states, no master
copy) and 8-bit AdamW need optimizers stock torch does not have; their bytes come from the same per-dtype rules.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

from remediation.train.models import spec_from_config
from remediation.train.plan import PlanInput, plan
from tests.torch_import import torch as import_torch

os.environ["HF_HUB_OFFLINE"] = "1"

torch = import_torch()
CONFIG = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _model(dtype: Any, **extra: Any) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **CONFIG, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    return config, model


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer(name: str, params: Any) -> Any:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return torch.optim.SGD(params, lr=1e-3)


def _state_bytes(opt: Any) -> int:
    return _nbytes(v for s in opt.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step")


def _batch() -> Any:
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16))
    return {"input_ids": ids, "labels": ids}


def _planned(config: Any, **kw: Any) -> dict[str, int]:
    p = PlanInput(spec_from_config(config.to_dict()), batch=2, seq_len=16, **kw).checked()
    return plan(p).breakdown


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "sgd-momentum"])
@pytest.mark.parametrize("regime", ["fp32", "bf16"])
def test_full_finetune_states(regime: str, optimizer: str) -> None:
    config, model = _model(torch.float32 if regime == "fp32" else torch.bfloat16)
    opt = _optimizer(optimizer, model.parameters())
    model(**_batch()).loss.backward()
    opt.step()
    planned = _planned(config, regime=regime, optimizer=optimizer)
    params = list(model.parameters())
    assert planned["parameters"] == _nbytes(params)
    assert planned["gradients"] == _nbytes(p.grad for p in params)
    assert planned["optimizer_states"] == _state_bytes(opt)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum"])
def test_mixed_precision_with_fp32_master_weights(optimizer: str) -> None:
    """bf16 model and gradients; the optimizer steps fp32 master copies (ZeRO's mixed precision)."""
    config, model = _model(torch.bfloat16)
    params = list(model.parameters())
    master = [p.detach().float().requires_grad_(True) for p in params]
    opt = _optimizer(optimizer, master)
    model(**_batch()).loss.backward()
    for m, p in zip(master, params, strict=True):
        m.grad = p.grad.float()
    opt.step()
    for m, p in zip(master, params, strict=True):
        m.grad = None  # the fp32 gradients live only through the step (the plan's step transient)
        p.data.copy_(m.data)
    planned = _planned(config, regime="mixed", optimizer=optimizer)
    assert planned["parameters"] == _nbytes(params)
    assert planned["gradients"] == _nbytes(p.grad for p in params)
    assert planned["optimizer_states"] == _nbytes(master) + _state_bytes(opt)


def test_amp_keeps_fp32_states() -> None:
    """fp32 model under bf16 autocast: weights, gradients and AdamW states stay fp32."""
    config, model = _model(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**_batch()).loss
    loss.backward()
    opt.step()
    planned = _planned(config, regime="amp", optimizer="adamw")
    params = list(model.parameters())
    assert planned["parameters"] == _nbytes(params)
    assert planned["gradients"] == _nbytes(p.grad for p in params)
    assert planned["optimizer_states"] == _state_bytes(opt)


@pytest.mark.parametrize(("dtype", "regime"), [("bf16", "bf16"), ("fp32", "fp32")])
@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("all-linear",)])
def test_lora_states(dtype: str, regime: str, targets: tuple[str, ...]) -> None:
    """peft upcasts the adapters to fp32; the frozen base costs its weights only."""
    from peft import LoraConfig, get_peft_model

    config, model = _model(torch.bfloat16 if dtype == "bf16" else torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(model, LoraConfig(r=4, target_modules=list(targets) if targets != ("all-linear",)
                                                  else "all-linear", lora_dropout=0.05))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-3)
    model(**_batch()).loss.backward()
    opt.step()
    planned = _planned(config, regime=regime, optimizer="adamw", method="lora", lora_r=4, lora_targets=targets)
    assert planned["parameters"] == _nbytes(model.parameters())
    assert planned["gradients"] == _nbytes(p.grad for p in model.parameters() if p.grad is not None)
    assert planned["optimizer_states"] == _state_bytes(opt)
