"""What the ``train.*`` tasks call: flags (already typed by the task) to a plan, an OOM diagnosis, a capacity.

Flag > ``train:`` setting > default, resolved here so the tasks stay thin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from remediation.core.lazy import LazyExports
from remediation.train import oom as oom_mod
from remediation.train.errors import TrainError
from remediation.train.gpus import gpu as gpu_named
from remediation.train.gpus import parse_size
from remediation.train.gpus import substitution as gpu_substitution
from remediation.train.models import ModelSpec, builtin, load_config, spec_from_config, spec_from_params
from remediation.train.models import substitution as model_substitution
from remediation.train.plan import Plan, PlanInput, Recommendation, plan, recommend
from remediation.train.settings import TrainSettings

if TYPE_CHECKING:
    from remediation.core.findings import Finding
    from remediation.host.audit import AuditOptions
    from remediation.train.monitor import monitor
    from remediation.train.render import plan_to_dict, print_plan
    from remediation.transport.inventory import Host

__all__ = ["JobFlags", "OomDiagnosis", "TrainSettings", "capacity_from_host", "diagnose_oom", "model_from_flags",
           "monitor", "plan_job", "plan_to_dict", "print_plan"]

#: What the tasks also take from here, loaded on first use (PEP 562): the monitor (SSH) and the plan's rendering.
_LAZY = LazyExports(__name__, {"monitor": "remediation.train.monitor", "plan_to_dict": "remediation.train.render",
                               "print_plan": "remediation.train.render"})


def __getattr__(name: str) -> Any:
    return _LAZY.load(name)

MiB = 1024**2


@dataclass(frozen=True)
class JobFlags:
    """The planner's flags as the task parsed them (None: not given, take the setting)."""

    model: str | None = None
    config: str | None = None
    params: str | None = None
    gpu: str | None = None
    gpu_memory: str | None = None
    regime: str | None = None
    optimizer: str | None = None
    fused_optimizer: bool = False
    method: str = "full"
    lora_r: int | None = None
    lora_targets: Sequence[str] = ()
    lora_dropout: float | None = None
    batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    grad_checkpointing: bool = False
    gpus: int = 1
    zero_stage: int = 0
    attention: str = "flash"

    @property
    def names_a_model(self) -> bool:
        return any(v is not None for v in (self.model, self.config, self.params))


