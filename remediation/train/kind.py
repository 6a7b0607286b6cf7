"""The ``oom`` kind of ``invoke diagnose``: PyTorch / ROCm out-of-memory messages (registered on import)."""

from __future__ import annotations

from typing import Any

from remediation.core.findings import Finding
from remediation.core.parsers import KindSpec, register
from remediation.train import oom

__all__ = ["diagnose"]


def diagnose(text: str) -> tuple[dict[str, Any], list[Finding]]:
    """(facts with exactly :data:`oom.FACT_KEYS`, findings) of an OOM text; the rules of :func:`oom.findings`."""
    report = oom.parse(text)
    return oom.facts(report), oom.findings(report)


register(
    KindSpec(
        "oom",
        oom.score,
        oom.parse,
        "PyTorch / ROCm out-of-memory messages (CUDA OOM, torch.OutOfMemoryError, HIP out of memory)",
        diagnose=diagnose,
    )
)
