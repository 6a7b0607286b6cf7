"""Prometheus textfile: parsed back with prometheus_client, values checked against the fixtures' facts."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from test_report_common import DOWN_HOST, FACTS, S1_HOST, THERMAL_HOST, build_result, load_facts

from remediation.core.facts import facts_from_dict
from remediation.report.prometheus import METRICS, escape_label_value, render_host_prometheus, render_prometheus

PROBE = Path(__file__).resolve().parents[2] / "remediation" / "hostside" / "gpuprobe"


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, name: str, **labels: str) -> float:
    found = [s.value for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def absent(text: str, name: str, **labels: str) -> bool:
    return not [s for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def test_parses_with_help_and_type_for_every_family() -> None:
    text = render_prometheus(build_result())
    families = list(text_string_to_metric_families(text))
    assert families
    for family in families:
        declared = family.name if family.name in METRICS else f"{family.name}_total"
        kind, help_text = METRICS[declared]
        assert family.type == kind
        assert family.documentation == help_text
    assert text.endswith("\n")
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))  # each family once, its samples together


def test_temperature_equals_the_fixture() -> None:
    text = render_prometheus(build_result())
    raw = json.loads((FACTS / "thermal.json").read_text())
    for gpu in raw["nvml"]["gpus"]:
        got = value(text, "gpufleet_gpu_temperature_celsius", host=THERMAL_HOST, gpu=str(gpu["index"]))
        assert got == gpu["temperature_c"]
    assert value(text, "gpufleet_gpu_temperature_celsius", host=THERMAL_HOST, gpu="1") == 86
    uuid = raw["nvml"]["gpus"][1]["uuid"]
    assert value(text, "gpufleet_gpu_temperature_celsius", host=THERMAL_HOST, gpu="1", uuid=uuid) == 86
    assert value(text, "gpufleet_gpu_clocks_event_reasons", host=THERMAL_HOST, gpu="1") == 0x40


def test_memory_and_ecc_from_the_fixtures() -> None:
    text = render_prometheus(build_result())
    raw = json.loads((FACTS / "memory_full.json").read_text())["nvml"]["gpus"][0]["memory"]
    assert value(text, "gpufleet_gpu_memory_used_bytes", host="gpu-8", gpu="0") == raw["used"]
    assert value(text, "gpufleet_gpu_memory_total_bytes", host="gpu-8", gpu="0") == raw["total"]
    assert value(text, "gpufleet_gpu_ecc_uncorrected_volatile_total", host="gpu-9", gpu="2") == 1
    assert value(text, "gpufleet_gpu_ecc_uncorrected_volatile_total", host="gpu-9", gpu="0") == 0


def test_host_up_status_and_nvml() -> None:
    text = render_prometheus(build_result())
    assert value(text, "gpufleet_audit_host_up", host="gpu-1") == 1
    assert value(text, "gpufleet_audit_host_up", host=DOWN_HOST) == 0
    assert value(text, "gpufleet_audit_host_status", host=DOWN_HOST, status="unreachable") == 1
    assert value(text, "gpufleet_audit_host_status", host=DOWN_HOST, status="ok") == 0
    assert value(text, "gpufleet_nvml_ok", host=S1_HOST) == 0
    assert value(text, "gpufleet_nvml_ok", host="gpu-1") == 1
    assert absent(text, "gpufleet_nvml_ok", host=DOWN_HOST)  # unknown is absent, not 0
    assert absent(text, "gpufleet_gpu_temperature_celsius", host=DOWN_HOST)


def test_gpu_counts() -> None:
    text = render_prometheus(build_result())
    assert value(text, "gpufleet_gpu_count", host="gpu-1") == 4
    assert absent(text, "gpufleet_gpu_count", host=S1_HOST)  # NVML down: no device count
    assert value(text, "gpufleet_nvml_error", host=S1_HOST, error_class="driver_not_loaded") == 1
    assert absent(text, "gpufleet_nvml_error", host="gpu-1")
    assert value(text, "gpufleet_gpu_count", host="gpu-4") == 4  # nvmlDeviceGetCount still lists the lost GPU
    assert value(text, "gpufleet_gpu_ok", host="gpu-4", gpu="3") == 0
    assert sum(s.value for s in samples(text) if s.name == "gpufleet_gpu_ok" and s.labels["host"] == "gpu-4") == 3
    assert value(text, "gpufleet_gpu_expected_count", host="gpu-4") == 4
    assert value(text, "gpufleet_gpu_expected_count", host=DOWN_HOST) == 4
    assert absent(text, "gpufleet_gpu_expected_count", host="gpu-9")


def test_kernel_and_driver() -> None:
    text = render_prometheus(build_result())
    assert value(text, "gpufleet_kernel_held", host=S1_HOST, kernel="6.5.0-45-generic") == 0
    assert value(text, "gpufleet_kernel_held", host="gpu-1", kernel="6.5.0-45-generic") == 1
    assert value(text, "gpufleet_kernel_nvidia_module", host=S1_HOST, kernel="6.5.0-45-generic", booted="true") == 0
    assert value(text, "gpufleet_kernel_nvidia_module", host=S1_HOST, kernel="6.5.0-44-generic", booted="false") == 1
    assert value(text, "gpufleet_driver_info", host=S1_HOST, version="535.183.01") == 1  # the package's version
    assert value(text, "gpufleet_driver_info", host="gpu-6", version="535.216.01") == 1
    assert value(text, "gpufleet_unattended_upgrades_enabled", host=S1_HOST) == 1
    assert value(text, "gpufleet_reboot_required", host="gpu-7") == 1
    assert value(text, "gpufleet_gpu_remap_pending", host="gpu-9", gpu="2") == 1
    assert value(text, "gpufleet_gpu_remap_pending", host="gpu-9", gpu="0") == 0


def test_findings_per_host_and_totals() -> None:
    result = build_result()
    text = render_prometheus(result)
    for h in result.hosts:
        for f in h.findings:
            labels = {"host": h.host, "id": f.id, "severity": f.severity.value, "scenario": f.scenario.value}
            assert value(text, "gpufleet_finding", **labels) == 1
    n = sum(1 for s in samples(text) if s.name == "gpufleet_finding")
    assert n == len(result.findings)
    assert value(text, "gpufleet_audit_findings", severity="critical") == 7
    assert value(text, "gpufleet_audit_findings", severity="warning") == 12
    assert value(text, "gpufleet_audit_findings", severity="info") == 4
    assert value(text, "gpufleet_audit_timestamp_seconds") == result.started_at.timestamp()
    assert value(text, "gpufleet_audit_duration_seconds") == 1.5


def test_same_finding_twice_is_one_sample_counting_two() -> None:
    result = build_result({THERMAL_HOST: "thermal"})
    h = result.host(THERMAL_HOST)
    result = dataclasses.replace(result, hosts=(dataclasses.replace(h, findings=(*h.findings, h.findings[0])),))
    text = render_prometheus(result)
    labels = {"host": THERMAL_HOST, "id": "GPU-THM-001", "severity": "warning", "scenario": "S5"}
    assert value(text, "gpufleet_finding", **labels) == 2


def test_host_textfile_uses_the_same_names() -> None:
    facts = load_facts("s1_unattended_kernel", "gpu-s1-01")
    result = build_result({S1_HOST: "s1_unattended_kernel"})
    text = render_host_prometheus(facts, result.host(S1_HOST).findings, expected_gpus=4)
    assert value(text, "gpufleet_nvml_ok", host="gpu-s1-01") == 0
    assert value(text, "gpufleet_gpu_expected_count", host="gpu-s1-01") == 4
    assert value(text, "gpufleet_finding", host="gpu-s1-01", id="GPU-DRV-001", severity="critical", scenario="S1") == 1
    assert facts.collected_at is not None
    assert value(text, "gpufleet_probe_timestamp_seconds", host="gpu-s1-01") == facts.collected_at.timestamp()
    assert absent(text, "gpufleet_audit_host_up")
    fleet_names = {s.name for s in samples(render_prometheus(build_result()))}
    assert {s.name for s in samples(text)} <= fleet_names


def load_probe() -> ModuleType:
    """remediation/hostside/gpuprobe/, the package the on-host timer runs, loaded on its own under another name (not
    as remediation.hostside.gpuprobe)."""
    name = "gpuprobe_for_report_tests"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, PROBE / "__init__.py", submodule_search_locations=[str(PROBE)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its relative imports find their package there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fixture", sorted(p.stem for p in FACTS.glob("*.json")))
def test_same_metrics_as_the_probe_timer(fixture: str) -> None:
    """Every metric both producers write has the same type, HELP, label names and values."""
    probe = load_probe()
    doc = json.loads((FACTS / f"{fixture}.json").read_text())
    theirs = {f.name: f for f in text_string_to_metric_families(probe.render_prometheus(doc, host="h1"))}
    ours = {
        f.name: f for f in text_string_to_metric_families(render_host_prometheus(facts_from_dict(doc), (), host="h1"))
    }
    shared = set(theirs) & set(ours)
    assert shared >= {"gpufleet_nvml_ok", "gpufleet_driver_info", "gpufleet_kernel_held"}, sorted(theirs)
    for name in sorted(shared):
        assert (ours[name].type, ours[name].documentation) == (theirs[name].type, theirs[name].documentation), name
        mine = sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in ours[name].samples)
        probe_side = sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in theirs[name].samples)
        assert mine == probe_side, name


def test_the_probes_metrics_are_defined_once() -> None:
    """Every metric the probe's timer writes is in METRICS with the probe's own type and HELP (PROM_METRICS), in the
    probe's order."""
    probe = load_probe()
    probe_names = [name for name, _, _ in probe.PROM_METRICS]
    assert [name for name in METRICS if name in probe_names] == probe_names
    for name, kind, help_text in probe.PROM_METRICS:
        assert METRICS[name] == (kind, help_text), name


def test_label_escaping() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=40))
@example('"} 1\ngpufleet_nvml_ok{host="evil"} 0\n# TYPE x')
@example('\\\\n\\"\r\x00')
def test_any_label_value_round_trips(text: str) -> None:
    facts = load_facts("thermal", "gpu-3")
    host = f"h{text}"
    result = build_result({THERMAL_HOST: "thermal"})
    h = result.host(THERMAL_HOST)
    f = dataclasses.replace(h.findings[0], id=f"GPU-THM-001{text}", summary=text, evidence=(text,))
    out = render_host_prometheus(facts, (f,), host=host)
    assert value(out, "gpufleet_nvml_ok", host=host) == 1
    assert value(out, "gpufleet_finding", host=host, id=f"GPU-THM-001{text}") == 1
    assert value(out, "gpufleet_gpu_temperature_celsius", host=host, gpu="1") == 86


def test_lone_surrogates_cannot_make_the_file_unwritable() -> None:
    assert escape_label_value("a\ud800b").encode() == "a\ufffdb".encode()
