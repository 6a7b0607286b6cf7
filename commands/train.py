"""``invoke train.*``: the training-memory planner, the OOM diagnoser, GPU memory logging (runbook S2)."""

from __future__ import annotations

import math
import sys
from typing import Any

from invoke import Collection, Exit, task

from commands import (
    FLEET_HELP,
    NumbersTask,
    audit_options,
    edge,
    fleet_hosts,
    format_help,
    formats,
    read_input,
    settings,
)
from remediation.core.exitcodes import ExitCode

JOB_HELP = {
    "model": "built-in model: Llama-2-7b/13b/70b, Llama-3-8B/70B, Llama-3.2-1B/3B, Mistral-7B, Phi-3-mini, "
    "Qwen2-7B, Gemma-2b/7b, Falcon-7B, GPT-2",
    "config": "a Hugging Face config.json (read offline)",
    "params": "only a parameter count (7e9, 7B): a Llama-shaped estimate",
    "gpu": "GPU model: A100-80GB, A100-40GB, H100-80GB, H100-NVL, H200, A10, A10G, L4, L40S, T4, V100-16GB, ... "
    "(default train.gpu)",
    "gpu_memory": "GPU memory instead of a model, with a unit: 80GB, 80GiB, 80G, 24564MiB (a bare number is refused)",
    "regime": "bf16 (8 B/param) | bf16-fp32-states (12: the runbook's) | mixed (16) | amp (16+2) | fp32 (16)",
    "optimizer": "adamw | adamw-8bit | sgd | sgd-momentum",
    "fused": "AdamW with fused=True (no copy of v during the step)",
    "method": "full | lora | qlora",
    "lora_r": "LoRA rank, a whole number (default train.lora_r)",
    "lora_targets": "LoRA target modules, comma-separated (q_proj,v_proj; all-linear); default: peft's for the model",
    "lora_dropout": "LoRA dropout, a number from 0 to 1 (default train.lora_dropout)",
    "batch": "per_device_train_batch_size, a whole number (default 1)",
    "seq_len": "tokens per sequence (the longest the job will see), a whole number (default 2048)",
    "grad_accum": "gradient_accumulation_steps, a whole number (default 1)",
    "grad_checkpointing": "gradient checkpointing on",
    "gpus": "GPUs the job runs on (data parallel), a whole number (default 1)",
    "zero_stage": "ZeRO stage across --gpus (2 or more): 0 (none, default), 1 (optimizer states), 2 (+gradients), "
    "3 (+parameters)",
    "attention": "flash (FlashAttention/SDPA, default) | eager (s^2 attention scores)",
}
#: The job flags that are whole numbers: INT in the help (:class:`commands.NumbersTask`), typed by :func:`job_flags`.
WHOLE_NUMBERS = ("lora_r", "batch", "seq_len", "grad_accum", "gpus", "zero_stage")


def typed_number(flag: str, value: Any, kind: type) -> Any:
    """A flag's string as a finite ``kind`` (int: a whole number), or one line naming the flag (exit 2)."""
    from remediation.core.errors import UsageError

    try:
        if isinstance(value, bool):
            raise ValueError(value)
        got = kind(str(value).strip())
        if not math.isfinite(got):
            raise ValueError(value)
        return got
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{flag} {value!r}: give {'a whole number' if kind is int else 'a number'}") from None


def job_flags(**flags: Any) -> Any:
    """:class:`~remediation.train.api.JobFlags` from the task's flags (strings from the command line typed here)."""
    from remediation.train.api import JobFlags

    def number(name: str, kind: type, default: Any) -> Any:
        value = flags.get(name)
        return default if value is None else typed_number(f"--{name.replace('_', '-')}", value, kind)

    targets = str(flags.get("lora_targets") or "")
    return JobFlags(
        model=flags.get("model"),
        config=flags.get("config"),
        params=flags.get("params"),
        gpu=flags.get("gpu"),
        gpu_memory=flags.get("gpu_memory"),
        regime=flags.get("regime"),
        optimizer=flags.get("optimizer"),
        fused_optimizer=bool(flags.get("fused")),
        method=str(flags.get("method") or "full"),
        lora_r=number("lora_r", int, None),
        lora_targets=tuple(t.strip() for t in targets.split(",") if t.strip()),
        lora_dropout=number("lora_dropout", float, None),
        batch=number("batch", int, 1),
        seq_len=number("seq_len", int, 2048),
        grad_accum=number("grad_accum", int, 1),
        grad_checkpointing=bool(flags.get("grad_checkpointing")),
        gpus=number("gpus", int, 1),
        zero_stage=number("zero_stage", int, 0),
        attention=str(flags.get("attention") or "flash"),
    )


