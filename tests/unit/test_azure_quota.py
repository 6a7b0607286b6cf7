"""Pure parts of remediation.azure: usages (both file shapes), plans, input checks, findings, reports, rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from remediation.azure.aks import NodePool, headroom_for, pool_from_dict
from remediation.azure.checks import pool_findings, quota_findings
from remediation.azure.client import arm_error_parts, retry_after_seconds
from remediation.azure.errors import AzureInputError
from remediation.azure.quota import (
    QuotaUsage,
    check_family,
    check_limit,
    check_size,
    plan,
    plan_counts,
    usage_report,
    usages_from_json,
    usages_from_text,
)
from remediation.azure.regions import normalize_location
from remediation.azure.report import quota_prometheus
from remediation.core import catalog, skus

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "azure"


def _usages() -> list[QuotaUsage]:
    return usages_from_json(json.loads((FIXTURES / "usages-rest.json").read_text()))


def test_rest_and_az_cli_shapes_read_the_same() -> None:
    rest = _usages()
    cli = usages_from_json(json.loads((FIXTURES / "usages-az-cli.json").read_text()))
    assert rest == cli
    a100 = next(u for u in rest if u.name == "standardNCADSA100v4Family")
    assert (a100.current, a100.limit, a100.pct, a100.free) == (72, 96, 75.0, 24)


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ({"values": []}, "not a usage list"),
        ([{"currentValue": "x", "limit": 1, "name": {"value": "cores"}}], "currentValue must be a whole number"),
        ([{"currentValue": 1, "limit": 1, "name": {}}], "has no name.value"),
        ([{"currentValue": True, "limit": 1, "name": {"value": "cores"}}], "must be a number"),
    ],
)
def test_malformed_usages_name_the_entry(doc: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        usages_from_json(doc)


def test_unreadable_file_is_bad_input() -> None:
    with pytest.raises(AzureInputError, match=r"usages\.json: .*--from-file takes"):
        usages_from_text("{not json", "usages.json")


def test_report_keeps_gpu_families_and_the_regional_total() -> None:
    report = usage_report(_usages(), subscription="s", location="eastus", threshold_pct=80)
    names = [u.name for u in report.rows]
    assert "standardDSv5Family" not in names and names[-1] == "cores"
    assert {u.name for u in report.flagged} == {"standardNDSv2Family", "cores"}  # 83 %, 82 %
    zero = next(u for u in report.rows if u.name == "standardNDSH100v5Family")
    assert zero.pct is None and not zero.at_or_over(80)
    assert math.isinf(QuotaUsage("x", "x", 4, 0).pct or 0)  # usage over a 0 limit is over any threshold
    only = usage_report(_usages(), subscription="s", location="eastus", threshold_pct=90, family="standardNDSv2Family")
    assert [u.name for u in only.rows] == ["standardNDSv2Family", "cores"] and only.exit_code == 0


def test_quota_findings_per_family_and_regional() -> None:
    report = usage_report(_usages(), subscription="s", location="eastus", threshold_pct=80)
    found = quota_findings(report.rows, 80, "eastus")
    assert sorted(f.id for f in found) == ["AZ-QUOTA-001", "AZ-QUOTA-002"]
    assert "40 of 48 vCPUs used (83 %; threshold 80 %)" in found[0].evidence[0]
    assert quota_findings(report.rows, 90, "eastus") == []


def test_plan_counts_and_totals() -> None:
    size = check_size("Standard_NC96ads_A100_v4")
    assert plan_counts(size, None, "5") == (2, 8)  # 5 GPUs -> 2 VMs of 4
    assert plan_counts(size, 3, None) == (3, 12)
    p = plan(_usages(), "eastus", size, 2, 8, 80)
    assert p.vcpus == 192 and p.family.new_total == 264 and not p.family.fits
    assert p.regional is not None and p.regional.new_total == 480 and not p.regional.fits
    assert p.family.headroom_limit(80) == 330 and p.exit_code == 1
    small = plan(_usages(), "eastus", check_size("Standard_NC24ads_A100_v4"), 1, 1, 80)
    assert small.fits and small.exit_code == 0


@pytest.mark.parametrize("bad", ["0", "-1", "x", "1.5"])
def test_plan_counts_refuse_bad_numbers(bad: str) -> None:
    with pytest.raises(AzureInputError, match="must be a whole number of at least 1"):
        plan_counts(check_size("Standard_NC24ads_A100_v4"), bad, None)


def test_input_checks() -> None:
    assert check_limit("48") == 48 and check_limit(0) == 0
    for bad, msg in (("-1", "negative"), ("4.5", "not a whole number"), ("", "not a whole number"),
                     (None, "not a whole number")):
        with pytest.raises(AzureInputError, match=msg):
            check_limit(bad)
    assert check_family("STANDARDNDSV2FAMILY") == "standardNDSv2Family"
    assert check_family("Cores") == "cores" and check_family(None) is None
    assert check_family("standardNCSv3Family") == "standardNCSv3Family"  # retired, still in usage lists
    with pytest.raises(AzureInputError, match="unknown quota family 'standardFooFamily'"):
        check_family("standardFooFamily")
    assert normalize_location("West Europe") == "westeurope"
    assert normalize_location("newregion1", extra=["NewRegion1"]) == "newregion1"
    for bad in ("eastus9", "", None):
        with pytest.raises(AzureInputError):
            normalize_location(bad)


def test_prometheus_textfile_parses() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    report = usage_report(_usages(), subscription='sub"1', location="eastus", threshold_pct=80)
    text = quota_prometheus(report)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    used = {s.labels["quota"]: s.value for s in families["gpufleet_azure_quota_used_ratio"].samples}
    assert "standardNDSH100v5Family" not in used  # limit 0: no ratio, never a made-up 0
    assert used["cores"] == pytest.approx(288 / 350, rel=1e-5)
    assert families["gpufleet_azure_quota_usage_vcpus"].samples[0].labels["subscription"] == 'sub"1'
    assert all(not line.split()[-1].isdigit() or len(line.split()) == 2 for line in text.splitlines()
               if not line.startswith("#"))  # no timestamps on samples


def test_alert_rule_uses_the_metric_and_the_threshold() -> None:
    rules = yaml.safe_load((ROOT / "monitoring/prometheus/gpufleet-azure-quota.rules.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert alerts["GpuFleetAzureQuotaHigh"]["expr"] == "gpufleet_azure_quota_used_ratio >= 0.8"
    assert "gpufleet_azure_quota_timestamp_seconds" in alerts["GpuFleetAzureQuotaMetricsStale"]["expr"]
    text = quota_prometheus(usage_report(_usages(), subscription="s", location="eastus", threshold_pct=80))
    for alert in alerts.values():
        metric = next(t for t in alert["expr"].replace("(", " ").split() if t.startswith("gpufleet_"))
        assert f"\n{metric}{{" in text


def test_pools_and_headroom() -> None:
    pool = pool_from_dict({"name": "gpunp", "properties": {"vmSize": "Standard_NC24ads_A100_v4", "count": 2,
                                                           "minCount": 1, "maxCount": 5, "enableAutoScaling": True,
                                                           "nodeTaints": ["sku=gpu:NoSchedule"],
                                                           "powerState": {"code": "Running"}}})
    assert pool.is_gpu and pool.gpu_tainted and pool.growth_nodes == 3 and not pool.at_max
    other = NodePool("b", "Standard_NC24ads_A100_v4", 0, 0, 1, True, (), "Running", "User", "Succeeded")
    head = {h.usage.name: h for h in headroom_for([pool, other], _usages())}
    assert head["standardNCADSA100v4Family"].needed == 96 and head["standardNCADSA100v4Family"].pools == ("gpunp", "b")
    found = pool_findings("c", [pool, other], head.values(), "eastus")
    assert sorted(f.id for f in found) == ["AZ-AKS-002", "AZ-AKS-003", "AZ-QUOTA-003", "AZ-QUOTA-003"]
    fixed = NodePool("n", "Standard_NC24ads_A100_v4", 3, 1, 3, False, (), "Running", "User", "Succeeded")
    assert not fixed.at_max and fixed.growth_nodes == 0  # no autoscaling: maxCount does not bind


def test_arm_helpers() -> None:
    assert arm_error_parts({"error": {"code": "C", "message": "M"}}) == ("C", "M")
    assert arm_error_parts({"code": "C", "message": "M"}) == ("C", "M")
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


AZ_IDS = {"AZ-QUOTA-001": "warning", "AZ-QUOTA-002": "warning", "AZ-QUOTA-003": "warning",
          "AZ-AKS-001": "warning", "AZ-AKS-002": "warning", "AZ-AKS-003": "info"}


def test_catalog_has_the_azure_entries() -> None:
    assert {i for i in catalog.CATALOG if i.startswith("AZ-")} == {*AZ_IDS, "AZ-SE-001"}
    se = catalog.get("AZ-SE-001")  # the platform's maintenance on a host the closed loop was to fix: S1's loop
    assert se.scenario.value == "S1" and "StartRequests" in se.runbook.resolution
    for fid, severity in AZ_IDS.items():
        entry = catalog.get(fid)
        assert entry.scenario.value == "S3" and entry.severity.value == severity
        assert all(text.strip() for _, text in entry.runbook.sections())
    assert "sku=gpu:NoSchedule" in catalog.get("AZ-AKS-002").runbook.symptoms
    assert "az quota create" in catalog.get("AZ-QUOTA-001").runbook.resolution


def test_size_table() -> None:
    for s in skus.SIZES.values():
        assert s.vcpus > 0 and s.gpu_count >= 1 and s.family and s.gpu_model, s
        assert skus.family_name(s.family.upper()) == s.family
        assert 0 < s.gpu_share <= 1
    assert skus.expected_gpu_count("Standard_NC48ads_A100_v4") == 2  # what the audit and the lab use
    assert skus.expected_gpu_count("standard_nd96isr_h100_v5") == 8
    assert skus.SIZES["Standard_NC24ads_A100_v4"].nvml.name == "NVIDIA A100 80GB PCIe"
    assert [s.name for s in skus.sizes_in_family("standardncadsa100v4family")] == [
        "Standard_NC24ads_A100_v4", "Standard_NC48ads_A100_v4", "Standard_NC96ads_A100_v4"]
    assert skus.is_gpu_family("standardNCSv3Family") and skus.is_gpu_family("standardNGADSV620v1Family")
    assert not skus.is_gpu_family("standardDSv5Family")
    with pytest.raises(KeyError, match="cannot simulate"):
        _ = skus.SIZES["Standard_ND96isr_H200_v5"].nvml
