"""`invoke aoai.diagnose` on request logs and Azure Monitor exports: shares, Retry-After, peak vs limit, findings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from remediation.aoai.analysis import analyse
from remediation.aoai.report import render_analysis
from remediation.aoai.settings import AoaiSettings
from remediation.core import catalog
from remediation.core.errors import AoaiError

T0 = 1_721_030_400.0  # 2024-07-15T08:00:00Z
S = AoaiSettings()


def client_record(ts: float, **kw: Any) -> str:
    base = {
        "kind": "aoai-request",
        "ts": ts,
        "request_id": "r",
        "deployment": "gpt-4o-prod",
        "status": 200,
        "outcome": "ok",
        "attempts": 1,
        "throttled": 0,
        "hints_s": [],
        "est_tokens": 1000,
        "total_tokens": 900,
    }
    base.update(kw)
    return json.dumps(base)


def response(ts: float, status: int, tokens: int | None = None, **kw: Any) -> str:
    entry: dict[str, Any] = {"time": ts, "status": status, "deployment": "gpt-4o-prod"}
    if tokens is not None:
        entry["usage"] = {"total_tokens": tokens}
    entry.update(kw)
    return json.dumps(entry)


def test_a_storm_in_a_response_log() -> None:
    lines = []
    for minute in range(3):
        answers = 200 if minute == 1 else 100  # the launch: twice the traffic in the second minute
        for i in range(answers):
            ts = T0 + minute * 60 + i * 60 / answers
            if minute == 1 and i >= 110:  # what does not fit in 80K TPM is refused
                lines.append(
                    response(
                        ts,
                        429,
                        headers={"retry-after-ms": "31000", "policy-id": "DeploymentRatelimit-Token"},
                        error={"message": "exceeded token rate limit"},
                    )
                )
            else:
                lines.append(response(ts, 200, 700))
    result = analyse("\n".join(lines), S, tpm_limit=80_000)
    facts = result.facts
    assert (facts["answers"], facts["throttled"], facts["share_429_pct"]) == (400, 90, 22.5)
    assert facts["retry_after"]["histogram"]["far over the limit"] == 90
    assert facts["peak_minute"] == "2024-07-15T08:01Z"
    # a 429 line without a size counts at the median successful size (700)
    assert facts["peak_offered_tokens"] == 140_000 and facts["peak_processed_tokens"] == 77_000
    ids = {f.id: f for f in result.findings}
    assert set(ids) == {"AOAI-429-001", "AOAI-TPM-001"}
    assert ids["AOAI-429-001"].severity.value == "warning"  # 22%: above 5%, below the 30% storm
    assert "token rate limit (TPM)" in ids["AOAI-429-001"].summary
    assert "far over the limit" in ids["AOAI-429-001"].summary
    assert "1.8x" in ids["AOAI-TPM-001"].summary and "08:01Z to 2024-07-15T08:01Z" in ids["AOAI-TPM-001"].summary
    text = render_analysis(result)
    assert "AOAI-TPM-001" in text and "2024-07-15T08:01Z" in text


def test_client_records_storm_and_huge_hint() -> None:
    lines = [client_record(T0 + i, attempts=3, throttled=2, hints_s=[1.0, 86400]) for i in range(10)]
    lines += [client_record(T0 + 30 + i) for i in range(5)]
    result = analyse("\n".join(lines) + "\nnot json\n", S)
    facts = result.facts
    assert (facts["answers"], facts["throttled"], facts["client_records"], facts["skipped_lines"]) == (35, 20, 15, 1)
    assert facts["retry_after"]["histogram"] == {
        "slightly over the limit": 10,
        "over the limit": 0,
        "far over the limit": 0,
        "above the cap": 10,
    }
    ids = {f.id: f for f in result.findings}
    assert ids["AOAI-429-001"].severity.value == "critical"  # 57%: a storm
    assert ids["AOAI-429-002"].summary.startswith("Retry-After 86400 s")
    assert "AOAI-TPM-001" not in ids  # no limit given: no peak-vs-limit finding
    assert facts["tpm_limit"] is None


def test_sustained_load_recommends_ptu() -> None:
    lines = [response(T0 + m * 60, 200, 70_000) for m in range(20)]
    ids = {f.id for f in analyse("\n".join(lines), S, tpm_limit=80_000).findings}
    assert ids == {"AOAI-TPM-002"}
    assert not analyse("\n".join(lines[:10]), S, tpm_limit=80_000).findings


def test_deployment_filter_and_iso_times() -> None:
    lines = [
        json.dumps({"timestamp": "2024-07-15T08:00:05Z", "status_code": 429, "deployment": "other"}),
        json.dumps(
            {
                "timestamp": "2024-07-15T08:00:06+00:00",
                "statusCode": 200,
                "deployment": "mine",
                "usage": {"total_tokens": 10},
            }
        ),
    ]
    result = analyse("\n".join(lines), S, deployment="mine")
    assert (result.facts["answers"], result.facts["throttled"]) == (1, 0)
    assert not result.findings


def metric(name: str, points: list[tuple[int, float]], **dims: str) -> dict[str, Any]:
    return {
        "id": f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.CognitiveServices/accounts/a/providers/"
        f"Microsoft.Insights/metrics/{name}",
        "type": "Microsoft.Insights/metrics",
        "name": {"value": name, "localizedValue": name},
        "unit": "Count",
        "timeseries": [
            {
                "metadatavalues": [
                    {"name": {"value": k.lower(), "localizedValue": k}, "value": v} for k, v in dims.items()
                ],
                "data": [{"timeStamp": f"2024-07-15T08:{m:02d}:00Z", "total": v} for m, v in points],
            }
        ],
        "errorCode": "Success",
    }


def test_azure_monitor_export() -> None:
    export = {
        "cost": 120,
        "timespan": "2024-07-15T08:00:00Z/2024-07-15T08:10:00Z",
        "interval": "PT1M",
        "namespace": "Microsoft.CognitiveServices/accounts",
        "resourceregion": "eastus",
        "value": [
            metric(
                "TokenTransaction",
                [(m, 79_000.0 if 2 <= m <= 5 else 20_000.0) for m in range(10)],
                ModelDeploymentName="gpt-4o-prod",
            ),
            {
                **metric(
                    "AzureOpenAIRequests",
                    [(m, 100.0) for m in range(10)],
                    StatusCode="200",
                    ModelDeploymentName="gpt-4o-prod",
                ),
            },
            metric(
                "AzureOpenAIRequests",
                [(m, 60.0) for m in range(2, 6)],
                StatusCode="429",
                ModelDeploymentName="gpt-4o-prod",
            ),
            metric(
                "AzureOpenAIRequests",
                [(m, 999.0) for m in range(10)],
                StatusCode="429",
                ModelDeploymentName="someone-else",
            ),
        ],
    }
    result = analyse(json.dumps(export), S, tpm_limit=80_000, deployment="gpt-4o-prod")
    assert result.kind == "aoai-metrics"
    facts = result.facts
    assert (facts["answers"], facts["throttled"]) == (1240, 240)
    ids = {f.id: f for f in result.findings}
    assert set(ids) == {"AOAI-429-001", "AOAI-TPM-001"}
    assert "08:02Z to 2024-07-15T08:05Z" in ids["AOAI-TPM-001"].summary  # at the limit with 429s: the burst


def test_bad_inputs_name_the_source() -> None:
    with pytest.raises(AoaiError, match=r"nothing to diagnose: .*log\.jsonl is empty"):
        analyse("  ", S, source="log.jsonl")
    with pytest.raises(AoaiError, match=r"log\.jsonl: no request records"):
        analyse("hello\nworld", S, source="log.jsonl")
    with pytest.raises(AoaiError, match="without TokenTransaction"):
        analyse(json.dumps({"value": [metric("Latency", [(0, 1.0)])]}), S, source="m.json")


def test_s4_catalog_entries_carry_the_runbook() -> None:
    for finding_id in ("AOAI-429-001", "AOAI-429-002", "AOAI-429-003", "AOAI-TPM-001", "AOAI-TPM-002"):
        entry = catalog.get(finding_id)
        assert entry.scenario.value == "S4"
        assert all(body.strip() for _, body in entry.runbook.sections())
    book = catalog.get("AOAI-429-001").runbook
    assert "Retry-After" in book.diagnosis and "TokenTransaction" in book.diagnosis
    assert "PTU" in book.resolution and "another region" in book.resolution
    assert "80%" in book.prevention
