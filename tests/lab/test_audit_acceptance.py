"""The audit issue's acceptance run, through the CLI: gpu-2 kernel-upgrade, gpu-3 thermal, gpu-4 xid-79,
gpu-5 unreachable. Every output format is checked with a real consumer (JSON, XSD, Prometheus parser)."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.faults import inject
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
FAULTS = {"gpu-2": "kernel-upgrade", "gpu-3": "thermal", "gpu-4": "xid-79", "gpu-5": "unreachable"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("acceptance"), "127.0.41", 5)
    try:
        for host, fault in FAULTS.items():
            inject(lab, host, fault)
        yield lab
    finally:
        lab.down(purge=True)


def audit(lab, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    invoke = ROOT / ".venv/bin/invoke"
    return subprocess.run(
        [str(invoke) if invoke.exists() else "invoke", "audit", "--inventory", str(lab.cfg.inventory_path), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=180,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.mark.parametrize("fmt", ["json", "junit", "prom"])
def test_history_keeps_a_machine_format_on_stdout_one_document(fleet, tmp_path: Path, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """With --history and no --out, stdout is the document alone; the comparison goes to stderr."""
    env = {"INVOKE_AUDIT_HISTORY_DIR": str(tmp_path / "history")}
    for run in (1, 2):
        r = audit(fleet, "--format", fmt, "--history", env=env)
        assert r.returncode == 1, r.stderr
        if fmt == "json":
            assert json.loads(r.stdout)["hosts"]
        elif fmt == "junit":
            assert ET.fromstring(r.stdout).tag == "testsuites"  # noqa: S314 - our own report
        else:
            from prometheus_client.parser import text_string_to_metric_families

            assert any(f.name == "gpufleet_nvml_ok" for f in text_string_to_metric_families(r.stdout))
        said = "no previous run to compare with" if run == 1 else "since the previous run"
        assert said in r.stderr and said not in r.stdout
    assert len(list((tmp_path / "history").glob("audit-*.json"))) == 2


def test_table_names_each_problem_and_exits_1(fleet) -> None:  # type: ignore[no-untyped-def]
    r = audit(fleet)
    assert r.returncode == 1, r.stderr
    rows: dict[str, str] = {}
    current = None
    for line in r.stdout.splitlines():
        if line.startswith("│ gpu-"):
            current = line.split()[1]
            rows[current] = line
        elif current and line.startswith("│ "):
            rows[current] += "\n" + line  # a wrapped row
        else:
            current = None
    assert "not loaded" in rows["gpu-2"] or "driver_not_loaded" in rows["gpu-2"]
    assert "GPU-DRV-001" in rows["gpu-2"]
    assert "86" in rows["gpu-3"] and "GPU-THM" in rows["gpu-3"]
    assert "GPU-HW-001" in rows["gpu-4"] and "1/2" in rows["gpu-4"]
    assert "unreachable" in rows["gpu-5"]
    assert "linux-image-6.5.0-45-generic" in r.stdout and "unattended-upgrade" in r.stdout


def test_json_report(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "audit.json"
    r = audit(fleet, "--format", "json", "--out", str(out))
    assert r.returncode == 1
    doc = json.loads(out.read_text())
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["gpu-5"]["status"] == "unreachable" and hosts["gpu-5"]["facts"] is None
    drv = next(f for f in hosts["gpu-2"]["findings"] if f["id"] == "GPU-DRV-001")
    assert drv["severity"] == "critical" and drv["scenario"] == "S1"
    assert any("linux-image-6.5.0-45-generic" in e and "unattended-upgrade" in e for e in drv["evidence"])
    assert hosts["gpu-2"]["facts"]["system"]["kernel"] == "6.5.0-45-generic"


def test_junit_validates_against_its_schema(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import xmlschema

    out = tmp_path / "audit.xml"
    assert audit(fleet, "--format", "junit", "--out", str(out)).returncode == 1
    xmlschema.XMLSchema(str(ROOT / "tests/fixtures/schemas/junit.xsd")).validate(str(out))
    root = ET.parse(out).getroot()  # noqa: S314 - our own report, just written
    failed = {(tc.get("classname"), tc.get("name")) for tc in root.iter("testcase") if tc.find("failure") is not None}
    assert any(c == "gpu-2" and "GPU-DRV-001" in (n or "") for c, n in failed)
    errors = [tc for tc in root.iter("testcase") if tc.find("error") is not None]
    assert errors and all(tc.get("classname") == "gpu-5" for tc in errors)


def test_prometheus_textfile_parses(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "gpufleet.prom"
    assert audit(fleet, "--format", "prom", "--out", str(out)).returncode == 1
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(out.read_text())
        for s in family.samples
    }
    assert samples[("gpufleet_nvml_ok", (("host", "gpu-2"),))] == 0
    assert samples[("gpufleet_nvml_ok", (("host", "gpu-1"),))] == 1
    assert samples[("gpufleet_audit_host_up", (("host", "gpu-5"),))] == 0
    temps = {labels: v for (name, labels), v in samples.items() if name == "gpufleet_gpu_temperature_celsius"}
    assert any(
        dict(labels)["host"] == "gpu-3" and dict(labels)["gpu"] == "0" and v == 86 for labels, v in temps.items()
    )


def test_incident_report_for_gpu2_has_the_five_sections_with_evidence(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "incident.md"
    assert audit(fleet, "--format", "md", "--limit", "gpu-2", "--out", str(out)).returncode == 1
    text = out.read_text()
    positions = [text.find(f"## {s}") for s in ("Symptoms", "Diagnosis", "Root cause", "Resolution", "Prevention")]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)
    root_cause = text[positions[2] : positions[3]]
    assert "linux-image-6.5.0-45-generic" in root_cause and "unattended-upgrade" in root_cause
    assert "6.5.0-45-generic" in text[positions[1] : positions[2]]
