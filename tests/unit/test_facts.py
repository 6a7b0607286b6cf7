"""facts_from_dict: the one boundary between the probe's JSON and typed facts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from remediation.core.errors import ProbeError
from remediation.core.facts import HostFacts, facts_from_dict

try:  # shared helper; importable as a package module or (pytest prepend mode) by file name
    from tests.unit.test_probe_host import run_probe
except ImportError:  # pragma: no cover
    from test_probe_host import run_probe  # type: ignore[no-redef]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_every_fixture_parses() -> None:
    for path in sorted(FIXTURES.glob("*.json")):
        f = facts_from_dict(json.loads(path.read_text()))
        assert isinstance(f, HostFacts) and f.host == f.hostname


def test_typed_sections() -> None:
    f = facts_from_dict(load("s1_unattended_kernel"), host="inventory-name")
    assert f.host == "inventory-name" and f.hostname == "gpu-s1-01"
    assert f.system.kernel == "6.5.0-45-generic"
    assert f.system.boot_time is not None and f.system.boot_time.year == 2026
    assert f.nvml.failed and f.nvml.error_class == "driver_not_loaded" and f.nvml.error_code == 9
    assert f.booted_kernel is not None and not f.booted_kernel.has_nvidia_module
    assert f.packages.kernel("6.5.0-44-generic").nvidia_module.version == "535.183.01"  # type: ignore[union-attr]
    assert f.packages.driver_package_version == "535.183.01"
    assert "linux-image-generic" in f.packages.kernel_meta_names
    assert f.unattended_upgrades.enabled and f.unattended_upgrades.package_blacklist == ()
    tx = [t for t in f.apt_transactions if t.actor == "unattended-upgrade"]
    assert tx and tx[-1].start == "2026-12-02 03:14:07"
    assert f.kernel_log.module_missing  # the modprobe line was parsed
    assert f.raw["hostname"] == "gpu-s1-01"


def test_gpu_fields() -> None:
    f = facts_from_dict(load("thermal"))
    gpu = f.nvml.gpus[1]
    assert gpu.temperature_c == 86 and gpu.thresholds.slowdown == 89
    assert gpu.clocks_event_reasons == ("hw_thermal_slowdown",)
    assert gpu.memory is not None and gpu.memory.total == 85899345920
    assert dict(gpu.clocks_mhz)["graphics"] == 210
    lost = facts_from_dict(load("xid79_lost")).nvml.gpus[3]
    assert not lost.ok and lost.error_class == "gpu_lost" and lost.memory is None


@pytest.mark.parametrize("schema", ["gpufleet.facts/2", "gpufleet.facts/0", "gpufleet.facts/10.1"])
def test_unknown_major_version_names_host_and_version(schema: str) -> None:
    doc = load("healthy")
    doc["schema"] = schema
    with pytest.raises(ProbeError, match=rf"host gpu-healthy-01: facts schema '{schema}'"):
        facts_from_dict(doc)


def test_newer_minor_version_and_unknown_fields_are_accepted() -> None:
    doc = load("healthy")
    doc["schema"] = "gpufleet.facts/1.4"
    doc["future_section"] = {"x": 1}
    assert facts_from_dict(doc).schema == "gpufleet.facts/1.4"


@pytest.mark.parametrize("bad", [None, "other/1", 1])
def test_not_a_facts_document(bad: Any) -> None:
    doc = load("healthy")
    doc["schema"] = bad
    with pytest.raises(ProbeError, match="host gpu-healthy-01"):
        facts_from_dict(doc)
    with pytest.raises(ProbeError, match="host h1: probe output is not a JSON object"):
        facts_from_dict([], host="h1")  # type: ignore[arg-type]


def test_wrong_types_name_the_field() -> None:
    doc = load("healthy")
    doc["nvml"]["gpus"][0]["temperature_c"] = "hot"
    with pytest.raises(ProbeError, match=r"host gpu-healthy-01: facts field 'nvml.gpus\[0\].temperature_c'"):
        facts_from_dict(doc)


def test_failed_sections_become_unavailable_values() -> None:
    doc = load("healthy")
    for section in ("packages", "unattended_upgrades", "apt_history", "kernel_log", "dpkg_lock", "nvml"):
        doc[section] = None
    doc["errors"] = [{"section": "packages", "error": "OSError: boom"}]
    f = facts_from_dict(doc)
    assert not f.packages.available and f.packages.kernels == ()
    assert not f.unattended_upgrades.available and not f.unattended_upgrades.enabled
    assert f.apt_transactions == () and f.kernel_log.xid_events == ()
    assert f.dpkg_lock.held is None
    assert f.nvml.failed and f.nvml.error_class == "other"
    assert f.errors[0].section == "packages"


def test_real_probe_output_on_this_controller() -> None:
    doc = run_probe("--root", "/nonexistent")
    f = facts_from_dict(doc, host="controller")
    assert f.nvml.failed
    assert f.system.kernel and f.system.boot_id
