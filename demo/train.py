"""Scene S2: CUDA out of memory mid fine-tuning, the way on-call meets it.

1. the plan the runbook asks for before starting (7B, bf16 weights and gradients, fp32 Adam states: 14 + 14 + 56 GB
   plus activations on an 80 GB A100): it does not fit; the settings that do, ready to paste;
2. the LoRA job that was planned for 512-token sequences dies after 500 good steps with the runbook's OOM message:
   ``train.diagnose-oom`` reads the numbers, and with the plan says longer sequences arrived (max_seq_length);
3. a log with OOMs at varying steps and a fragmented cache (``invoke diagnose``, kind ``oom``);
4. GPU memory logging on a lab host (``train.monitor``): the ``memory-full`` fault shows in the CSV.

Offline: the planner and the parser are pure; step 4 uses the demo's lab (started if needed, cached base).
"""

from __future__ import annotations

import io

from rich.rule import Rule

from demo import Scene, SceneContext
from remediation.host.diagnose import diagnose
from remediation.train.api import JobFlags, diagnose_oom, plan_job
from remediation.train.render import print_plan
from remediation.train.settings import TrainSettings

RUNBOOK_OOM = """\
RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB
(GPU 0; 79.15 GiB total capacity; 77.42 GiB already allocated;
1.08 GiB free; 78.50 GiB reserved in total by PyTorch)
"""


def _oom_2_2(requested: str, free: str, in_use: str, allocated: str, unallocated: str) -> str:
    """A PyTorch 2.2+ OOM message (format D) with these sizes."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {requested}. GPU 0 has a total capacity of "
        f"79.15 GiB of which {free} is free. Including non-PyTorch memory, this process has {in_use} memory in use. "
        f"Of the allocated memory {allocated} is allocated by PyTorch, and {unallocated} is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


VARYING_LOG = "\n".join(
    [
        "{'loss': 1.412, 'learning_rate': 1.9e-05, 'epoch': 0.31}",
        " 16%|█▌        | 512/3200 [11:02<57:51,  1.29s/it]",
        _oom_2_2("3.10 GiB", "1.98 GiB", "77.15 GiB", "61.25 GiB", "15.40 GiB"),
        "resuming from checkpoint-500",
        " 23%|██▎       | 733/3200 [16:40<52:10,  1.27s/it]",
        _oom_2_2("2.75 GiB", "1.21 GiB", "77.92 GiB", "60.80 GiB", "16.62 GiB"),
    ]
)

HOST = "gpu-1"


def _findings(console: object, findings: object) -> None:
    for f in findings:  # type: ignore[attr-defined]
        console.print(f"  [{f.severity.value.upper()}] {f.id}: {f.summary}", markup=False)  # type: ignore[attr-defined]
        console.print(f"      remedy: {f.remedy}", markup=False)  # type: ignore[attr-defined]


def run(ctx: SceneContext) -> bool:
    console = ctx.console
    settings = TrainSettings()
    ok = True

    console.print(Rule("1. before starting: invoke train.plan --params 7e9 --regime runbook --batch 8 --seq-len 2048"))
    job = JobFlags(params="7e9", regime="bf16-fp32-states", gpu="A100-80GB", batch=8, seq_len=2048)
    result, rec = plan_job(settings, job)
    print_plan(console, result, rec)
    b = result.breakdown
    ok &= (b["parameters"], b["gradients"], b["optimizer_states"]) == (14 * 10**9, 14 * 10**9, 56 * 10**9)
    ok &= result.fits is False and rec.fits and rec.effective_batch == 8

    console.print(Rule("2. after 500 good steps: invoke train.diagnose-oom train.log --model Llama-2-7b --method lora "
                       "--batch 8 --seq-len 512"))
    console.print(RUNBOOK_OOM, markup=False)
    planned = JobFlags(model="Llama-2-7b", method="lora", batch=8, seq_len=512)
    triage = diagnose_oom(RUNBOOK_OOM, settings, planned)
    console.print(f"facts: {triage.facts}", markup=False)
    _findings(console, triage.findings)
    ids = [f.id for f in triage.findings]
    ok &= ids[:1] == ["TRAIN-OOM-001"] and "TRAIN-OOM-004" in ids
    ok &= bool(triage.facts["total_bytes"] == round(79.15 * 1024**3) and triage.facts["format"] == "B")

    console.print(Rule("3. a log with OOMs at steps 512 and 733: invoke diagnose train.log"))
    varying = diagnose(VARYING_LOG)
    console.print(f"kind: {varying.kind}; facts: {varying.facts}", markup=False)
    _findings(console, varying.findings)
    got = {f.id for f in varying.findings}
    ok &= varying.kind == "oom" and {"TRAIN-OOM-002", "TRAIN-OOM-004"} <= got

    console.print(Rule(f"4. GPU memory log: invoke train.monitor --host {HOST} --interval 1 --count 3"))
    ok &= _monitor(ctx)
    return ok


def _monitor(ctx: SceneContext) -> bool:
    from lab.faults import inject
    from remediation.train.monitor import monitor, parse_csv
    from remediation.transport.inventory import load

    console, lab = ctx.console, ctx.lab
    if lab.supervisor_pid() is None or HOST not in lab.existing_hosts():
        lab.up(max(ctx.hosts, 3), flavour="generic")
    try:
        inject(lab, HOST, "memory-full")
        console.print(f"lab fault on {HOST}: memory-full (a second job holds the GPU)")
        host = next(h for h in load(lab.cfg.inventory_path, "gpu") if h.name == HOST)
        out = io.StringIO()
        result = monitor(host, interval=1.0, count=3, out=out, max_seconds=60)
        console.print(out.getvalue().rstrip(), markup=False)
        rows = [r for r in parse_csv(out.getvalue()) if r.gpu == 0]
        full = all(r.memory_used_mib and r.memory_total_mib and r.memory_used_mib > 0.95 * r.memory_total_mib
                   for r in rows)
        console.print(f"GPU 0 on {HOST}: {rows[-1].memory_used_mib if rows else '?'} MiB used of "
                      f"{rows[-1].memory_total_mib if rows else '?'}: a training job there would OOM at once")
        return result.ok and len(rows) == 3 and full
    finally:
        lab.clear(HOST)


SCENE = Scene("train", "S2: CUDA OOM mid fine-tuning; plan before, triage after, GPU memory log", run)
