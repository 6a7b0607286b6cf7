"""``invoke aoai.diagnose`` as text: the storm in numbers, the minutes it lasted, then the findings and runbook."""

from __future__ import annotations

from typing import Any

from remediation.aoai.analysis import Analysis
from remediation.host.diagnose import DiagnoseResult, render_text

__all__ = ["render_analysis"]

_BAR = 30
_NA = "n/a"


def _n(value: int | float | None, width: int = 0, spec: str = ",") -> str:
    """A figure, or n/a when the input does not give it (``None`` in the facts): never a made-up 0."""
    return f"{_NA:>{width}}" if value is None else f"{value:>{width}{spec}}"


def render_analysis(analysis: Analysis, max_minutes: int = 30) -> str:
    facts = analysis.facts
    if facts["answers"] is None:
        counts = "answers: unknown, 429: unknown (the export has no AzureOpenAIRequests)"
    else:
        share = "n/a" if facts["share_429_pct"] is None else f"{facts['share_429_pct']:g}%"
        counts = f"answers: {facts['answers']}, 429: {facts['throttled']} ({share})"
    out = [
        f"source: {analysis.kind}" + (f" (deployment {facts['deployment']})" if facts.get("deployment") else ""),
        f"{counts}, {facts['first_minute']} to {facts['last_minute']}",
    ]
    if facts.get("answers_without_tokens"):
        out.append(f"token counts: {facts['answers_without_tokens']} answers carry none (not counted in the tokens)")
    hints = facts["retry_after"]
    if hints["count"] is None:
        out.append("Retry-After: n/a (an Azure Monitor export carries no Retry-After)")
    elif hints["count"]:
        hist = ", ".join(f"{k} {v}" for k, v in hints["histogram"].items() if v)
        out.append(
            f"Retry-After: {hints['count']} hints, median {hints['median_s']:g} s, max {hints['max_s']:g} s: {hist}"
        )
    else:
        out.append("Retry-After: none in this input")
    limit = facts.get("tpm_limit")
    figures = [v for v in (facts["peak_offered_tokens"], facts["peak_processed_tokens"]) if v is not None]
    peak = max(figures) if figures else None
    if peak is None:
        out.append("peak: unknown (no token counts in this input)"
                   + ("" if limit else "; TPM limit unknown: pass --tpm-limit"))
    elif limit:
        out.append(
            f"peak: {peak:,} tokens/min at {facts['peak_minute']} against {limit:,} TPM ({facts['peak_vs_limit']}x)"
        )
    else:
        out.append(f"peak: {peak:,} tokens/min at {facts['peak_minute']} (TPM limit unknown: pass --tpm-limit)")
    def demand(m: dict[str, Any]) -> int:
        return max(m["offered_tokens"] or 0, m["processed_tokens"] or 0)

    minutes = [m for m in facts["minutes"] if m["answers"] or (m["answers"] is None and demand(m))]
    if minutes:
        scale = max(demand(m) for m in minutes) or 1
        out.append("")
        out.append(f"{'minute':<18} {'answers':>7} {'429':>5} {'429%':>5} {'tokens asked':>12} {'processed':>10}")
        shown = (
            minutes
            if len(minutes) <= max_minutes
            else sorted(
                sorted(minutes, key=lambda m: (-(m["throttled"] or 0), -demand(m)))[:max_minutes],
                key=lambda m: m["minute"],
            )
        )
        for m in shown:
            bar = "#" * round(_BAR * demand(m) / scale)
            out.append(
                f"{m['minute']:<18} {_n(m['answers'], 7, '')} {_n(m['throttled'], 5, '')} "
                f"{_n(m['share_429_pct'], 5, '.0f')} {_n(m['offered_tokens'], 12)} {_n(m['processed_tokens'], 10)} "
                f"{bar}"
            )
        if len(shown) < len(minutes):
            out.append(f"({len(minutes) - len(shown)} quieter minutes not shown; --format json has them all)")
    out.append("")
    out.append(render_text(DiagnoseResult(analysis.kind, facts, analysis.findings)).rstrip("\n"))
    return "\n".join(out) + "\n"
