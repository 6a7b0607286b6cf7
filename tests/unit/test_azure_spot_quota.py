"""Spot GPU pools draw on the regional low-priority vCPU quota, not their VM family's (issue 23, runbook S3).

Sources, as read for this change:

* The AgentPool property ``scaleSetPriority`` (enum ``Spot`` | ``Regular``, default ``Regular``; "Spot priority VMs
  will be used ... See spot on AKS") in the vendored Microsoft.ContainerService 2024-09-01 spec,
  ``lab/services/azure-specs/containerservice/.../aks/stable/2024-09-01/managedClusters.json`` (read below).
* Microsoft.Compute's usage list names the Spot quota ``lowPriorityCores`` ("Total Regional Low-priority vCPUs"),
  one per region for the Spot VMs of every family: public tools that read it from ``Usage_List`` /
  ``Get-AzVMUsage`` to check Spot capacity ("lowPriorityCores (spot quota) - shared across all VM families"), and
  ``az quota create --resource-name LowPriorityCores`` for raising it; Microsoft Learn "Add an Azure Spot node pool
  to an AKS cluster" (learn.microsoft.com/azure/aks/spot-node-pool) for the pool side (the
  ``kubernetes.azure.com/scalesetpriority`` label and taint).
* Microsoft.Quota 2023-02-01 (vendored ``quota.json``): ``resourceName`` is a free string ("SKU name for
  Microsoft.Compute"; "TotalLowPriorityCores for Microsoft.MachineLearningServices"), so ``--family
  lowPriorityCores`` goes through the same ``Quota_CreateOrUpdate`` as a family.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console

from remediation.azure.aks import NodePool, headroom_for, pool_from_dict
from remediation.azure.checks import pool_findings
from remediation.azure.quota import (
    LOW_PRIORITY_VCPUS,
    QuotaUsage,
    check_family,
    check_size,
    plan,
    quota_request_body,
)
from remediation.azure.report import plan_json, print_plan
from remediation.k8s.capacity import advise

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "lab" / "services" / "azure-specs"
AKS_SPEC = (SPECS / "containerservice" / "resource-manager" / "Microsoft.ContainerService" / "aks" / "stable"
            / "2024-09-01" / "managedClusters.json")
QUOTA_SPEC = SPECS / "quota" / "resource-manager" / "Microsoft.Quota" / "stable" / "2023-02-01" / "quota.json"

A100 = "Standard_NC24ads_A100_v4"  # 24 vCPUs, standardNCADSA100v4Family


def _usages(low: tuple[int, int] = (40, 64)) -> list[QuotaUsage]:
    return [
        QuotaUsage("cores", "Total Regional vCPUs", 200, 350),
        QuotaUsage("standardNCADSA100v4Family", "Standard NCADS_A100_v4 Family vCPUs", 72, 96),
        QuotaUsage(LOW_PRIORITY_VCPUS, "Total Regional Low-priority vCPUs", *low),
    ]


def _spot(name: str = "spotgpu", count: int = 0, max_count: int = 2) -> NodePool:
    return pool_from_dict({"name": name, "properties": {
        "vmSize": A100, "count": count, "minCount": 0, "maxCount": max_count, "enableAutoScaling": True,
        "scaleSetPriority": "Spot", "scaleSetEvictionPolicy": "Delete", "spotMaxPrice": -1,
        "nodeTaints": ["kubernetes.azure.com/scalesetpriority=spot:NoSchedule"]}})


def test_the_vendored_aks_spec_has_scale_set_priority_spot_default_regular() -> None:
    text = AKS_SPEC.read_text()  # upstream has one stray trailing comma: read the text, not JSON
    assert re.search(r'"scaleSetPriority":\s*\{\s*"\$ref":\s*"#/definitions/ScaleSetPriority"', text)
    enum = re.search(r'"ScaleSetPriority":\s*\{\s*"type":\s*"string",\s*"default":\s*"Regular",\s*"enum":\s*\[\s*'
                     r'"Spot",\s*"Regular"\s*\]', text)
    assert enum is not None


def test_the_quota_spec_takes_any_resource_name() -> None:
    spec = json.loads(QUOTA_SPEC.read_text())
    param = spec["parameters"]["ResourceName"] if "ResourceName" in spec["parameters"] else next(
        p for p in spec["parameters"].values() if p.get("name") == "resourceName")
    assert param["type"] == "string" and "enum" not in param and "TotalLowPriorityCores" in param["description"]
    assert check_family("lowprioritycores") == LOW_PRIORITY_VCPUS
    assert quota_request_body(LOW_PRIORITY_VCPUS, 112)["properties"]["name"] == {"value": "lowPriorityCores"}


def test_pool_reads_scale_set_priority() -> None:
    pool = _spot()
    assert pool.spot and pool.priority == "Spot" and pool.quota_name == LOW_PRIORITY_VCPUS
    assert pool.to_dict()["scaleSetPriority"] == "Spot"
    regular = pool_from_dict({"name": "r", "properties": {"vmSize": A100}})
    assert not regular.spot and regular.priority == "Regular"
    assert (regular.quota_name or "").lower() == "standardncadsa100v4family"


def test_spot_headroom_is_the_low_priority_quota_alone() -> None:
    # spotgpu may grow by 2 x 24 = 48 vCPUs; lowPriorityCores has 64 - 40 = 24 left: short by 24.
    regular = pool_from_dict({"name": "gpunp", "properties": {"vmSize": A100, "count": 3, "minCount": 1,
                                                              "maxCount": 4, "enableAutoScaling": True}})
    head = {h.usage.name: h for h in headroom_for([_spot(), regular], _usages())}
    low = head[LOW_PRIORITY_VCPUS]
    assert low.needed == 48 and low.pools == ("spotgpu",) and low.usage.free == 24 and not low.fits
    # The regular pool keeps its family and the regional total; the Spot pool counts in neither.
    assert head["standardNCADSA100v4Family"].needed == 24 and head["standardNCADSA100v4Family"].pools == ("gpunp",)
    assert head["cores"].needed == 24 and head["cores"].pools == ("gpunp",)
    found = [f for f in pool_findings("myAKS", [_spot(), regular], head.values(), "eastus") if f.id == "AZ-QUOTA-003"]
    assert len(found) == 1
    summary, remedy = found[0].summary, found[0].evidence[1]
    assert "low-priority (Spot) vCPU quota (lowPriorityCores)" in summary and "only 24 left" in summary
    assert remedy == "request: invoke quota.request --location eastus --family lowPriorityCores --vcpus 88"


def test_spot_pool_in_a_region_without_the_row_has_no_room() -> None:
    head = headroom_for([_spot()], [QuotaUsage("cores", "Total Regional vCPUs", 0, 350)])
    assert [(h.usage.name, h.usage.limit, h.needed, h.fits) for h in head] == [(LOW_PRIORITY_VCPUS, 0, 48, False)]


def test_spot_headroom_fits_while_the_family_is_full() -> None:
    # The A100 family has only 24 left; a Spot pool of +96 fits because lowPriorityCores has room.
    head = headroom_for([_spot(max_count=4)], _usages(low=(0, 200)))
    assert [(h.usage.name, h.needed, h.fits) for h in head] == [(LOW_PRIORITY_VCPUS, 96, True)]


def test_pending_capacity_names_the_low_priority_quota_for_a_spot_pool() -> None:
    # One more A100 node (24 vCPUs) on Spot: lowPriorityCores 48 of 64 has 16 left; the family and cores have room.
    advice = advise([_spot(count=2, max_count=3)], _usages(low=(48, 64)), pool="spotgpu", gpus_wanted=1,
                    gpus_per_node=1, cluster="myAKS", resource_group="myRG", location="eastus")
    assert advice.family == LOW_PRIORITY_VCPUS and advice.raise_ == ("quota",)
    assert any(line.startswith("Spot pool: low-priority quota lowPriorityCores: 48 of 64") for line in advice.lines)
    assert not any("family " in line.lower() or "total regional" in line for line in advice.lines)
    assert "invoke quota.request --location eastus --family lowPriorityCores --vcpus 72" in advice.commands
    # quota.plan --spot weighs the node against lowPriorityCores alone (without --spot it sums family + cores)
    plans = [c for c in advice.commands if c.startswith("invoke quota.plan")]
    assert plans == ["invoke quota.plan --location eastus --vm-size Standard_NC24ads_A100_v4 --nodes 1 --spot"]
    fits = advise([_spot(count=2, max_count=3)], _usages(low=(0, 64)), pool="spotgpu", gpus_wanted=1, gpus_per_node=1)
    assert fits.raise_ == () and any("fits" in line for line in fits.lines)


def test_a_regular_pool_keeps_family_and_regional() -> None:
    regular = pool_from_dict({"name": "gpunp", "properties": {"vmSize": A100, "count": 1, "maxCount": 4,
                                                              "enableAutoScaling": True}})
    advice = advise([regular], _usages(), pool="gpunp", gpus_wanted=1, gpus_per_node=1, location="eastus")
    assert (advice.family or "").lower() == "standardncadsa100v4family" and advice.raise_ == ()
    assert "invoke quota.plan --location eastus --vm-size Standard_NC24ads_A100_v4 --nodes 1" in advice.commands
    assert not any(c.endswith("--spot") for c in advice.commands)


def test_spot_plan_needs_a_request_on_the_low_priority_quota_alone() -> None:
    # 2 more A100 Spot VMs = 48 vCPUs: lowPriorityCores 40 of 64 -> 88, over; the family and cores are not weighed.
    p = plan(_usages(), "eastus", check_size(A100), 2, 2, 80, spot=True)
    assert p.spot and p.regional is None and p.vcpus == 48
    assert [(n.usage.name, n.usage.current, n.usage.limit, n.needed, n.new_total, n.fits) for n in p.needs] == [
        (LOW_PRIORITY_VCPUS, 40, 64, 48, 88, False)]
    assert not p.fits and p.exit_code == 1 and p.family.headroom_limit(80) == 110


def test_spot_plan_fits_while_the_family_is_full() -> None:
    # 3 more A100s = 72 vCPUs: the family (72 of 96) could not take them, lowPriorityCores (0 of 200) can.
    usages = _usages(low=(0, 200))
    regular = plan(usages, "eastus", check_size(A100), 3, 3, 80)
    assert not regular.fits and regular.family.usage.name == "standardNCADSA100v4Family"
    p = plan(usages, "eastus", check_size(A100), 3, 3, 80, spot=True)
    assert [(n.usage.name, n.new_total) for n in p.needs] == [(LOW_PRIORITY_VCPUS, 72)]
    assert p.fits and p.exit_code == 0


def test_spot_plan_in_a_region_without_the_row_has_a_limit_of_0() -> None:
    usages = [QuotaUsage("cores", "Total Regional vCPUs", 0, 350),
              QuotaUsage("standardNCADSA100v4Family", "Standard NCADS_A100_v4 Family vCPUs", 0, 96)]
    p = plan(usages, "eastus", check_size(A100), 1, 1, 80, spot=True)
    low = p.family.usage
    assert (low.name, low.localized, low.current, low.limit) == (
        LOW_PRIORITY_VCPUS, "Total Regional Low-priority vCPUs", 0, 0)
    assert p.needs == (p.family,) and p.family.new_total == 24 and not p.fits and p.exit_code == 1


def test_regular_plan_is_unchanged_by_the_spot_quota() -> None:
    # The lowPriorityCores row is in the usages, but regular VMs still draw on their family and cores only.
    p = plan(_usages(low=(0, 0)), "eastus", check_size(A100), 1, 1, 80)
    assert not p.spot
    assert [(n.usage.name, n.new_total, n.fits) for n in p.needs] == [
        ("standardNCADSA100v4Family", 96, True), ("cores", 224, True)]
    assert p.fits and p.exit_code == 0
    doc = json.loads(plan_json(p))
    assert doc["spot"] is False and [q["quota"] for q in doc["quotas"]] == ["standardNCADSA100v4Family", "cores"]
    assert all("description" not in q for q in doc["quotas"])


def test_spot_plan_report_names_the_spot_quota_and_the_request() -> None:
    p = plan(_usages(), "eastus", check_size(A100), 2, 2, 80, spot=True)
    doc = json.loads(plan_json(p))
    assert doc["spot"] is True and doc["fits"] is False and doc["vcpus"] == 48
    assert doc["quotas"] == [{"quota": "lowPriorityCores", "currentValue": 40, "limit": 64, "needed": 48,
                              "newTotal": 88, "fits": False, "limitUnderThreshold": 110,
                              "description": "regional low-priority (Spot) vCPUs, lowPriorityCores"}]
    out = io.StringIO()
    print_plan(Console(file=out, width=200, highlight=False), p)
    text = out.getvalue()
    assert "2 more Standard_NC24ads_A100_v4 Spot VMs" in text
    assert "= 48 vCPUs of lowPriorityCores in eastus (the regional low-priority (Spot) vCPUs; not" in text
    assert "regional low-priority (Spot) vCPUs, lowPriorityCores │ 40" in text  # the table's quota column
    assert "│ cores" not in text and "│ standardNCADSA100v4Family" not in text
    assert "request: invoke quota.request --location eastus --family lowPriorityCores --vcpus 88 " in text
    assert "--family standardNCADSA100v4Family" not in text and "--family cores" not in text
