"""The rules of the S4 findings, each written once: ``invoke aoai.diagnose`` (request logs, metrics exports) and
``invoke diagnose`` (kind ``aoai-429``, one pasted 429) both call these.

- :func:`throttle_findings`: AOAI-429-001 (the deployment's rate limit answered 429: one pasted answer, or a share
  of a log at or above ``warn_share_pct``, critical from ``storm_share_pct``), AOAI-429-002 (a Retry-After above the
  cap: use another deployment), AOAI-429-003 (peak-load / capacity 429s: not the quota).
- :func:`load_findings`: AOAI-TPM-001 (a minute whose demand went above the TPM limit, or that processed at the
  limit while 429s came back: the burst, its start, end and peak), AOAI-TPM-002 (load at or above
  ``sustained_pct`` of the limit for ``sustained_minutes`` minutes in a row: evaluate PTU).
- :func:`describe_hint`: what a Retry-After says about the demand (the runbook: 1 s = slightly over, 30 s = far over).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from remediation.aoai.settings import AoaiSettings
from remediation.core.findings import Finding, Severity, make_finding

__all__ = ["MinuteLoad", "Throttle", "describe_hint", "load_findings", "throttle_findings"]


@dataclass(frozen=True)
class Throttle:
    """One 429 answer."""

    hint_s: float | None
    limit_kind: str  # tokens | requests | unknown
    deployment: str | None
    capacity: bool  # peak load, not quota
    evidence: str
    count: int = 1  # the same answer this many times (a metrics minute)


@dataclass(frozen=True)
class MinuteLoad:
    """One minute of a deployment's traffic."""

    label: str  # e.g. 2024-07-15T08:14Z
    requests: int  # HTTP answers
    throttled: int  # 429 answers among them
    processed_tokens: int  # tokens of the successful answers
    offered_tokens: int  # tokens the callers asked for (0 when the source cannot tell: see offered_known)
    answers_known: bool = True  # False: the source has no answer counts (a metrics export without requests)
    processed_known: bool = True  # False: the source has no token counts for the answers
    offered_known: bool = True  # False: the source cannot tell what was asked for (any metrics export)


def _count(value: int, known: bool) -> str:
    return f"{value:,}" if known else "n/a"


def describe_hint(seconds: float, settings: AoaiSettings) -> str:
    if seconds > settings.retry_after_cap_s:
        return f"above the {settings.retry_after_cap_s:g} s cap: this deployment will not serve soon, use another"
    if seconds <= settings.slightly_over_s:
        return "slightly over the limit"
    if seconds >= settings.far_over_s:
        return "far over the limit"
    return "over the limit"


def _kind_text(kinds: Sequence[str]) -> str:
    names = {"tokens": "token rate limit (TPM)", "requests": "call rate limit (RPM)"}
    found = [names[k] for k in dict.fromkeys(kinds) if k in names]
    return " and ".join(found) or "rate limit"


def _where(throttles: Sequence[Throttle]) -> str:
    names = [t.deployment for t in throttles if t.deployment]
    return f" on deployment {', '.join(dict.fromkeys(names))}" if names else ""


def _evidence(throttles: Sequence[Throttle]) -> list[str]:
    lines = list(dict.fromkeys(t.evidence for t in throttles if t.evidence))
    return lines[:5] or ["HTTP 429"]