@task(
    klass=NumbersTask,
    numbers=WHOLE_NUMBERS,
    help={
        **JOB_HELP,
        "from_host": "read the GPU capacity from this host's NVML facts (one audit probe, read-only)",
        "fleet": FLEET_HELP["fleet"],
        "inventory": FLEET_HELP["inventory"],
        "format": format_help("table", "json"),
    }
)
@edge
@formats("table", "json")
def plan(  # type: ignore[no-untyped-def]
    c,
    model=None,
    config=None,
    params=None,
    gpu=None,
    gpu_memory=None,
    from_host=None,
    fleet="gpu",
    inventory=None,
    regime=None,
    optimizer=None,
    fused=False,
    method="full",
    lora_r=None,
    lora_targets=None,
    lora_dropout=None,
    batch=None,
    seq_len=None,
    grad_accum=None,
    grad_checkpointing=False,
    gpus=None,
    zero_stage=None,
    attention="flash",
    format="table",
):
    """Plan a fine-tuning job's GPU memory: breakdown, fits or not, settings that fit (ready to paste).

    Exit codes: 0 the job fits as given; 1 it does not (the recommendation says what does); 2 bad input.
    """
    import json

    from remediation.core.errors import UsageError
    from remediation.train.api import TrainSettings, capacity_from_host, plan_job, plan_to_dict, print_plan

    if format not in ("table", "json"):
        raise UsageError(f"--format {format!r} must be table or json")
    given = dict(locals())
    flags = job_flags(**{k: v for k, v in given.items() if k in JOB_HELP or k == "fused"})
    cfg = settings(c, TrainSettings, "train")
    capacity = None
    if from_host:
        if gpu or gpu_memory:
            raise UsageError("pass one of --gpu, --gpu-memory and --from-host")
        hosts, _path, _group = fleet_hosts(c, fleet, inventory, from_host)
        if len(hosts) != 1:
            raise UsageError(
                f"--from-host {from_host!r} must name exactly one host of fleet {fleet} ({len(hosts)} match)"
            )
        capacity = capacity_from_host(hosts[0], audit_options(c))
    result, rec = plan_job(cfg, flags, capacity)
    if format == "json":
        print(json.dumps(plan_to_dict(result, rec), indent=2))
    else:
        from remediation.report.console import console

        print_plan(console, result, rec)
    raise Exit(code=ExitCode.OK if result.fits in (True, None) else ExitCode.FINDINGS)


