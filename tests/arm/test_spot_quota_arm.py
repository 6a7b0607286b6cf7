"""A Spot GPU pool against the local ARM service: its headroom comes from the regional low-priority vCPU quota.

The stand-in serves an AgentPool with ``scaleSetPriority: Spot`` (checked against the vendored
Microsoft.ContainerService 2024-09-01 spec, where the property is an enum ``Spot | Regular``, default ``Regular``) and
the region's ``lowPriorityCores`` usage row ("Total Regional Low-priority vCPUs", the quota the Spot VMs of every
family share; Microsoft.Compute ``Usage_List``), and takes the Microsoft.Quota 2023-02-01 request for it (its
``resourceName`` is a free string in the spec). Sources are named in ``tests/unit/test_azure_spot_quota.py``.
"""

from __future__ import annotations

from lab.services.arm import ArmService, Cluster, QuotaScript, seed_spot, spot_pool
from remediation.azure.aks import pools_report
from remediation.azure.quota import quota_request_body, request_quota
from remediation.azure.run import quota_request
from remediation.azure.settings import AzureSettings
from tests.arm.armtest import GPU_USAGES, SUB, make_client

REGULAR = {"name": "gpunp", "vmSize": "Standard_NC24ads_A100_v4", "count": 3, "minCount": 1, "maxCount": 4,
           "enableAutoScaling": True, "nodeTaints": ["sku=gpu:NoSchedule"]}


def test_spot_pool_headroom_comes_from_low_priority_cores(arm: ArmService) -> None:
    # A100 family: 72 of 96 used (24 left); lowPriorityCores: 40 of 64 used (24 left).
    seed_spot(arm, SUB, "eastus", low_priority=(40, 64), regular=GPU_USAGES)
    arm.add_cluster(SUB, "myRG", "spotAKS", Cluster("eastus", [
        REGULAR,  # +1 node = 24 vCPUs of the family and of cores: fits
        spot_pool("spotgpu", "Standard_NC24ads_A100_v4", count=0, max_count=2),  # +48 low-priority vCPUs
    ]))
    report = pools_report(make_client(arm), "spotAKS", "myRG")
    pools = {p.name: p for p in report.pools}
    assert pools["spotgpu"].spot and pools["spotgpu"].priority == "Spot" and not pools["gpunp"].spot
    head = {h.usage.name: h for h in report.headroom}
    low = head["lowPriorityCores"]
    assert (low.usage.current, low.usage.limit, low.needed, low.pools, low.fits) == (40, 64, 48, ("spotgpu",), False)
    assert low.usage.localized == "Total Regional Low-priority vCPUs"
    # The regular pool keeps the family and the regional total; the Spot pool is in neither.
    assert head["standardNCADSA100v4Family"].pools == ("gpunp",) and head["standardNCADSA100v4Family"].fits
    assert head["cores"].pools == ("gpunp",) and head["cores"].needed == 24
    quota = [f for f in report.findings if f.id == "AZ-QUOTA-003"]
    assert len(quota) == 1 and "lowPriorityCores" in quota[0].summary
    remedy = quota[0].evidence[1]
    assert remedy == "request: invoke quota.request --location eastus --family lowPriorityCores --limit 88"

    # The printed remedy works: the same Quota_CreateOrUpdate, resourceName lowPriorityCores, body checked by the spec.
    arm.script_quota(QuotaScript("Succeeded", polls=1))
    result = request_quota(make_client(arm), "eastus", "lowPriorityCores", 88)
    assert result.outcome == "succeeded" and result.family == "lowPriorityCores" and result.limit_after == 88
    puts = [r for r in arm.arm_requests() if r.method == "PUT"]
    assert len(puts) == 1 and puts[0].path.endswith("/providers/Microsoft.Quota/quotas/lowPriorityCores")
    assert puts[0].body == quota_request_body("lowPriorityCores", 88)
    assert arm.usage(SUB, "eastus", "lowPriorityCores").limit == 88
    after = pools_report(make_client(arm), "spotAKS", "myRG")
    assert not [f for f in after.findings if f.id == "AZ-QUOTA-003"]


def test_quota_request_cli_path_takes_low_priority_cores(arm: ArmService) -> None:
    seed_spot(arm, SUB, "eastus", low_priority=(40, 64), regular=GPU_USAGES)
    result = quota_request(AzureSettings(), location="eastus", family="LowPriorityCores", limit=88, check=True,
                           client_factory=lambda _s, _sub: make_client(arm))
    assert result.outcome == "check" and result.family == "lowPriorityCores" and result.current == 40
