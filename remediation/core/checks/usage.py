"""GPU configuration and memory pressure (GPU-CFG-001, GPU-MEM-001)."""

from __future__ import annotations

from remediation.core.checks.evidence import Evidence
from remediation.core.checks.registry import rule
from remediation.core.findings import Finding, make_finding

__all__ = ["memory_full", "persistence_mode_off"]

_MIB = 1024 * 1024


@rule("GPU-CFG-001")
def persistence_mode_off(ev: Evidence) -> list[Finding]:
    """GPU-CFG-001: one finding per host listing the GPUs with persistence mode off."""
    if ev.facts is None:
        return []
    off = [g for g in ev.facts.nvml.gpus if g.ok and g.persistence_mode is False]
    if not off:
        return []
    evidence = [f"{g.label}: persistence mode off" for g in off]
    return [make_finding("GPU-CFG-001", f"Persistence mode off on {len(off)} GPU(s)", evidence, host=ev.host)]


@rule("GPU-MEM-001")
def memory_full(ev: Evidence) -> list[Finding]:
    """GPU-MEM-001: used memory at or above ``policy.memory_full_pct``, with the processes holding it."""
    if ev.facts is None:
        return []
    policy = ev.policy
    out = []
    for gpu in ev.facts.nvml.gpus:
        if not gpu.ok or gpu.memory is None or not gpu.memory.total:
            continue
        pct = gpu.memory.used_pct
        if pct < policy.memory_full_pct:
            continue
        evidence = [
            f"{gpu.label}: {gpu.memory.used // _MIB} MiB of {gpu.memory.total // _MIB} MiB used ({pct:.1f} %, "
            f"limit {policy.memory_full_pct:g} %)"
        ]
        procs = sorted(gpu.processes, key=lambda p: -(p.used_memory or 0))
        for proc in procs:
            used = f"{proc.used_memory // _MIB} MiB" if proc.used_memory is not None else "? MiB"
            evidence.append(f"pid {proc.pid} ({proc.name or 'name not visible'}): {used}")
        if not procs:
            evidence.append("no compute process visible to NVML (other container/namespace, or driver reservation)")
        out.append(make_finding("GPU-MEM-001", f"{gpu.label} memory {pct:.0f} % full", evidence, host=ev.host))
    return out
