"""The request bodies the product builds, validated against the Azure REST specs in lab/services/azure-specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.services.armspec import SpecSet
from remediation.azure.extension import ExtensionConfig
from remediation.azure.quota import quota_request_body

SPECS = Path(__file__).resolve().parents[2] / "lab" / "services" / "azure-specs"
QUOTA = "quota/resource-manager/Microsoft.Quota/stable/2023-02-01/quota.json"
VM = "compute/resource-manager/Microsoft.Compute/ComputeRP/stable/2024-11-01/virtualMachine.json"
EXT = ("/subscriptions/{subscriptionId}/resourceGroups/{resourceGroupName}/providers/Microsoft.Compute/"
       "virtualMachines/{vmName}/extensions/{vmExtensionName}")


@pytest.fixture(scope="module")
def specs() -> SpecSet:
    return SpecSet(SPECS)


def test_quota_put_body_matches_the_spec_and_its_example(specs: SpecSet) -> None:
    schema = specs.body_schema(QUOTA, "/{scope}/providers/Microsoft.Quota/quotas/{resourceName}", "put")
    assert schema is not None
    body = quota_request_body("standardNCADSA100v4Family", 48)
    assert specs.validate(body, *schema, request=True) == []
    examples = QUOTA.rsplit("/", 1)[0] + "/examples/"
    example = specs.example(examples + "putMachineLearningServicesQuotaRequestLowPriority.json")
    sent = example["parameters"]["createQuotaRequest"]["properties"]
    assert sent["limit"].keys() == body["properties"]["limit"].keys()
    assert body["properties"]["name"] == {"value": "standardNCADSA100v4Family"}


def test_extension_put_body_matches_the_spec(specs: SpecSet) -> None:
    schema = specs.body_schema(VM, EXT, "put")
    assert schema is not None
    body = ExtensionConfig("1.9", {"updateOS": False, "installCUDA": True}).body("eastus")
    assert specs.validate(body, *schema, request=True) == []


def test_the_validator_catches_what_arm_would_not_accept(specs: SpecSet) -> None:
    schema = specs.body_schema(QUOTA, "/{scope}/providers/Microsoft.Quota/quotas/{resourceName}", "put")
    assert schema is not None
    wrong = {"properties": {"limit": {"limitObjectType": "LimitValue", "value": 2**31}, "name": {"value": 7},
                            "unit": "Count"}}
    errors = specs.validate(wrong, *schema, request=True)
    assert any("out of int32 range" in e for e in errors)
    assert any("name.value: expected a string" in e for e in errors)
    assert any("unit: read-only" in e for e in errors)
    missing = {"properties": {"limit": {"limitObjectType": "LimitValue"}}}
    assert any("required property 'value'" in e for e in specs.validate(missing, *schema, request=True))


def test_aks_spec_with_its_stray_comma_loads(specs: SpecSet) -> None:
    aks = "containerservice/resource-manager/Microsoft.ContainerService/aks/stable/2024-09-01/managedClusters.json"
    assert specs.api_version(aks) == "2024-09-01"