@task(
    klass=NumbersTask,
    numbers=WHOLE_NUMBERS,
    name="diagnose-oom",
    positional=["file"],
    help={
        "file": "text with the OOM message (a training log, a traceback, a pasted issue); - or nothing for stdin",
        "format": format_help("text", "json"),
        **{k: f"(plan) {v}" for k, v in JOB_HELP.items()},
    },
)
@edge
@formats("text", "json")
def diagnose_oom(  # type: ignore[no-untyped-def]
    c,
    file=None,
    format="text",
    model=None,
    config=None,
    params=None,
    gpu=None,
    gpu_memory=None,
    regime=None,
    optimizer=None,
    fused=False,
    method="full",
    lora_r=None,
    lora_targets=None,
    lora_dropout=None,
    batch=None,
    seq_len=None,
    grad_accum=None,
    grad_checkpointing=False,
    gpus=None,
    zero_stage=None,
    attention="flash",
):
    """Read a PyTorch/ROCm OOM: its numbers, the cause, the fix; with --model etc. the planner's numbers.

    Exit codes: 0 no OOM message in the text; 1 an OOM diagnosed; 2 bad input.
    """
    import json

    from remediation.core.errors import UsageError
    from remediation.host.api import DiagnoseResult, render_text
    from remediation.train.api import TrainSettings
    from remediation.train.api import diagnose_oom as run

    if format not in ("text", "json"):
        raise UsageError(f"--format {format!r} must be text or json")
    given = dict(locals())
    flags = job_flags(**{k: v for k, v in given.items() if k in JOB_HELP or k == "fused"})
    cfg = settings(c, TrainSettings, "train")
    text, source = read_input(file or "-")
    result = run(text, cfg, flags, source=source)
    if format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        if not result.found:
            print("no PyTorch/ROCm out-of-memory message in the text")
        else:
            print(render_text(DiagnoseResult("oom", result.facts, result.findings)))
    raise Exit(code=ExitCode.FINDINGS if result.found else ExitCode.OK)


@task(
    klass=NumbersTask,
    numbers=("count",),
    help={
        "host": "the host to sample (a name from the fleet's inventory)",
        "fleet": FLEET_HELP["fleet"],
        "inventory": FLEET_HELP["inventory"],
        "interval": "seconds between samples, a number (default train.monitor_interval, 5)",
        "count": "samples to take, a whole number (default train.monitor_count)",
        "duration": "seconds to sample for (a number), instead of --count",
        "out": "append the CSV here (default: stdout)",
    }
)
@edge
def monitor(  # type: ignore[no-untyped-def]
    c, host, fleet="gpu", inventory=None, interval=None, count=None, duration=None, out=None
):
    """Log GPU memory used/free and utilization through NVML on a host to CSV (nvidia-smi -l without nvidia-smi).

    Exit codes: 0 every sample read; 1 NVML failed on the host; 2 bad input; 3 the host could not be reached.
    """
    from pathlib import Path

    from remediation.core.errors import UsageError
    from remediation.train.api import TrainSettings
    from remediation.train.api import monitor as run
    from remediation.transport.fanout import Status

    cfg = settings(c, TrainSettings, "train")
    every = float(typed_number("--interval", interval, float)) if interval is not None else float(cfg.monitor_interval)
    if duration is not None and count is not None:
        raise UsageError("pass --count or --duration, not both")
    if count is not None:
        times = typed_number("--count", count, int)
    elif duration is not None:
        times = max(1, int(typed_number("--duration", duration, float) // every) + 1) if every > 0 else 1
    else:
        times = cfg.monitor_count
    hosts, _path, _group = fleet_hosts(c, fleet, inventory, host)
    if len(hosts) != 1:
        raise UsageError(f"--host {host!r} must name exactly one host of fleet {fleet} ({len(hosts)} match)")

    def progress(rows: list[Any]) -> None:
        if out:
            used = ", ".join(f"GPU {r.gpu} {r.memory_used_mib} MiB" for r in rows[-max(1, len({r.gpu for r in rows})):])
            print(f"{hosts[0].name}: {len(rows)} rows; last {used}", file=sys.stderr)

    path = Path(out) if out else None
    new = path is None or not path.exists() or path.stat().st_size == 0
    stream = path.open("a") if path is not None else sys.stdout
    try:
        result = run(
            hosts[0],
            interval=every,
            count=times,
            out=stream,
            max_seconds=cfg.monitor_max_seconds,
            chunk_seconds=cfg.monitor_chunk_seconds,
            connect_timeout=cfg.connect_timeout,
            on_chunk=progress,
            header=new,
        )
    finally:
        if path is not None:
            stream.close()
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
    if result.status in (Status.UNREACHABLE, Status.TIMED_OUT) and not result.samples:
        raise Exit(code=ExitCode.UNREACHABLE)
    raise Exit(code=ExitCode.OK if result.ok else ExitCode.FINDINGS)


ns: Any = Collection("train", plan, diagnose_oom, monitor)