def model_from_flags(flags: JobFlags) -> ModelSpec:
    given = [f for f, v in (("--model", flags.model), ("--config", flags.config), ("--params", flags.params)) if v]
    if len(given) != 1:
        raise TrainError(
            "name the model once: --model NAME (built-in table), --config config.json or --params N"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if flags.model:
        return builtin(flags.model)
    if flags.config:
        return spec_from_config(load_config(flags.config), name=flags.config.rsplit("/", 1)[-1])
    text = str(flags.params).strip().lower().replace("_", "").replace(",", "")
    scale = {"b": 1e9, "m": 1e6, "t": 1e12}.get(text[-1:], 1.0)
    try:
        count = int(float(text[:-1] if scale != 1.0 else text) * scale)
    except ValueError:
        raise TrainError(f"--params {flags.params!r} is not a number; write 7e9, 7B or 6738415616") from None
    return spec_from_params(count)


def capacity_from_host(host: Host, options: AuditOptions) -> tuple[int, str]:
    """(bytes, description) of the smallest GPU on ``host``, from the audit's NVML facts (one probe, read-only)."""
    from remediation.host.audit import run_audit

    result = run_audit([host], options, fleet="train-plan")
    audit = result.host(host.name)
    if audit.facts is None:
        raise TrainError(f"--from-host {host.name}: the host could not be probed ({audit.error}); pass --gpu instead")
    nvml = audit.facts.nvml
    gpus = [g for g in nvml.gpus if g.ok and g.memory is not None]
    if nvml.failed or not gpus:
        raise TrainError(
            f"--from-host {host.name}: NVML gave no GPU memory ({nvml.error or 'no GPUs'}); pass --gpu instead"
        )
    smallest = min(gpus, key=lambda g: g.memory.total if g.memory else 0)
    assert smallest.memory is not None
    used = max(g.memory.used for g in gpus if g.memory)
    desc = f"{host.name}: {smallest.name or 'GPU'} {smallest.memory.total // MiB} MiB (NVML, GPU {smallest.index})"
    if used > smallest.memory.total * 0.05:
        desc += f"; {used // MiB} MiB already in use on the busiest GPU"
    return smallest.memory.total, desc


def _job(settings: TrainSettings, flags: JobFlags, capacity: tuple[int, str] | None) -> PlanInput:
    spec = model_from_flags(flags)
    notes: list[str] = []
    if flags.model:
        notes.append(model_substitution(flags.model) or "")
    if capacity is None:
        if flags.gpu and flags.gpu_memory:
            raise TrainError("pass one of --gpu and --gpu-memory, not both")
        if flags.gpu_memory:
            capacity = (parse_size(flags.gpu_memory), f"--gpu-memory {flags.gpu_memory}")
        else:
            g = gpu_named(flags.gpu or settings.gpu)
            capacity = (g.bytes, f"{g.name}: {g.model}, {g.memory_mib} MiB" + ("" if flags.gpu else " (train.gpu)"))
            notes.append(gpu_substitution(flags.gpu or settings.gpu) or "")
    return PlanInput(
        model=spec,
        capacity_bytes=capacity[0],
        capacity_source=capacity[1],
        regime=flags.regime or settings.regime,
        optimizer=flags.optimizer or settings.optimizer,
        fused_optimizer=flags.fused_optimizer,
        method=flags.method,
        lora_r=flags.lora_r if flags.lora_r is not None else settings.lora_r,
        lora_targets=tuple(t for t in flags.lora_targets if t),
        lora_dropout=flags.lora_dropout if flags.lora_dropout is not None else settings.lora_dropout,
        batch=flags.batch,
        seq_len=flags.seq_len,
        grad_accum=flags.grad_accum,
        grad_checkpointing=flags.grad_checkpointing,
        gpus=flags.gpus,
        zero_stage=flags.zero_stage,
        attention=flags.attention,
        cuda_context_bytes=settings.cuda_context_mib * MiB,
        allocator_overhead=settings.allocator_overhead,
        headroom=settings.headroom,
        notes=tuple(n for n in notes if n),
    ).checked()


def plan_job(
    settings: TrainSettings, flags: JobFlags, capacity: tuple[int, str] | None = None
) -> tuple[Plan, Recommendation]:
    """The plan of the job the flags describe, and the recommended settings."""
    job = _job(settings, flags, capacity)
    return plan(job), recommend(job)


@dataclass(frozen=True)
class OomDiagnosis:
    facts: dict[str, Any]
    findings: tuple[Finding, ...]
    plan: Plan | None

    @property
    def found(self) -> bool:
        return self.facts.get("format") is not None

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "oom", "facts", "findings"}``, the contract of ``invoke diagnose``."""
        keys = ("id", "scenario", "severity", "summary", "evidence", "remedy")
        return {
            "kind": "oom",
            "facts": self.facts,
            "findings": [{k: f.to_dict()[k] for k in keys} for f in self.findings],
        }


def diagnose_oom(
    text: str, settings: TrainSettings, flags: JobFlags | None = None, source: str = "<text>"
) -> OomDiagnosis:
    """Parse the OOM in ``text``; with a model in ``flags`` the planner's numbers name the cause.

    Text over the input cap (:func:`remediation.core.parsers.check_size`) raises :class:`TrainError`."""
    from remediation.core.parsers import check_size

    check_size(text, source, TrainError)
    if not text.strip():
        raise TrainError(f"nothing to diagnose: {source} is empty")
    report = oom_mod.parse(text)
    facts = oom_mod.facts(report)
    job_plan = None
    if flags is not None and flags.names_a_model and report.found:
        last = report.last
        capacity = None
        if last is not None and last.total is not None and not (flags.gpu or flags.gpu_memory):
            capacity = (last.total, f"GPU {last.gpu} as the OOM message states it")
        job_plan = plan(_job(settings, flags, capacity))
    return OomDiagnosis(facts, tuple(oom_mod.findings(report, job_plan)), job_plan)
