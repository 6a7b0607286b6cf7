"""How a plan is shown: the JSON document (``--format json``), the on-call table, and the ready-to-paste snippets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from remediation.train.plan import REGIMES, Plan, Recommendation

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["lora_config_snippet", "model_loading_snippet", "plan_to_dict", "print_plan", "training_arguments_snippet"]

GB = 1000**3
GiB = 1024**3

_COMPONENTS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_states", "optimizer states"),
    ("activations", "activations"),
    ("logits", "logits (loss over the vocabulary)"),
    ("cuda_context", "CUDA context"),
    ("allocator_overhead", "allocator overhead"),
)


def _call(name: str, args: list[tuple[str, Any, str]]) -> str:
    """``name(\\n    key=value,  # comment\\n)`` with every value written by ``repr`` (values cannot inject code)."""
    lines = [f"{name}("]
    for key, value, comment in args:
        line = f"    {key}={value!r},"
        lines.append(f"{line}  # {comment}" if comment else line)
    lines.append(")")
    return "\n".join(lines)


def training_arguments_snippet(rec: Recommendation) -> str:
    p = rec.plan.input
    args: list[tuple[str, Any, str]] = [
        ("per_device_train_batch_size", rec.per_device_train_batch_size, ""),
        ("gradient_accumulation_steps", rec.gradient_accumulation_steps,
         f"effective batch {rec.effective_batch} kept"),
        ("gradient_checkpointing", rec.gradient_checkpointing, ""),
    ]
    if p.regime in ("bf16", "bf16-fp32-states", "mixed", "amp"):
        args.append(("bf16", True, ""))
    if p.optimizer == "adamw-8bit":
        args.append(("optim", "adamw_bnb_8bit", ""))
    elif p.optimizer.startswith("sgd"):
        args.append(("optim", "sgd", ""))
    if rec.zero_stage and rec.gpus > 1:
        args.append(("deepspeed", {"zero_optimization": {"stage": rec.zero_stage}}, f"across {rec.gpus} GPUs"))
    text = "training_args = " + _call("TrainingArguments", args)
    text += (
        f"\nmax_seq_length = {rec.max_seq_length!r}  # pad/truncate every example to it: "
        "tokenizer(..., truncation=True, max_length=max_seq_length)"
    )
    return text


def model_loading_snippet(rec: Recommendation) -> str:
    """How to load the model so that its weights take the bytes the plan counts (MODEL_ID: the user's Hub id)."""
    p = rec.plan.input
    if rec.method == "qlora":
        how = "quantization_config=bnb_config"
        why = "NF4 base; prepare_model_for_kbit_training(model) before get_peft_model"
    elif p.regime in ("bf16", "bf16-fp32-states", "mixed"):
        how = "torch_dtype=torch.bfloat16"
        why = f"--regime {p.regime}: weights in bf16 (dtype= in transformers 4.56+)"
    else:
        how = "torch_dtype=torch.float32"
        why = f"--regime {p.regime}: weights in fp32"
    return (f"# {why}\n# MODEL_ID: your Hub id or local path of {p.model.name}\n"
            f"model = AutoModelForCausalLM.from_pretrained(MODEL_ID, {how})")


def lora_config_snippet(rec: Recommendation) -> str | None:
    if rec.method == "full" or rec.lora_r is None:
        return None
    p = rec.plan.input
    args: list[tuple[str, Any, str]] = [
        ("r", rec.lora_r, ""),
        ("lora_alpha", 2 * rec.lora_r, ""),
        ("target_modules", list(rec.lora_targets), ""),
        ("lora_dropout", p.lora_dropout, ""),
        ("task_type", "CAUSAL_LM", ""),
    ]
    text = ""
    if rec.method == "qlora":
        text = (
            "bnb_config = "
            + _call(
                "BitsAndBytesConfig",
                [("load_in_4bit", True, ""), ("bnb_4bit_quant_type", "nf4", ""),
                 ("bnb_4bit_use_double_quant", True, ""), ("bnb_4bit_compute_dtype", "bfloat16", "")],
            )
            + "\n"
        )
    return text + "lora_config = " + _call("LoraConfig", args)


def plan_to_dict(result: Plan, rec: Recommendation) -> dict[str, Any]:
    """The ``--format json`` document."""
    p = result.input
    m = p.model
    return {
        "model": {
            "name": m.name,
            "source": m.source,
            "hidden_size": m.hidden,
            "layers": m.layers,
            "heads": m.heads,
            "kv_heads": m.kv_heads,
            "intermediate_size": m.intermediate,
            "vocab_size": m.vocab,
            "tied_embeddings": m.tied_embeddings,
        },
        "gpu": {"capacity_bytes": p.capacity_bytes, "source": p.capacity_source},
        "job": {
            "regime": p.regime,
            "regime_description": REGIMES[p.regime].description,
            "optimizer": p.optimizer,
            "fused_optimizer": p.fused_optimizer,
            "method": p.method,
            "lora_r": p.lora_r if p.method != "full" else None,
            "lora_target_modules": list(p.lora_targets or m.default_lora_targets) if p.method != "full" else [],
            "batch": p.batch,
            "seq_len": p.seq_len,
            "gradient_accumulation_steps": p.grad_accum,
            "gradient_checkpointing": p.grad_checkpointing,
            "gpus": p.gpus,
            "zero_stage": p.zero_stage,
            "attention": p.attention,
        },
        "breakdown": dict(result.breakdown),
        "transients": dict(result.transients),
        "phases": dict(result.phases),
        "peak_phase": result.peak_phase,
        "trainable_params": result.trainable_params,
        "total_params": result.total_params,
        "peak_bytes": result.peak_bytes,
        "fits": result.fits,
        "margin_bytes": result.margin_bytes,
        "notes": list(result.notes),
        "recommendation": {
            **rec.to_dict(),
            "model_loading": model_loading_snippet(rec),
            "training_arguments": training_arguments_snippet(rec),
            "lora_config": lora_config_snippet(rec),
        },
    }


def _gb(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / GB:,.2f} GB"


def print_plan(console: Console, result: Plan, rec: Recommendation) -> None:
    """The breakdown table, the verdict, the recommendation and its snippets."""
    from rich.syntax import Syntax
    from rich.table import Table

    p = result.input
    m = p.model
    targets = ",".join(p.lora_targets or m.default_lora_targets)
    method = p.method if p.method == "full" else f"{p.method} r={p.lora_r} {targets}"
    console.print(
        f"[bold]{m.name}[/bold] ({m.source}): {result.total_params:,} parameters, "
        f"{result.trainable_params:,} trainable ({100 * result.trainable_params / result.total_params:.4f}%)",
        highlight=False,
    )
    console.print(
        f"regime [bold]{p.regime}[/bold]: {REGIMES[p.regime].description}; optimizer {p.optimizer}; {method}; "
        f"batch {p.batch} x {p.seq_len} tokens, accumulation {p.grad_accum}, gradient checkpointing "
        f"{'on' if p.grad_checkpointing else 'off'}"
        + (f"; {p.gpus} GPUs ZeRO-{p.zero_stage}" if p.gpus > 1 else ""),
        highlight=False,
    )
    table = Table(title=f"memory per GPU ({p.capacity_source or 'no GPU given'})")
    table.add_column("component")
    table.add_column("bytes", justify="right")
    table.add_column("GB", justify="right")
    table.add_column("GiB", justify="right")
    for key, label in _COMPONENTS:
        value = result.breakdown[key]
        table.add_row(label, f"{value:,}", f"{value / GB:,.2f}", f"{value / GiB:,.2f}")
    for key, value in result.transients.items():
        if value:
            table.add_row(f"[dim]transient: {key.replace('_', ' ')}[/dim]", f"{value:,}", f"{value / GB:,.2f}",
                          f"{value / GiB:,.2f}")
    table.add_section()
    for phase, value in result.phases.items():
        mark = " (peak)" if phase == result.peak_phase else ""
        table.add_row(f"allocated at {phase.replace('_', ' ')}{mark}", f"{value:,}", f"{value / GB:,.2f}",
                      f"{value / GiB:,.2f}")
    table.add_row("[bold]peak, as nvidia-smi shows it[/bold]", f"{result.peak_bytes:,}",
                  f"{result.peak_bytes / GB:,.2f}", f"{result.peak_bytes / GiB:,.2f}")
    if p.capacity_bytes is not None:
        table.add_row("GPU memory", f"{p.capacity_bytes:,}", f"{p.capacity_bytes / GB:,.2f}",
                      f"{p.capacity_bytes / GiB:,.2f}")
    console.print(table)
    if result.fits is None:
        console.print("no GPU capacity given: pass --gpu, --gpu-memory or --from-host for a verdict")
    elif result.fits:
        console.print(f"[green]FITS[/green] with {_gb(result.margin_bytes)} to spare "
                      f"({100 * (result.margin_bytes or 0) / p.capacity_bytes:.1f}% of the GPU)")  # type: ignore[operator]
    else:
        console.print(f"[red]DOES NOT FIT[/red]: {_gb(-(result.margin_bytes or 0))} short")
        if not result.states_fit:
            console.print("model states alone (parameters, gradients, optimizer states) exceed the GPU")
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    console.print()
    verdict = "recommended settings" if rec.fits else "[red]nothing tried fits[/red]; closest settings"
    console.print(f"[bold]{verdict}[/bold] (peak {_gb(rec.plan.peak_bytes)}; longest sequence that fits with them: "
                  f"{rec.max_seq_length_ceiling if rec.max_seq_length_ceiling is not None else '-'} tokens)")
    for step in rec.steps:
        console.print(f"  - {step}", highlight=False)
    console.print(Syntax(model_loading_snippet(rec), "python", theme="ansi_dark", background_color="default"))
    console.print(Syntax(training_arguments_snippet(rec), "python", theme="ansi_dark", background_color="default"))
    lora = lora_config_snippet(rec)
    if lora:
        console.print(Syntax(lora, "python", theme="ansi_dark", background_color="default"))
