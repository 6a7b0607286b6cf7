"""Comparison with the previous run: new, resolved, persisting, and unknown (never resolved unseen)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_report_common import STARTED, build_result

from remediation.core.findings import Finding
from remediation.host.audit import AuditResult
from remediation.host.history import (
    Comparison,
    HistoryError,
    compare,
    discriminator,
    load_previous,
    render_comparison,
    save,
)
from remediation.report.json_report import render_json

DAY = _dt.timedelta(days=1)


def saved(result: AuditResult) -> dict[str, Any]:
    """The previous run as ``load_previous`` returns it (the same JSON document ``save`` writes)."""
    doc: dict[str, Any] = json.loads(render_json(result))
    return doc


def ids(findings: tuple[Finding, ...]) -> list[tuple[str | None, str]]:
    return [(f.host, f.id) for f in findings]


def test_first_run_everything_is_new() -> None:
    current = build_result({"gpu-3": "thermal", "gpu-1": "healthy"})
    c = compare(None, current)
    assert ids(c.new) == [("gpu-3", "GPU-THM-001"), ("gpu-3", "GPU-THM-003")]
    assert (c.resolved, c.persisting, c.unknown) == ((), (), ())
    assert not c.has_previous


def test_new_resolved_persisting() -> None:
    before = build_result({"gpu-1": "thermal", "gpu-2": "healthy", "gpu-3": "memory_full"})
    now = build_result({"gpu-1": "healthy", "gpu-2": "thermal", "gpu-3": "memory_full"}, started=STARTED + DAY)
    c = compare(saved(before), now)
    assert ids(c.new) == [("gpu-2", "GPU-THM-001"), ("gpu-2", "GPU-THM-003")]
    assert ids(c.resolved) == [("gpu-1", "GPU-THM-001"), ("gpu-1", "GPU-THM-003")]
    assert ids(c.persisting) == [("gpu-3", "GPU-MEM-001")]
    assert c.unknown == ()
    assert c.previous_started_at == "2026-12-02T08:00:00+00:00"
    assert c.changed


def test_a_changed_measurement_is_the_same_finding() -> None:
    before = build_result({"gpu-3": "thermal"})

    def hotter(host: str, f: Finding) -> Finding:
        return dataclasses.replace(f, summary=f.summary.replace("86 °C", "88 °C"))

    now = build_result({"gpu-3": "thermal"}, edit=hotter)
    assert "88 °C" in now.findings[0].summary
    c = compare(saved(before), now)
    assert ids(c.persisting) == [("gpu-3", "GPU-THM-001"), ("gpu-3", "GPU-THM-003")]
    assert c.new == () and c.resolved == ()
    assert not c.changed


def test_another_gpu_is_a_new_finding() -> None:
    before = build_result({"gpu-3": "thermal"})

    def other_gpu(host: str, f: Finding) -> Finding:
        return dataclasses.replace(f, summary=f.summary.replace("GPU 1 (00000002:00:00.0)", "GPU 3 (00000004:00:00.0)"))

    now = build_result({"gpu-3": "thermal"}, edit=other_gpu)
    c = compare(saved(before), now)
    assert len(c.new) == 2 and len(c.resolved) == 2 and c.persisting == ()


def test_unreachable_now_is_unknown_not_resolved() -> None:
    before = build_result({"gpu-2": "s1_unattended_kernel", "gpu-3": "thermal"})
    now = build_result({"gpu-2": None, "gpu-3": "thermal"})
    c = compare(saved(before), now)
    assert c.resolved == ()
    assert [f.id for f in c.unknown] == ["GPU-DRV-001", "GPU-KRN-002", "GPU-KRN-003", "GPU-KRN-004", "GPU-KRN-006"]
    assert {f.host for f in c.unknown} == {"gpu-2"}
    assert c.hosts_not_probed_now == ("gpu-2",)
    assert len(c.persisting) == 2


def test_host_left_the_selection_is_unknown() -> None:
    before = build_result({"gpu-2": "s1_unattended_kernel", "gpu-3": "thermal"})
    now = build_result({"gpu-3": "thermal"})
    c = compare(saved(before), now)
    assert c.resolved == ()
    assert {f.host for f in c.unknown} == {"gpu-2"}


def test_not_probed_before_counts_as_new_and_says_so() -> None:
    before = build_result({"gpu-2": None})
    now = build_result({"gpu-2": "thermal"})
    c = compare(saved(before), now)
    assert ids(c.new) == [("gpu-2", "GPU-THM-001"), ("gpu-2", "GPU-THM-003")]
    assert c.hosts_not_probed_before == ("gpu-2",)


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        ("GPU 1 (00000002:00:00.0) at 86 °C, at or above the alert threshold 78 °C", "gpu=1"),
        ("GPU 3 lost (fallen off the bus): not a driver problem", "gpu=3"),
        ("GPU 0004:00:00.0 fell off the bus (kernel log)", "pci=0004:00:00.0"),
        ("Xid 63 on 0000:00:00: ECC page retirement", "xid=63,pci=0000:00:00"),
        ("Kernel packages of 6.5.0-45-generic not held", ""),
        ("Driver 535.216.01 differs from expected 535.183.01", ""),
        ("Persistence mode off on 2 GPU(s)", ""),
        ("3 of 4 GPUs visible", ""),
    ],
)
def test_discriminator(summary: str, expected: str) -> None:
    f = Finding.from_dict({"id": "GPU-HW-001", "scenario": "S1", "severity": "critical", "summary": summary})
    assert discriminator(f) == expected


def test_load_previous_newest_of_the_fleet(tmp_path: Path) -> None:
    assert load_previous(tmp_path / "missing", "gpu") is None
    assert load_previous(tmp_path, "gpu") is None
    older = build_result({"gpu-1": "healthy"})
    newer = build_result({"gpu-3": "thermal"}, started=STARTED + DAY)
    save(older, tmp_path)
    path = save(newer, tmp_path)
    other = dataclasses.replace(build_result({"gpu-2": "s1_unattended_kernel"}, started=STARTED + 2 * DAY))
    save(dataclasses.replace(other, fleet="gpu-a100"), tmp_path)  # another fleet, newer: not picked
    doc = load_previous(tmp_path, "gpu")
    assert doc is not None
    assert path.name.startswith("audit-gpu-20261203T080000")
    assert doc["started_at"] == newer.started_at.isoformat()
    assert load_previous(tmp_path, "gpu", before=newer.started_at)["started_at"] == older.started_at.isoformat()  # type: ignore[index]
    c = compare(doc, build_result({"gpu-3": "healthy"}, started=STARTED + 2 * DAY))
    assert ids(c.resolved) == [("gpu-3", "GPU-THM-001"), ("gpu-3", "GPU-THM-003")]


def test_broken_history_is_reported_with_the_file(tmp_path: Path) -> None:
    save(build_result({"gpu-1": "healthy"}), tmp_path)
    bad = tmp_path / "audit-gpu-20991231T000000000000Z.json"
    bad.write_text("{not json")
    warnings: list[str] = []
    assert load_previous(tmp_path, "gpu", warn=warnings.append) is not None  # skipped, the older one is used
    assert bad.name in warnings[0]
    bad.write_text(json.dumps({"schema": "gpufleet.audit/2", "hosts": []}))
    assert load_previous(tmp_path, "gpu", warn=warnings.append) is not None
    assert "audit/2" in warnings[1]
    with pytest.raises(HistoryError, match="unreadable finding"):
        compare({"hosts": [{"host": "a", "status": "ok", "findings": [{"id": "X"}]}]}, build_result({"a": "healthy"}))


def test_render_comparison() -> None:
    before = build_result({"gpu-1": "thermal", "gpu-2": "s1_unattended_kernel", "gpu-3": "memory_full"})
    now = build_result({"gpu-1": "healthy", "gpu-2": None, "gpu-3": "memory_full", "gpu-4": "thermal"})
    console = Console(record=True, width=160)
    render_comparison(compare(saved(before), now), console)
    text = console.export_text()
    assert text.startswith(
        "since the previous run (2026-12-02T08:00:00+00:00): 2 new, 2 resolved, 1 persisting, 5 unknown"
    )
    assert "  + gpu-4 GPU-THM-001 [warning]" in text
    assert "  - gpu-1 GPU-THM-001 [warning]" in text
    assert "unknown (host not probed this run; not counted as resolved)" in text
    assert "  ? gpu-2 GPU-DRV-001 [critical]" in text
    first = Console(record=True, width=160)
    render_comparison(Comparison(new=now.findings, resolved=(), persisting=(), unknown=()), first)
    assert "no previous run to compare with: 3 finding(s), all reported as new" in first.export_text()
