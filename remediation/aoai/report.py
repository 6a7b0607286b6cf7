"""``invoke aoai.diagnose`` as text: the storm in numbers, the minutes it lasted, then the findings and runbook."""

from __future__ import annotations

from remediation.aoai.analysis import Analysis
from remediation.host.diagnose import DiagnoseResult, render_text

__all__ = ["render_analysis"]

_BAR = 30


def render_analysis(analysis: Analysis, max_minutes: int = 30) -> str:
    facts = analysis.facts
    out = [
        f"source: {analysis.kind}" + (f" (deployment {facts['deployment']})" if facts.get("deployment") else ""),
        f"answers: {facts['answers']}, 429: {facts['throttled']} ({facts['share_429_pct']:g}%), "
        f"{facts['first_minute']} to {facts['last_minute']}",
    ]
    hints = facts["retry_after"]
    if hints["count"]:
        hist = ", ".join(f"{k} {v}" for k, v in hints["histogram"].items() if v)
        out.append(
            f"Retry-After: {hints['count']} hints, median {hints['median_s']:g} s, max {hints['max_s']:g} s: {hist}"
        )
    else:
        out.append("Retry-After: none in this input")
    limit = facts.get("tpm_limit")
    peak = max(facts["peak_offered_tokens"], facts["peak_processed_tokens"])
    if limit:
        out.append(
            f"peak: {peak:,} tokens/min at {facts['peak_minute']} against {limit:,} TPM ({facts['peak_vs_limit']}x)"
        )
    else:
        out.append(f"peak: {peak:,} tokens/min at {facts['peak_minute']} (TPM limit unknown: pass --tpm-limit)")
    minutes = [m for m in facts["minutes"] if m["answers"]]
    if minutes:
        scale = max(max(m["offered_tokens"], m["processed_tokens"]) for m in minutes) or 1
        out.append("")
        out.append(f"{'minute':<18} {'answers':>7} {'429':>5} {'429%':>5} {'tokens asked':>12} {'processed':>10}")
        shown = (
            minutes
            if len(minutes) <= max_minutes
            else sorted(sorted(minutes, key=lambda m: -m["throttled"])[:max_minutes], key=lambda m: m["minute"])
        )
        for m in shown:
            bar = "#" * round(_BAR * max(m["offered_tokens"], m["processed_tokens"]) / scale)
            out.append(
                f"{m['minute']:<18} {m['answers']:>7} {m['throttled']:>5} {m['share_429_pct']:>5.0f} "
                f"{m['offered_tokens']:>12,} {m['processed_tokens']:>10,} {bar}"
            )
        if len(shown) < len(minutes):
            out.append(f"({len(minutes) - len(shown)} quieter minutes not shown; --format json has them all)")
    out.append("")
    out.append(render_text(DiagnoseResult(analysis.kind, facts, analysis.findings)).rstrip("\n"))
    return "\n".join(out) + "\n"