def throttle_findings(
    throttles: Sequence[Throttle], total: int | None, settings: AoaiSettings, period: str = ""
) -> list[Finding]:
    """Findings for the 429s seen; ``total`` is the number of answers in a log (``None``: one pasted 429)."""
    findings: list[Finding] = []
    quota = [t for t in throttles if not t.capacity]
    capacity = [t for t in throttles if t.capacity]
    if quota:
        hints = [t.hint_s for t in quota if t.hint_s is not None and t.hint_s <= settings.retry_after_cap_s]
        if len(hints) == 1:
            hint_text = f"; Retry-After {hints[0]:g} s ({describe_hint(hints[0], settings)})"
        elif hints:
            median = statistics.median(hints)
            hint_text = f"; Retry-After median {median:g} s, max {max(hints):g} s ({describe_hint(median, settings)})"
        else:
            hint_text = ""
        kinds = _kind_text([t.limit_kind for t in quota])
        if total is None:
            findings.append(
                make_finding(
                    "AOAI-429-001", f"Azure OpenAI {kinds} exceeded{_where(quota)}{hint_text}", _evidence(quota)
                )
            )
        elif total > 0:
            throttled = sum(t.count for t in quota)
            share = 100.0 * throttled / total
            if share >= settings.warn_share_pct:
                severity = Severity.CRITICAL if share >= settings.storm_share_pct else Severity.WARNING
                storm = "429 storm: " if share >= settings.storm_share_pct else ""
                findings.append(
                    make_finding(
                        "AOAI-429-001",
                        f"{storm}{throttled} of {total} answers ({share:.0f}%) were 429, {kinds}{_where(quota)}"
                        f"{period}{hint_text}",
                        _evidence(quota),
                        severity=severity,
                    )
                )
    huge = [t for t in throttles if t.hint_s is not None and t.hint_s > settings.retry_after_cap_s]
    if huge:
        top = max(t.hint_s for t in huge if t.hint_s is not None)
        many = sum(t.count for t in huge)
        count = f"{many} answers said" if many > 1 else "the answer says"
        findings.append(
            make_finding(
                "AOAI-429-002",
                f"Retry-After {top:g} s{_where(huge)}: {count} to wait far beyond the {settings.retry_after_cap_s:g} s "
                "cap; cool this deployment and send to another one instead of sleeping",
                _evidence(huge),
            )
        )
    if capacity:
        findings.append(
            make_finding(
                "AOAI-429-003",
                f"Azure OpenAI at peak load{_where(capacity)}: {sum(t.count for t in capacity)} capacity 429(s), "
                "not the deployment's "
                "quota; retry on another region's deployment, evaluate PTU",
                _evidence(capacity),
            )
        )
    return findings


def load_findings(minutes: Sequence[MinuteLoad], tpm_limit: int, settings: AoaiSettings) -> list[Finding]:
    """Burst and sustained-load findings over per-minute loads against ``tpm_limit`` (nothing when it is 0)."""
    if tpm_limit <= 0 or not minutes:
        return []
    findings: list[Finding] = []

    def demand(m: MinuteLoad) -> int:
        return max(m.offered_tokens, m.processed_tokens)

    def over(m: MinuteLoad) -> bool:
        at_limit = m.processed_tokens >= tpm_limit * settings.alert_pct / 100.0 and m.throttled > 0
        return demand(m) > tpm_limit or at_limit

    runs: list[list[MinuteLoad]] = []  # consecutive minutes over the limit (``minutes`` has no gaps)
    previous_over = False
    for minute in minutes:
        now_over = over(minute)
        if now_over and previous_over:
            runs[-1].append(minute)
        elif now_over:
            runs.append([minute])
        previous_over = now_over
    if runs:
        peak = max(minutes, key=demand)
        worst = max(runs, key=lambda run: sum(demand(m) for m in run))
        ratio = demand(peak) / tpm_limit
        throttled = sum(m.throttled for m in worst)
        findings.append(
            make_finding(
                "AOAI-TPM-001",
                f"peak {demand(peak):,} tokens/min at {peak.label} against a {tpm_limit:,} TPM limit ({ratio:.1f}x); "
                f"the burst ran {worst[0].label} to {worst[-1].label} ({len(worst)} min over the limit, "
                f"{throttled} 429s)",
                [
                    f"{m.label}: offered {_count(m.offered_tokens, m.offered_known)} processed "
                    f"{_count(m.processed_tokens, m.processed_known)} tokens, "
                    + (f"{m.requests} answers, {m.throttled} 429" if m.answers_known else "answers unknown")
                    for m in worst[:5]
                ],
            )
        )
    longest: list[MinuteLoad] = []
    current: list[MinuteLoad] = []
    for minute in minutes:
        if demand(minute) >= tpm_limit * settings.sustained_pct / 100.0:
            current.append(minute)
            if len(current) > len(longest):
                longest = list(current)
        else:
            current = []
    if len(longest) >= settings.sustained_minutes:
        mean = sum(demand(m) for m in longest) / len(longest)
        findings.append(
            make_finding(
                "AOAI-TPM-002",
                f"{len(longest)} minutes in a row at or above {settings.sustained_pct:g}% of the {tpm_limit:,} TPM "
                f"limit ({longest[0].label} to {longest[-1].label}, mean {mean:,.0f} tokens/min): a sustained load, "
                "evaluate provisioned throughput (PTU)",
                [f"{m.label}: {demand(m):,} tokens" for m in longest[:3]],
            )
        )
    return findings
