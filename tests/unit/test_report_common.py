"""The audit the report tests render: the JSON facts fixtures through the real checks, plus one unreachable host.

Imported by the other ``test_report_*`` modules (and ``test_history``); its own tests cover the derived values
every format shows (:mod:`remediation.report.hostview`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from remediation.core.checks import run_fleet_checks
from remediation.core.facts import HostFacts, facts_from_dict
from remediation.core.findings import Finding
from remediation.host.audit import AuditOptions, AuditResult, HostAudit, policy_for
from remediation.report import hostview
from remediation.transport.fanout import Status
from remediation.transport.inventory import Host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FACTS = FIXTURES / "facts"
JUNIT_XSD = FIXTURES / "schemas" / "junit.xsd"

STARTED = _dt.datetime(2026, 12, 2, 8, 0, 0, tzinfo=_dt.UTC)

# inventory name -> facts fixture (None: unreachable)
FLEET: dict[str, str | None] = {
    "gpu-1": "healthy",
    "gpu-2": "s1_unattended_kernel",
    "gpu-3": "thermal",
    "gpu-4": "xid79_lost",
    "gpu-5": None,
    "gpu-6": "version_mismatch",
    "gpu-7": "predictive_newer_kernel",
    "gpu-8": "memory_full",
    "gpu-9": "ecc_pending_remap",
}
UNREACHABLE_ERROR = "NoValidConnectionsError: [Errno None] Unable to connect to port 22 on 127.0.1.5"
S1_HOST = "gpu-2"
THERMAL_HOST = "gpu-3"
DOWN_HOST = "gpu-5"


def host_vars(name: str) -> dict[str, Any]:
    if name == "gpu-8":
        return {"azure_vm_size": "Standard_NC96ads_A100_v4"}  # 4 GPUs, from the SKU table
    if name == "gpu-9":
        return {}  # expected count unknown
    return {"gpu_expected_count": 4, "nvidia_driver_expected_version": "535.183.01"}


def load_facts(fixture: str, host: str) -> HostFacts:
    return facts_from_dict(json.loads((FACTS / f"{fixture}.json").read_text()), host=host)


def build_result(
    fleet: Mapping[str, str | None] = FLEET,
    *,
    started: _dt.datetime = STARTED,
    edit: Callable[[str, Finding], Finding] | None = None,
) -> AuditResult:
    """An :class:`AuditResult` as ``run_audit`` builds it, from fixtures instead of SSH.

    ``edit(host, finding)`` may rewrite each finding (the property tests put arbitrary text into evidence).
    """
    hosts = [Host(name, "127.0.0.1", vars=host_vars(name)) for name in fleet]
    facts = {name: load_facts(fixture, name) for name, fixture in fleet.items() if fixture is not None}
    findings = run_fleet_checks(facts, policy_for(hosts, AuditOptions()))
    audits = []
    for i, h in enumerate(hosts):
        found = findings.get(h.name, ())
        if edit is not None:
            found = tuple(edit(h.name, f) for f in found)
        probed = h.name in facts
        audits.append(
            HostAudit(
                host=h.name,
                status=Status.OK if probed else Status.UNREACHABLE,
                facts=facts.get(h.name),
                findings=found,
                error=None if probed else UNREACHABLE_ERROR,
                seconds=0.25 + i / 100,
                vars=h.vars,
            )
        )
    return AuditResult("gpu", "inventories/lab/hosts.yml", started, 1.5, tuple(audits))


def with_evidence(text: str) -> Callable[[str, Finding], Finding]:
    """An ``edit`` for :func:`build_result`: every finding's summary and evidence carry ``text``."""

    def edit(host: str, f: Finding) -> Finding:
        return dataclasses.replace(f, summary=f"{f.summary} {text}", evidence=(*f.evidence, text, f"x{text}y"))

    return edit


# --- hostview ---------------------------------------------------------------------------------------------------


def test_fixture_fleet_shape() -> None:
    result = build_result()
    assert result.not_probed == [DOWN_HOST]
    assert result.host(S1_HOST).findings[0].id == "GPU-DRV-001"
    assert result.host("gpu-1").findings == ()


def test_driver_version_marks_package_when_nvml_down() -> None:
    result = build_result()
    s1 = result.host(S1_HOST).facts
    assert s1 is not None
    assert hostview.driver_version(s1) == hostview.DriverVersion("535.183.01", "package")
    healthy = result.host("gpu-1").facts
    assert healthy is not None
    assert hostview.driver_version(healthy) == hostview.DriverVersion("535.183.01", "nvml")


def test_booted_kernel_held() -> None:
    result = build_result()
    assert hostview.booted_kernel_held(result.host(S1_HOST).facts) is False  # type: ignore[arg-type]
    assert hostview.booted_kernel_held(result.host("gpu-1").facts) is True  # type: ignore[arg-type]


def test_expected_gpus_from_vars_sku_and_unknown() -> None:
    result = build_result()
    assert hostview.expected_gpus(result.host("gpu-1")) == 4
    assert hostview.expected_gpus(result.host("gpu-8")) == 4  # Standard_NC96ads_A100_v4
    assert hostview.expected_gpus(result.host("gpu-9")) is None


def test_expected_gpus_from_finding_evidence() -> None:
    result = build_result()
    h = result.host("gpu-9")
    hw2 = Finding.from_dict(
        {
            "id": "GPU-HW-002",
            "scenario": "S1",
            "severity": "critical",
            "summary": "3 of 8 GPUs visible",
            "evidence": ["NVML device count 3, expected 8"],
        }
    )
    assert hostview.expected_gpus(dataclasses.replace(h, findings=(hw2,))) == 8


def test_gpus_ok_and_max_temperature() -> None:
    result = build_result()
    thermal = result.host(THERMAL_HOST).facts
    lost = result.host("gpu-4").facts
    assert thermal is not None and lost is not None
    assert hostview.gpus_ok(thermal) == 4
    assert hostview.max_temperature(thermal) == 86
    assert hostview.gpus_ok(lost) == 3
