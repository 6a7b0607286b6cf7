"""``invoke diagnose`` kind ``aoai-429``: a pasted Azure OpenAI 429 (body, headers, SDK exception).

Registered with :mod:`remediation.core.parsers` when that module's plugins load. The facts always carry the three keys
of the contract: ``retry_after_seconds`` (a number or ``None``: the value the text states, header or body),
``limit_kind`` (``tokens | requests | unknown``) and ``deployment`` (or ``None``); the findings come from
:func:`remediation.aoai.rules.throttle_findings`, the rule ``invoke aoai.diagnose`` uses for logs.
"""

from __future__ import annotations

from typing import Any

from remediation.aoai import text as text_mod
from remediation.aoai.rules import Throttle, describe_hint, throttle_findings
from remediation.aoai.settings import AoaiSettings
from remediation.core.findings import Finding
from remediation.core.parsers import KindSpec, register

__all__ = ["diagnose_429"]

KIND = "aoai-429"


def diagnose_429(text: str) -> tuple[dict[str, Any], list[Finding]]:
    settings = AoaiSettings()
    parsed = text_mod.parse(text)
    seconds = parsed.retry_after_seconds
    facts: dict[str, Any] = {
        "retry_after_seconds": seconds,
        "limit_kind": parsed.limit_kind,
        "deployment": parsed.deployment,
        "hint_source": parsed.hint_source,
        "retry_after_date": parsed.retry_after_date,
        "meaning": describe_hint(seconds, settings) if seconds is not None else None,
        "model": parsed.model,
        "operation": parsed.operation,
        "api_version": parsed.api_version,
        "tier": parsed.tier,
        "region": parsed.region,
        "error_code": parsed.error_code,
        "policy_id": parsed.policy_id,
        "capacity": parsed.capacity,
        "reset_tokens_seconds": parsed.reset_tokens_seconds,
        "remaining_tokens": parsed.remaining_tokens,
        "remaining_requests": parsed.remaining_requests,
        "message": parsed.message,
        "evidence": list(parsed.evidence),
    }
    if not parsed.is_429:
        return facts, []
    evidence = parsed.message or (parsed.evidence[0] if parsed.evidence else "HTTP 429")
    throttle = Throttle(seconds, parsed.limit_kind, parsed.deployment, parsed.capacity, evidence)
    findings = throttle_findings([throttle], None, settings)
    if findings and parsed.evidence:  # every line the facts rest on, not only the sentence
        findings = [
            Finding(
                f.id, f.scenario, f.severity, f.summary, tuple(dict.fromkeys((*f.evidence, *parsed.evidence))), f.remedy
            )
            for f in findings
        ]
    return facts, findings


register(KindSpec(KIND, text_mod.score, text_mod.parse, "Azure OpenAI 429 body / headers", diagnose=diagnose_429))
