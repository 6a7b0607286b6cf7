"""The quota and aks tasks as on-call runs them: ``invoke`` with the ``az`` login (a test service principal of a test
cloud registered in AZURE_CONFIG_DIR), azure-cli-core, MSAL and the token endpoint all real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.services.arm import ArmService, Cluster, QuotaScript, TlsFiles
from tests.arm.armtest import ROOT, SUB, AzConfigs, invoke

FIXTURES = ROOT / "tests" / "fixtures" / "azure"


def test_show_with_the_az_login(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    issued = arm.tokens_issued
    run = invoke(["quota.show", "--location", "East US", "--format", "json"], az_configs.logged_in, tls)
    assert run.rc == 1, run.err  # standardNDSv2Family at 83 %
    doc = json.loads(run.out)
    assert doc["subscription"] == SUB and doc["location"] == "eastus"
    flagged = {u["name"] for u in doc["usages"] if u["flagged"]}
    assert flagged == {"standardNDSv2Family"}
    assert [f["id"] for f in doc["findings"]] == ["AZ-QUOTA-001"]
    assert arm.tokens_issued >= issued  # MSAL asked the test tenant (or reused its cached token)
    assert all(r.authorized for r in arm.arm_requests())


def test_show_prom_parses_and_carries_the_ratio(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles,
                                                 tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "textfile" / "gpufleet-azure-quota.prom"
    run = invoke(["quota.show", "--location", "eastus", "--format", "prom", "--out", str(out)],
                 az_configs.logged_in, tls)
    assert run.rc == 1 and run.out == "", run.err
    families = {f.name: f for f in text_string_to_metric_families(out.read_text())}
    ratio = {s.labels["quota"]: s.value for s in families["gpufleet_azure_quota_used_ratio"].samples}
    assert ratio["standardNDSv2Family"] == pytest.approx(40 / 48, rel=1e-5)
    assert {s.labels["kind"] for s in families["gpufleet_azure_quota_usage_vcpus"].samples} == {"gpu-family",
                                                                                                "regional"}
    assert families["gpufleet_azure_quota_threshold_ratio"].samples[0].value == 0.8


@pytest.mark.parametrize("name", ["usages-rest.json", "usages-az-cli.json"])
def test_show_from_file_needs_no_login(name: str, arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    run = invoke(["quota.show", "--from-file", str(FIXTURES / name), "--format", "json", "--family",
                  "STANDARDndsv2family"], az_configs.not_logged_in, tls)
    assert run.rc == 1, run.err
    doc = json.loads(run.out)
    assert [(u["name"], u["currentValue"], u["limit"], u["flagged"]) for u in doc["usages"]] == [
        ("standardNDSv2Family", 40, 48, True), ("cores", 288, 350, True)]
    assert arm.arm_requests() == []


def test_plan_from_gpus(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    run = invoke(["quota.plan", "--location", "eastus", "--vm-size", "standard_nc48ads_a100_v4", "--gpus", "3",
                  "--format", "json"], az_configs.logged_in, tls)
    assert run.rc == 1, run.err
    doc = json.loads(run.out)
    assert (doc["nodes"], doc["gpus"], doc["vcpus"]) == (2, 4, 96)  # 3 GPUs -> 2 VMs of 2 GPUs, 48 vCPUs each
    family = doc["quotas"][0]
    assert (family["quota"], family["newTotal"], family["fits"]) == ("standardNCADSA100v4Family", 168, False)
    assert doc["quotas"][1] == {"quota": "cores", "currentValue": 200, "limit": 350, "needed": 96,
                                "newTotal": 296, "fits": True, "limitUnderThreshold": 370}


def test_request_contact_support_exit_5(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    arm.script_quota(QuotaScript("Failed", polls=1, code="ContactSupport", message="Request failed, please contact"
                                 " support."))
    run = invoke(["quota.request", "--location", "eastus", "--family", "standardNDSv2Family", "--vcpus", "96",
                  "--yes"], az_configs.logged_in, tls)
    assert run.rc == 5, run.err
    assert len(run.errors) == 1 and "open a support request" in run.errors[0]
    assert len([r for r in arm.arm_requests() if r.method == "PUT"]) == 1


def test_request_succeeds_from_the_cli(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    run = invoke(["quota.request", "--location", "eastus", "--family", "standardncadsa100v4family", "--vcpus", "144",
                  "--yes"], az_configs.logged_in, tls)
    assert run.rc == 0, run.err
    assert "request for 144 succeeded; limit now 144" in " ".join(run.out.split())


def test_request_without_a_terminal_needs_yes(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    run = invoke(["quota.request", "--location", "eastus", "--family", "standardNDSv2Family", "--vcpus", "96"],
                 az_configs.logged_in, tls)
    assert run.rc == 2 and "pass --yes, or --check" in run.errors[0]
    assert arm.arm_requests() == []


def test_pools_from_the_cli(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    arm.add_cluster(SUB, "myRG", "myAKS", Cluster("eastus", [
        {"name": "gpunp", "vmSize": "Standard_NC24ads_A100_v4", "count": 3, "minCount": 1, "maxCount": 3,
         "enableAutoScaling": True, "nodeTaints": ["sku=gpu:NoSchedule"]}]))
    run = invoke(["aks.pools", "--cluster", "myAKS", "--resource-group", "myRG", "--format", "json"],
                 az_configs.logged_in, tls)
    assert run.rc == 1, run.err
    doc = json.loads(run.out)
    assert doc["pools"][0]["atMaxCount"] is True
    assert {f["id"] for f in doc["findings"]} == {"AZ-AKS-001", "AZ-AKS-003"}


# The bad inputs, through the CLI (the login ones can only be seen there); more in test_inputs_arm.py.
BAD_INPUT = [
    ("not-logged-in", ["quota.show", "--location", "eastus"], "not_logged_in", "run `az login`"),
    ("no-subscription", ["quota.show", "--location", "eastus"], "no_subscription",
     "run `az account set --subscription"),
    ("unknown-location", ["quota.show", "--location", "eastus9"], "logged_in", "unknown Azure location 'eastus9'"),
    ("unknown-family", ["quota.show", "--location", "eastus", "--family", "standardFooFamily"], "logged_in",
     "unknown quota family 'standardFooFamily'"),
    ("non-integer-limit", ["quota.request", "--location", "eastus", "--family", "standardNDSv2Family", "--vcpus",
                           "4.5", "--yes"], "logged_in", "--vcpus '4.5' is not a whole number"),
    ("negative-limit", ["quota.request", "--location", "eastus", "--family", "standardNDSv2Family", "--vcpus=-8",
                        "--yes"], "logged_in", "--vcpus -8 is negative"),
]


@pytest.mark.parametrize(("why", "args", "config", "message"), BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_nothing_sent(
    why: str, args: list[str], config: str, message: str, arm: ArmService, az_configs: AzConfigs, tls: TlsFiles
) -> None:
    tokens = arm.tokens_issued
    run = invoke(args, getattr(az_configs, config), tls)
    assert run.rc == 2, (why, run.out, run.err)
    assert len(run.errors) == 1 and message in run.errors[0], run.errors
    assert arm.requests == [] and arm.tokens_issued == tokens  # not even a token was asked for


def test_a_rejected_secret_is_a_login_error_without_the_secret(arm: ArmService, az_configs: AzConfigs,
                                                               tls: TlsFiles) -> None:
    run = invoke(["quota.show", "--location", "eastus"], az_configs.wrong_secret, tls)
    assert run.rc == 2 and "could not get an Azure token" in run.errors[0] and "az login" in run.errors[0]
    assert arm.arm_requests() == []
