"""A Spot GPU pool against the local ARM service: its headroom comes from the regional low-priority vCPU quota.

The stand-in serves an AgentPool with ``scaleSetPriority: Spot`` (checked against the vendored
Microsoft.ContainerService 2024-09-01 spec, where the property is an enum ``Spot | Regular``, default ``Regular``) and
the region's ``lowPriorityCores`` usage row ("Total Regional Low-priority vCPUs", the quota the Spot VMs of every
family share; Microsoft.Compute ``Usage_List``), and takes the Microsoft.Quota 2023-02-01 request for it (its
``resourceName`` is a free string in the spec). Sources are named in ``tests/unit/test_azure_spot_quota.py``.
"""

from __future__ import annotations

import json

from lab.services.arm import ArmService, Cluster, QuotaScript, TlsFiles, seed_spot, spot_pool
from remediation.azure.aks import pools_report
from remediation.azure.client import ArmClient
from remediation.azure.quota import quota_request_body, request_quota
from remediation.azure.run import quota_plan, quota_request
from remediation.azure.settings import AzureSettings
from tests.arm.armtest import GPU_USAGES, SUB, AzConfigs, invoke, make_client

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
    assert remedy == "request: invoke quota.request --location eastus --family lowPriorityCores --vcpus 88"

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


def test_quota_plan_spot_weighs_low_priority_cores_then_fits_after_the_request(arm: ArmService) -> None:
    # lowPriorityCores 40 of 64; the A100 family 72 of 96 and cores 200 of 350 (GPU_USAGES).
    seed_spot(arm, SUB, "eastus", low_priority=(40, 64), regular=GPU_USAGES)

    def client(_settings: AzureSettings, _sub: str | None) -> ArmClient:
        return make_client(arm)

    spot = quota_plan(AzureSettings(), location="eastus", vm_size="Standard_NC24ads_A100_v4", nodes=2, spot=True,
                      client_factory=client)
    assert spot.spot and spot.regional is None and spot.exit_code == 1
    assert [(n.usage.name, n.usage.current, n.usage.limit, n.needed, n.new_total) for n in spot.needs] == [
        ("lowPriorityCores", 40, 64, 48, 88)]
    # The same nodes as regular VMs: family + cores, never lowPriorityCores.
    regular = quota_plan(AzureSettings(), location="eastus", vm_size="Standard_NC24ads_A100_v4", nodes=2,
                         client_factory=client)
    assert not regular.spot and [n.usage.name for n in regular.needs] == ["standardNCADSA100v4Family", "cores"]

    # The limit the plan names, requested through the stand-in, makes the same plan fit.
    arm.script_quota(QuotaScript("Succeeded", polls=1))
    assert request_quota(make_client(arm), "eastus", "lowPriorityCores", spot.family.new_total).outcome == "succeeded"
    after = quota_plan(AzureSettings(), location="eastus", vm_size="Standard_NC24ads_A100_v4", nodes=2, spot=True,
                       client_factory=client)
    assert after.fits and after.exit_code == 0 and after.family.usage.limit == 88


def test_quota_plan_spot_in_a_region_without_the_row_has_a_limit_of_0(arm: ArmService) -> None:
    # The fixture's region lists GPU_USAGES only: no lowPriorityCores row, so no Spot vCPUs.
    p = quota_plan(AzureSettings(), location="eastus", vm_size="Standard_NC24ads_A100_v4", gpus=1, spot=True,
                   client_factory=lambda _s, _sub: make_client(arm))
    assert [(n.usage.name, n.usage.limit, n.new_total, n.fits) for n in p.needs] == [("lowPriorityCores", 0, 24, False)]
    assert p.exit_code == 1


def test_quota_plan_spot_from_the_cli(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    seed_spot(arm, SUB, "eastus", low_priority=(40, 64), regular=GPU_USAGES)
    run = invoke(["quota.plan", "--location", "eastus", "--vm-size", "Standard_NC24ads_A100_v4", "--nodes", "2",
                  "--spot", "--format", "json"], az_configs.logged_in, tls)
    assert run.rc == 1, run.err
    doc = json.loads(run.out)
    assert doc["spot"] is True and doc["vcpus"] == 48
    assert doc["quotas"] == [{"quota": "lowPriorityCores", "currentValue": 40, "limit": 64, "needed": 48,
                              "newTotal": 88, "fits": False, "limitUnderThreshold": 110,
                              "description": "regional low-priority (Spot) vCPUs, lowPriorityCores"}]
    table = invoke(["quota.plan", "--location", "eastus", "--vm-size", "Standard_NC24ads_A100_v4", "--nodes", "2",
                    "--spot"], az_configs.logged_in, tls)
    assert table.rc == 1, table.err
    assert "request: invoke quota.request --location eastus --family lowPriorityCores --vcpus 88 " in table.out
    assert "--family standardNCADSA100v4Family" not in table.out
