"""The probe's output mode: the Prometheus textfile computed from the facts, and the atomic output files.

Every rendering is parsed back with prometheus_client's own parser, so a malformed line, a bad escape or a
duplicated HELP/TYPE fails here and not in node_exporter.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import parser as prometheus_parser

ROOT = Path(__file__).resolve().parents[2]
PROBE_DIR = ROOT / "remediation" / "hostside"
PROBE = PROBE_DIR / "gpuprobe"  # the package directory: ``python3 PROBE`` runs its __main__.py
FIXTURES = ROOT / "tests" / "fixtures" / "facts"
sys.path.insert(0, str(PROBE_DIR))
import gpuprobe  # noqa: E402

# The names the controller-side renderer uses too (a rename is a breaking change for dashboards and alerts).
METRICS = {
    "gpufleet_nvml_ok": ("gauge", {"host"}),
    "gpufleet_nvml_error": ("gauge", {"host", "error_class"}),
    "gpufleet_gpu_count": ("gauge", {"host"}),
    "gpufleet_gpu_temperature_celsius": ("gauge", {"host", "gpu", "uuid"}),
    "gpufleet_gpu_memory_used_bytes": ("gauge", {"host", "gpu", "uuid"}),
    "gpufleet_gpu_memory_total_bytes": ("gauge", {"host", "gpu", "uuid"}),
    "gpufleet_gpu_clocks_event_reasons": ("gauge", {"host", "gpu"}),
    "gpufleet_gpu_ecc_uncorrected_volatile_total": ("counter", {"host", "gpu"}),
    "gpufleet_gpu_remap_pending": ("gauge", {"host", "gpu"}),
    "gpufleet_kernel_held": ("gauge", {"host", "kernel"}),
    "gpufleet_driver_info": ("gauge", {"host", "version"}),
    "gpufleet_kernel_nvidia_module": ("gauge", {"host", "kernel", "booted"}),
    "gpufleet_unattended_upgrades_enabled": ("gauge", {"host"}),
    "gpufleet_reboot_required": ("gauge", {"host"}),
    "gpufleet_probe_timestamp_seconds": ("gauge", {"host"}),
    "gpufleet_probe_duration_seconds": ("gauge", {"host"}),
}


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse with prometheus_client; key by the sample name as written (counters keep their _total)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(parsed: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matches = [v for lab, v in parsed.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(matches) == 1, f"{name}{labels}: {parsed.get(name)}"
    return matches[0]


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.json")))
def test_every_fixture_renders_names_labels_and_types_of_the_contract(name: str) -> None:
    text = gpuprobe.render_prometheus(fixture(name), "gpu-7")
    families = list(prometheus_parser.text_string_to_metric_families(text))
    assert families
    for family in families:
        written = family.name + ("_total" if family.type == "counter" else "")
        assert written in METRICS, written
        kind, labels = METRICS[written]
        assert family.type == kind
        for sample in family.samples:
            assert sample.name == written
            assert set(sample.labels) == labels, (written, sample.labels)
            assert sample.labels["host"] == "gpu-7"
    # HELP and TYPE once per family, before its samples
    lines = text.splitlines()
    for family in families:
        written = family.name + ("_total" if family.type == "counter" else "")
        help_at = lines.index(next(x for x in lines if x.startswith(f"# HELP {written} ")))
        type_at = lines.index(f"# TYPE {written} {family.type}")
        first = min(i for i, x in enumerate(lines) if x.startswith(written + "{"))
        assert help_at < type_at < first
        assert sum(x.startswith(f"# TYPE {written} ") for x in lines) == 1
    assert text.endswith("\n")


def test_healthy_host_values() -> None:
    facts = fixture("healthy")
    parsed = samples(gpuprobe.render_prometheus(facts))
    host = facts["hostname"]
    assert value(parsed, "gpufleet_nvml_ok", host=host) == 1
    assert "gpufleet_nvml_error" not in parsed
    assert value(parsed, "gpufleet_gpu_count", host=host) == 4
    gpu0 = facts["nvml"]["gpus"][0]
    assert value(parsed, "gpufleet_gpu_temperature_celsius", gpu="0", uuid=gpu0["uuid"]) == 33
    assert value(parsed, "gpufleet_gpu_memory_used_bytes", gpu="0") == gpu0["memory"]["used"]
    assert value(parsed, "gpufleet_gpu_memory_total_bytes", gpu="0") == 85899345920
    assert value(parsed, "gpufleet_gpu_clocks_event_reasons", gpu="0") == 1
    assert value(parsed, "gpufleet_driver_info", version="535.183.01") == 1
    assert value(parsed, "gpufleet_unattended_upgrades_enabled") == 1
    assert value(parsed, "gpufleet_reboot_required") == 0
    # 2026-12-02T08:00:00Z, 26 ms
    assert value(parsed, "gpufleet_probe_timestamp_seconds") == 1796198400
    assert value(parsed, "gpufleet_probe_duration_seconds") == pytest.approx(0.026)


def test_s1_host_reports_the_error_class_and_the_booted_kernel_without_module() -> None:
    facts = fixture("s1_unattended_kernel")
    parsed = samples(gpuprobe.render_prometheus(facts))
    assert value(parsed, "gpufleet_nvml_ok") == 0
    assert parsed["gpufleet_nvml_error"] == [
        ({"host": facts["hostname"], "error_class": "driver_not_loaded"}, 1.0)
    ]
    assert "gpufleet_gpu_count" not in parsed  # NVML never answered: no count rather than a false 0
    booted = facts["system"]["kernel"]
    assert value(parsed, "gpufleet_kernel_nvidia_module", kernel=booted, booted="true") == 0
    assert value(parsed, "gpufleet_kernel_held", kernel=booted) == 0
    # NVML is down: the driver version comes from the installed driver package
    assert value(parsed, "gpufleet_driver_info", version=facts["packages"]["driver_package_version"]) == 1


def test_predictive_one_series_per_installed_kernel_and_hold() -> None:
    facts = fixture("predictive_newer_kernel")
    parsed = samples(gpuprobe.render_prometheus(facts))
    series = {(lab["kernel"], lab["booted"]): v for lab, v in parsed["gpufleet_kernel_nvidia_module"]}
    assert series == {
        ("6.5.0-44-generic", "false"): 1,
        ("6.5.0-45-generic", "true"): 1,
        ("6.5.0-46-generic", "false"): 0,  # the next boot would come up without a driver
    }
    assert value(parsed, "gpufleet_kernel_held", kernel="6.5.0-45-generic") == 1


def test_ecc_and_pending_remap_per_gpu() -> None:
    parsed = samples(gpuprobe.render_prometheus(fixture("ecc_pending_remap")))
    assert value(parsed, "gpufleet_gpu_ecc_uncorrected_volatile_total", gpu="2") == 1
    assert value(parsed, "gpufleet_gpu_remap_pending", gpu="2") == 1
    assert value(parsed, "gpufleet_gpu_remap_pending", gpu="0") == 0


def test_thermal_gpu_temperature() -> None:
    parsed = samples(gpuprobe.render_prometheus(fixture("thermal")))
    assert max(v for _, v in parsed["gpufleet_gpu_temperature_celsius"]) == 86


@pytest.mark.parametrize(
    "raw", ['quote"d', "back\\slash", "new\nline", 'all\\"\n\\n', "ünïcode", "{brace}=,", " "]
)
def test_label_values_are_escaped_and_parse_back(raw: str) -> None:
    facts = fixture("s1_unattended_kernel")
    facts["nvml"]["error_class"] = raw
    text = gpuprobe.render_prometheus(facts, host=raw)
    for line in text.splitlines():
        assert line.startswith(("#", "gpufleet_"))  # a newline in a value never splits a sample
    parsed = samples(text)
    assert parsed["gpufleet_nvml_error"] == [({"host": raw, "error_class": raw}, 1.0)]


def test_help_text_escaping() -> None:
    assert gpuprobe.prom_escape_help("a\\b\nc") == "a\\\\b\\nc"


def test_a_document_from_a_crashed_probe_still_renders() -> None:
    doc = {"schema": gpuprobe.SCHEMA, "hostname": "h", "collected_at": "2026-12-02T08:00:00Z", "errors": [{}]}
    parsed = samples(gpuprobe.render_prometheus(doc))
    assert value(parsed, "gpufleet_nvml_ok", host="h") == 0
    assert value(parsed, "gpufleet_nvml_error", error_class="other") == 1
    assert "gpufleet_kernel_nvidia_module" not in parsed


def test_write_atomic_replaces_with_mode_0644_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "gpufleet.prom"
    target.write_text("old\n")
    old_umask = os.umask(0o077)
    try:
        gpuprobe.write_atomic(str(target), "new\n")
    finally:
        os.umask(old_umask)
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["gpufleet.prom"]


def run_probe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(PROBE), "--root", str(root), "--skip-nvml", "--kernel-release", "6.5.0-44-generic", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_cli_writes_both_files_and_nothing_on_stdout(tmp_path: Path) -> None:
    facts, prom = tmp_path / "out" / "facts.json", tmp_path / "tf" / "gpufleet.prom"
    proc = run_probe(tmp_path, "--json-out", str(facts), "--prom-out", str(prom), "--host-label", "gpu-9")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    doc = json.loads(facts.read_text())
    assert doc["schema"] == gpuprobe.SCHEMA
    parsed = samples(prom.read_text())
    assert value(parsed, "gpufleet_nvml_ok", host="gpu-9") == 0
    assert value(parsed, "gpufleet_nvml_error", host="gpu-9", error_class="other") == 1
    for path, mode, dir_mode in ((facts, 0o600, 0o700), (prom, 0o644, 0o755)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
        assert stat.S_IMODE(path.parent.stat().st_mode) == dir_mode, path.parent  # created by the probe
        assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_cli_facts_file_is_private_whatever_the_umask_and_replaces_a_world_readable_one(tmp_path: Path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text("{}")
    facts.chmod(0o644)  # what earlier probes left on hosts
    old_umask = os.umask(0)
    try:
        proc = run_probe(tmp_path, "--json-out", str(facts))
    finally:
        os.umask(old_umask)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(facts.stat().st_mode) == 0o600
    assert json.loads(facts.read_text())["schema"] == gpuprobe.SCHEMA


def test_write_atomic_sets_the_mode_before_the_content_lands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real_fdopen = os.fdopen

    def spy(fd: int, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))  # before the first byte is written
        return real_fdopen(fd, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(gpuprobe.cli.os, "fdopen", spy)
    gpuprobe.write_atomic(str(tmp_path / "new" / "facts.json"), "kernel: NVRM: Xid\n", 0o600, 0o700)
    assert seen == [0o600]
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700


def test_textfile_carries_no_kernel_log_text() -> None:
    doc = {
        "schema": gpuprobe.SCHEMA, "hostname": "h", "collected_at": "2026-12-02T08:00:00Z",
        "nvml": {"ok": False, "error_class": "driver_not_loaded", "gpus": []},
        "kernel_log": {"source": "dmesg", "truncated": 0, "error": None,
                       "lines": ["[  5.1] NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, name=python3, GPU has fallen off"]},
    }
    text = gpuprobe.render_textfile(doc, "gpu-1")
    assert "NVRM" not in text and "Xid" not in text and "python3" not in text and "fallen" not in text
    assert 'gpufleet_nvml_ok{host="gpu-1"} 0' in text.splitlines()


def test_cli_without_output_files_keeps_printing_json(tmp_path: Path) -> None:
    proc = run_probe(tmp_path)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["schema"] == gpuprobe.SCHEMA


def test_cli_unwritable_output_is_exit_1_and_the_other_file_is_still_written(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    facts = tmp_path / "facts.json"
    proc = run_probe(tmp_path, "--json-out", str(facts), "--prom-out", str(blocker / "x.prom"))
    assert proc.returncode == 1
    assert "cannot write" in proc.stderr and "x.prom" in proc.stderr
    assert json.loads(facts.read_text())["schema"] == gpuprobe.SCHEMA
