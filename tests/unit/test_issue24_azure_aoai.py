"""Issue 24 (S3/S4): unknown is said, not made 0; placeholders are filled with the user's values or marked.

- a VM family with no row in the usages is unknown, not 0/0 (a Spot pool's missing ``lowPriorityCores`` stays 0);
- ``x-ms-region: East US`` is East US, not East;
- ``aoai.diagnose`` prints n/a / unknown and writes null where the input does not give a figure;
- suggested commands carry the user's region, cluster and resource group, ``<host>`` when no host is known; no
  Prometheus label is empty.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from remediation.aoai import text
from remediation.aoai.analysis import analyse
from remediation.aoai.report import render_analysis
from remediation.aoai.settings import AoaiSettings
from remediation.azure.aks import NodePool, PoolsReport, headroom_for
from remediation.azure.checks import pool_findings, quota_findings
from remediation.azure.quota import LOW_PRIORITY_VCPUS, check_size, plan, usage_report, usages_from_text
from remediation.azure.report import plan_json, pools_json, print_plan, print_pools, print_quota, quota_prometheus
from remediation.core.exitcodes import ExitCode
from remediation.core.findings import make_finding
from tests.unit.test_aoai_analysis import metric

ROOT = Path(__file__).resolve().parents[2]
# `az vm list-usage --location eastus -o json` (numbers as strings, localName): no H100 NCads v5 row in it
AZ_CLI_USAGES = (ROOT / "tests" / "fixtures" / "azure" / "usages-az-cli.json").read_text()
H100_NC = "Standard_NC40ads_H100_v5"  # StandardNCadsH100v5Family: not in the file
A100_NC = "Standard_NC24ads_A100_v4"  # StandardNCADSA100v4Family: 72 of 96 used in the file
S = AoaiSettings()


def _render(fn: Any, obj: Any) -> str:
    buf = io.StringIO()
    fn(Console(file=buf, width=200, highlight=False, color_system=None), obj)
    return buf.getvalue()


# --- 1. a family absent from the usages is unknown ------------------------------------------------------------


def test_a_family_without_a_usage_row_is_unknown_not_zero() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    p = plan(usages, "eastus", check_size(H100_NC), 1, 2, 80, source="usages.json")  # 40 vCPUs: cores fits
    assert not p.family.known and not p.fits and p.exit_code is ExitCode.BAD_INPUT
    assert p.family.unknown == (
        "no usage row for StandardNCadsH100v5Family in usages.json (eastus): run `invoke quota.show --location"
        " eastus` to see the families the region lists"
    )
    shown = _render(print_plan, p)
    assert "unknown: no usage row for StandardNCadsH100v5Family in usages.json (eastus)" in shown
    assert "request limit" not in shown and "quota.request" not in shown  # no limit asked on a made-up 0/0
    assert "fits: no quota request needed" not in shown
    doc = json.loads(plan_json(p))
    family = doc["quotas"][0]
    assert (family["currentValue"], family["limit"], family["fits"], family["newTotal"]) == (None, None, None, None)
    assert doc["fits"] is None and doc["quotas"][1]["quota"] == "cores" and doc["quotas"][1]["limit"] == 350


def test_a_family_with_a_row_still_plans_and_names_the_region() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    p = plan(usages, "eastus", check_size(A100_NC), 2, 2, 80, source="usages.json")
    assert p.family.known and not p.fits and p.exit_code is ExitCode.FINDINGS
    shown = _render(print_plan, p)
    assert "invoke quota.request --location eastus --family standardNCADSA100v4Family --vcpus 120" in shown
    offline = plan(usages, "", check_size(A100_NC), 2, 2, 80, source="usages.json")
    assert "--location <location> " in _render(print_plan, offline) and "LOCATION" not in _render(print_plan, offline)


def test_spot_missing_low_priority_row_stays_a_zero_limit() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    assert all(u.name != LOW_PRIORITY_VCPUS for u in usages)
    p = plan(usages, "eastus", check_size(A100_NC), 1, 1, 80, spot=True, source="usages.json")
    assert p.family.known and (p.family.usage.limit, p.family.usage.current) == (0, 0)
    assert not p.fits and p.exit_code is ExitCode.FINDINGS  # Azure offers no Spot vCPUs there: ask for them


def test_aks_headroom_of_a_family_without_a_row_is_unknown_and_no_finding() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    pool = NodePool("h100", H100_NC, 1, 1, 2, True, ("sku=gpu:NoSchedule",), "Running", "User", "Succeeded")
    head = headroom_for([pool], usages, "eastus")
    family = next(h for h in head if h.usage.name == "StandardNCadsH100v5Family")
    assert not family.known and "no usage row for StandardNCadsH100v5Family in eastus" in family.unknown
    found = pool_findings("myAKS", [pool], head, "eastus", "myRG")
    assert [f.id for f in found if f.id == "AZ-QUOTA-003"] == []  # not "short" on an invented limit of 0
    report = PoolsReport("sub", "myRG", "myAKS", "eastus", (pool,), head, tuple(found))
    assert "quota StandardNCadsH100v5Family: unknown" in _render(print_pools, report)
    entry = next(h for h in json.loads(pools_json(report))["headroom"] if h["quota"] == "StandardNCadsH100v5Family")
    assert (entry["limit"], entry["fits"]) == (None, None) and entry["unknown"].startswith("no usage row")


# --- 2. x-ms-region keeps the whole value ---------------------------------------------------------------------

# A 429 from Azure OpenAI as `curl -i` shows it (headers of a real answer, ids shortened).
CURL_429 = """HTTP/1.1 429 Too Many Requests
Content-Length: 343
Content-Type: application/json
retry-after: 6
x-ratelimit-remaining-requests: 119
x-ratelimit-remaining-tokens: 0
x-ratelimit-reset-tokens: 6
policy-id: DeploymentRatelimit-Token
x-ms-region: East US
apim-request-id: 3f7c1a52-2f2e-4c38-9c86-b0d4e1f0c5a1
x-ms-client-request-id: 3f7c1a52-2f2e-4c38-9c86-b0d4e1f0c5a1
Strict-Transport-Security: max-age=31536000; includeSubDomains; preload
Date: Mon, 15 Jul 2024 08:14:02 GMT

