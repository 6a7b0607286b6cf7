"""The JSON report: the audit schema, stable output, and a document ``history`` can read back."""

from __future__ import annotations

import json

from test_report_common import DOWN_HOST, S1_HOST, UNREACHABLE_ERROR, build_result

from remediation.core.findings import Finding
from remediation.report.json_report import SCHEMA, render_json


def test_top_level_keys_in_documented_order() -> None:
    doc = json.loads(render_json(build_result()))
    assert list(doc) == ["schema", "fleet", "inventory", "started_at", "seconds", "hosts"]
    assert doc["schema"] == SCHEMA == "gpufleet.audit/1"
    assert doc["started_at"] == "2026-12-02T08:00:00+00:00"
    host = doc["hosts"][0]
    assert list(host) == ["host", "status", "error", "seconds", "healthy", "findings", "facts"]


def test_values_match_the_result() -> None:
    result = build_result()
    doc = json.loads(render_json(result))
    assert [h["host"] for h in doc["hosts"]] == [h.host for h in result.hosts]
    s1 = next(h for h in doc["hosts"] if h["host"] == S1_HOST)
    assert s1["healthy"] is False
    assert [f["id"] for f in s1["findings"]] == [f.id for f in result.host(S1_HOST).findings]
    assert s1["facts"]["nvml"]["error_class"] == "driver_not_loaded"
    assert [Finding.from_dict(f) for f in s1["findings"]] == list(result.host(S1_HOST).findings)
    down = next(h for h in doc["hosts"] if h["host"] == DOWN_HOST)
    assert down == {
        "host": DOWN_HOST,
        "status": "unreachable",
        "error": UNREACHABLE_ERROR,
        "seconds": 0.29,
        "healthy": False,
        "findings": [],
        "facts": None,
    }


def test_stable_bytes_and_sorted_facts() -> None:
    text = render_json(build_result())
    assert text == render_json(build_result())
    assert text.endswith("}\n")
    assert '\n  "schema"' in text  # indent 2
    doc = json.loads(text)
    facts = doc["hosts"][0]["facts"]
    assert list(facts) == sorted(facts)
    assert "86 °C" in text  # non-ASCII kept as is (the thermal evidence)
    assert "\\u00b0" not in text
