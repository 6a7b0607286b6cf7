"""The finding catalog, the Xid table and the Finding value type."""

from __future__ import annotations

import pytest

from remediation.core import catalog
from remediation.core.findings import Finding, Scenario, Severity, make_finding

# ID → (scenario, default severity), as the issue specifies them
EXPECTED = {
    "GPU-DRV-001": ("S1", "critical"),
    "GPU-DRV-002": ("S1", "critical"),
    "GPU-DRV-003": ("S1", "critical"),
    "GPU-DRV-004": ("S1", "critical"),
    "GPU-DRV-005": ("S1", "warning"),
    "GPU-DRV-006": ("S1", "critical"),
    "GPU-DRV-007": ("S1", "critical"),
    "GPU-DRV-008": ("S1", "critical"),
    "GPU-KRN-001": ("S1", "warning"),
    "GPU-KRN-002": ("S1", "warning"),
    "GPU-KRN-003": ("S1", "warning"),
    "GPU-KRN-004": ("S1", "warning"),
    "GPU-KRN-005": ("S1", "info"),
    "GPU-KRN-006": ("S1", "info"),
    "GPU-DKMS-001": ("S1", "warning"),
    "GPU-APT-001": ("S1", "warning"),
    "GPU-HW-001": ("S1", "critical"),
    "GPU-HW-002": ("S1", "critical"),
    "GPU-HW-003": ("S1", "critical"),
    "GPU-HW-004": ("S1", "critical"),
    "GPU-HW-005": ("S1", "warning"),
    "GPU-HW-006": ("S1", "critical"),
    "GPU-HW-007": ("S1", "critical"),
    "GPU-HW-008": ("S1", "critical"),
    "GPU-THM-001": ("S5", "warning"),
    "GPU-THM-002": ("S5", "critical"),
    "GPU-THM-003": ("S5", "warning"),
    "GPU-CFG-001": ("S5", "warning"),
    "GPU-MEM-001": ("S5", "warning"),
}


def test_catalog_has_exactly_the_specified_ids() -> None:
    from remediation.core.catalog import host

    # the host area's IDs exactly; every other area checks its own (tests/unit/test_<area>_*.py)
    assert {entry.id for entry in host.ENTRIES} == set(EXPECTED)
    assert set(EXPECTED) <= set(catalog.CATALOG)


@pytest.mark.parametrize("finding_id", sorted(EXPECTED))
def test_entry(finding_id: str) -> None:
    entry = catalog.get(finding_id)
    assert entry.id == finding_id
    assert (entry.scenario.value, entry.severity.value) == EXPECTED[finding_id]
    assert entry.title and entry.remedy
    for title, body in entry.runbook.sections():
        assert body.strip(), f"{finding_id}: empty runbook section {title}"


def test_s1_runbook_carries_the_real_commands() -> None:
    book = catalog.get("GPU-DRV-001").runbook
    assert "NvidiaGpuDriverLinux" in book.resolution and "Microsoft.HpcCompute" in book.resolution
    assert "apt-mark hold" in book.resolution
    assert '"linux-image"' in book.prevention and '"linux-headers"' in book.prevention
    assert "uname -r" in book.diagnosis
    assert "unattended-upgrades" in book.root_cause


def test_remedies_name_roles_or_tasks() -> None:
    assert catalog.get("GPU-KRN-002").remedy == "roles/gpu_kernel_hold"
    assert catalog.get("GPU-KRN-003").remedy == "roles/unattended_upgrades_blacklist"
    assert "{host}" in catalog.get("GPU-DRV-001").remedy


def test_get_unknown_names_the_id() -> None:
    with pytest.raises(KeyError, match="GPU-NOPE-999"):
        catalog.get("GPU-NOPE-999")


def test_xid_table_covers_the_common_codes() -> None:
    required = {
        8,
        13,
        31,
        32,
        38,
        43,
        44,
        45,
        48,
        56,
        57,
        58,
        61,
        62,
        63,
        64,
        68,
        69,
        73,
        74,
        79,
        92,
        94,
        95,
        109,
        110,
        119,
        120,
        121,
        136,
        137,
        140,
        143,
        *range(144, 151),
    }
    assert required <= set(catalog.XID_MEANINGS)
    assert set(catalog.XID_SEVERITY) == set(catalog.XID_MEANINGS)
    assert "fallen off the bus" in catalog.XID_MEANINGS[79]
    assert "double" in catalog.XID_MEANINGS[48].lower()


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120])
def test_critical_xids(code: int) -> None:
    assert catalog.xid_severity(code) is Severity.CRITICAL


@pytest.mark.parametrize("code", [13, 31, 43])
def test_warning_xids(code: int) -> None:
    assert catalog.xid_severity(code) is Severity.WARNING


def test_unlisted_xid_still_has_a_meaning() -> None:
    assert "999" in catalog.xid_meaning(999)
    assert catalog.xid_severity(999) is Severity.WARNING


def test_severity_rank_orders() -> None:
    assert Severity.INFO.rank < Severity.WARNING.rank < Severity.CRITICAL.rank
    assert Severity.worst([Severity.INFO, Severity.CRITICAL, Severity.WARNING]) is Severity.CRITICAL
    assert Severity.worst([]) is None
    assert Severity("critical") is Severity.CRITICAL and Scenario("S5") is Scenario.S5


def test_make_finding_fills_from_catalog_and_round_trips() -> None:
    f = make_finding("GPU-DRV-001", "no module", ["modprobe: FATAL: Module nvidia not found"], host="gpu-01")
    assert (f.scenario, f.severity, f.host) == (Scenario.S1, Severity.CRITICAL, "gpu-01")
    assert f.remedy == "invoke driver-restore --limit gpu-01"
    assert isinstance(f.evidence, tuple)
    doc = f.to_dict()
    assert set(doc) == {"id", "scenario", "severity", "summary", "evidence", "remedy", "host"}
    assert doc["scenario"] == "S1" and doc["severity"] == "critical" and isinstance(doc["evidence"], list)
    assert Finding.from_dict(doc) == f


def test_make_finding_severity_override_and_unknown_id() -> None:
    assert make_finding("GPU-HW-005", "x", ["l"], severity=Severity.CRITICAL).severity is Severity.CRITICAL
    with pytest.raises(KeyError):
        make_finding("GPU-XXX-000", "x", [])


def test_from_dict_rejects_string_evidence() -> None:
    doc = make_finding("GPU-HW-001", "lost", ["line"]).to_dict()
    doc["evidence"] = "line"
    with pytest.raises(ValueError, match="evidence"):
        Finding.from_dict(doc)