{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-06-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."}}
"""  # noqa: E501


def test_x_ms_region_keeps_a_display_name_with_spaces() -> None:
    parsed = text.parse(CURL_429)
    assert parsed.region == "East US" and parsed.retry_after_seconds == 6 and parsed.limit_kind == "tokens"
    assert text.parse(CURL_429.replace("East US", "East US 2")).region == "East US 2"
    one_line = "429 Azure OpenAI x-ms-region=Sweden Central apim-request-id=abc retry-after=3"
    assert text.parse(one_line).region == "Sweden Central"
    httpcore = "(b'x-ms-region', b'West US'), (b'policy-id', b'DeploymentRatelimit-Token') 429 Azure OpenAI"
    assert text.parse(httpcore).region == "West US"
    assert text.parse("429 Azure OpenAI\nx-ms-region: eastus\n").region == "eastus"


# --- 3. aoai.diagnose says unknown, never 0 ------------------------------------------------------------------


def _export(*metrics: dict[str, Any]) -> str:
    return json.dumps({"cost": 0, "timespan": "2024-07-15T08:00:00Z/2024-07-15T08:10:00Z", "interval": "PT1M",
                       "value": list(metrics), "namespace": "Microsoft.CognitiveServices/accounts",
                       "resourceregion": "eastus"})


def test_tokens_only_export_has_no_answer_counts() -> None:
    export = _export(metric("TokenTransaction", [(m, 79_000.0) for m in range(4)], ModelDeploymentName="gpt-4o"))
    result = analyse(export, S, source="m.json")
    facts = result.facts
    assert (facts["answers"], facts["throttled"], facts["share_429_pct"]) == (None, None, None)
    assert facts["peak_offered_tokens"] is None and facts["peak_processed_tokens"] == 79_000
    assert facts["tpm_limit"] is None and facts["peak_vs_limit"] is None
    assert facts["retry_after"]["count"] is None and facts["retry_after"]["histogram"] is None
    minute = facts["minutes"][0]
    assert (minute["answers"], minute["throttled"], minute["share_429_pct"], minute["offered_tokens"]) == (
        None, None, None, None)
    assert minute["processed_tokens"] == 79_000
    shown = render_analysis(result)
    assert "answers: unknown, 429: unknown" in shown
    assert "Retry-After: n/a" in shown and "TPM limit unknown" in shown
    row = next(line for line in shown.splitlines() if line.startswith("2024-07-15T08:00Z"))
    assert row.split()[1:6] == ["n/a", "n/a", "n/a", "n/a", "79,000"]
    assert json.loads(json.dumps(result.to_dict()))["facts"]["answers"] is None


def test_requests_only_export_has_no_token_counts() -> None:
    export = _export(
        metric("AzureOpenAIRequests", [(m, 100.0) for m in range(3)], StatusCode="200"),
        metric("AzureOpenAIRequests", [(1, 40.0)], StatusCode="429"),
    )
    result = analyse(export, S, tpm_limit=80_000, source="m.json")
    facts = result.facts
    assert (facts["answers"], facts["throttled"]) == (340, 40)
    assert facts["peak_processed_tokens"] is None and facts["peak_offered_tokens"] is None
    assert facts["peak_vs_limit"] is None  # a limit, but nothing to set against it
    assert "peak: unknown (no token counts in this input)" in render_analysis(result)


def test_response_log_without_usage_and_without_retry_after() -> None:
    t0 = 1_721_030_400.0
    lines = [json.dumps({"time": t0 + i, "status": 200, "deployment": "gpt-4o"}) for i in range(5)]
    lines.append(json.dumps({"time": t0 + 70, "status": 429, "deployment": "gpt-4o",
                             "error": {"message": "Rate limit is exceeded."}}))
    result = analyse("\n".join(lines), S, source="log.jsonl")
    facts = result.facts
    assert facts["answers"] == 6 and facts["answers_without_tokens"] == 6
    assert facts["peak_processed_tokens"] is None and facts["peak_offered_tokens"] is None
    assert facts["retry_after"]["count"] == 0 and facts["retry_after"]["median_s"] is None
    shown = render_analysis(result)
    assert "Retry-After: none in this input" in shown and "peak: unknown" in shown
    assert re.search(r"^2024-07-15T08:00Z\s+5\s+0\s+0\s+n/a\s+n/a", shown, re.M), shown


def test_a_minute_without_answers_has_no_share() -> None:
    t0 = 1_721_030_400.0
    lines = [json.dumps({"time": t0, "status": 200, "usage": {"total_tokens": 500}}),
             json.dumps({"time": t0 + 130, "status": 429, "usage": {"total_tokens": 500}})]
    facts = analyse("\n".join(lines), S).facts
    assert [m["share_429_pct"] for m in facts["minutes"]] == [0.0, None, 100.0]


# --- 4. placeholders -----------------------------------------------------------------------------------------


def test_quota_show_remedy_names_the_users_region_and_family() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    report = usage_report(usages, subscription="sub", location="eastus", threshold_pct=80)
    remedies = {f.id: f.remedy for f in quota_findings(report.rows, 80, "eastus")}
    assert "LOCATION" not in " ".join(remedies.values())
    # cores 288 of 350: under 80 % needs a limit above 360
    assert remedies["AZ-QUOTA-002"].startswith("invoke quota.request --location eastus --family cores --vcpus 361")
    shown = _render(print_quota, report)
    assert "--location eastus" in shown and "LOCATION" not in shown and "FAMILY" not in shown


def test_pool_remedies_carry_cluster_resource_group_and_pool() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    pool = NodePool("gpunp", A100_NC, 5, 1, 5, True, ("sku=gpu:NoSchedule",), "Running", "User", "Succeeded")
    grow = NodePool("gpu2", A100_NC, 0, 0, 4, True, ("sku=gpu:NoSchedule",), "Running", "User", "Succeeded")
    head = headroom_for([pool, grow], usages, "eastus")
    found = {f.id: f for f in pool_findings("myAKS", [pool, grow], head, "eastus", "myRG")}
    assert found["AZ-AKS-001"].remedy.startswith(
        "az aks nodepool update --resource-group myRG --cluster-name myAKS --name gpunp"
        " --update-cluster-autoscaler --min-count 1 --max-count <new-max-count>"
    )
    assert found["AZ-QUOTA-003"].remedy.startswith("invoke quota.request --location eastus --family ")
    for f in found.values():
        assert not re.search(r"\b(LOCATION|FAMILY|CLUSTER|RG)\b|--cluster C\b|resource-group G\b", f.remedy), f


def test_prometheus_labels_are_never_empty() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    offline = quota_prometheus(usage_report(usages, subscription="", location="", threshold_pct=80,
                                            source="usages.json"))
    assert '=""' not in offline
    assert "\ngpufleet_azure_quota_threshold_ratio 0.8\n" in offline
    assert 'gpufleet_azure_quota_usage_vcpus{quota="cores",kind="regional"} 288' in offline
    named = quota_prometheus(usage_report(usages, subscription="sub", location="eastus", threshold_pct=80))
    assert 'gpufleet_azure_quota_usage_vcpus{subscription="sub",location="eastus",quota="cores",kind="regional"}' \
        in named


def test_host_template_is_filled_or_marked() -> None:
    assert make_finding("GPU-DRV-001", "s", ()).remedy == "invoke driver-restore --limit <host>"
    assert make_finding("GPU-DRV-001", "s", (), host="gpu-7").remedy == "invoke driver-restore --limit gpu-7"


def test_quota_plan_from_file_names_the_file_and_region(tmp_path: Path) -> None:
    from remediation.azure.run import quota_plan
    from remediation.azure.settings import AzureSettings

    path = tmp_path / "usages.json"
    path.write_text(AZ_CLI_USAGES)
    p = quota_plan(AzureSettings(), location="eastus", vm_size=H100_NC, nodes=1, from_file=str(path))
    assert p.exit_code is ExitCode.BAD_INPUT
    assert p.family.unknown.startswith(f"no usage row for StandardNCadsH100v5Family in {path} (eastus): run `invoke")
    offline = quota_plan(AzureSettings(), location=None, vm_size=H100_NC, nodes=1, from_file=str(path))
    assert "in " + str(path) + ": run `invoke quota.show --location <location>`" in offline.family.unknown


def test_pools_text_prints_the_filled_fix() -> None:
    usages = usages_from_text(AZ_CLI_USAGES, "usages.json")
    at_max = NodePool("gpunp", A100_NC, 3, 1, 3, True, ("sku=gpu:NoSchedule",), "Running", "User", "Succeeded")
    bare = NodePool("gpunp2", A100_NC, 0, 0, 0, True, (), "Running", "User", "Succeeded")
    head = headroom_for([at_max, bare], usages, "eastus")
    found = tuple(pool_findings("myAKS", [at_max, bare], head, "eastus", "myRG"))
    shown = _render(print_pools, PoolsReport("sub", "myRG", "myAKS", "eastus", (at_max, bare), head, found))
    assert ("    fix: az aks nodepool update --resource-group myRG --cluster-name myAKS --name gpunp"
            " --update-cluster-autoscaler --min-count 1 --max-count <new-max-count> (above 3;") in shown
    assert ("    fix: az aks nodepool update --resource-group myRG --cluster-name myAKS --name gpunp2"
            " --node-taints sku=gpu:NoSchedule;") in shown
