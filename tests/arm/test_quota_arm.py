"""Quota through the product's ARM client against the local ARM service (request bodies checked against the spec)."""

from __future__ import annotations

import pytest

from lab.services.arm import ArmService, QuotaScript
from remediation.azure.errors import ArmError, AzureInputError, ContactSupportError, QuotaRequestFailed
from remediation.azure.quota import fetch_usages, quota_request_body, request_quota, usage_report
from tests.arm.armtest import SUB, TRANSCRIPT, make_client

FAMILY = "standardNCADSA100v4Family"


def _puts(arm: ArmService) -> list[object]:
    return [r for r in arm.arm_requests() if r.method == "PUT"]


def test_usages_follow_every_page_and_flag_the_threshold(arm: ArmService) -> None:
    arm.page_size = 2
    client = make_client(arm)
    usages = fetch_usages(client, "eastus")
    assert len(usages) == 5 and client.stats.requests == 3  # three pages, nextLink followed
    report = usage_report(usages, subscription=SUB, location="eastus", threshold_pct=80)
    assert [u.name for u in report.flagged] == ["standardNDSv2Family"]  # 40/48 = 83 %
    assert "standardDSv5Family" not in [u.name for u in report.rows]  # not a GPU family
    assert report.rows[-1].name == "cores" and report.exit_code == 1


def test_request_accepted_then_succeeded(arm: ArmService) -> None:
    arm.script_quota(QuotaScript("Succeeded", polls=2))
    client = make_client(arm)
    result = request_quota(client, "eastus", FAMILY, 144)
    assert result.outcome == "succeeded" and result.limit_after == 144 and result.polls == 3
    puts = _puts(arm)
    assert len(puts) == 1 and puts[0].body == quota_request_body(FAMILY, 144) and puts[0].status == 202
    polls = [r for r in arm.arm_requests() if "operationsStatus" in r.path]
    assert [r.status for r in polls] == [202, 202, 200]
    assert arm.usage(SUB, "eastus", FAMILY).limit == 144


def test_contact_support_is_its_own_exit_code_and_never_retried(arm: ArmService) -> None:
    arm.script_quota(QuotaScript("Failed", polls=1, code="ContactSupport",
                                 message="Request failed, please contact support."))
    with pytest.raises(ContactSupportError) as info:
        request_quota(make_client(arm), "eastus", "standardNDSv2Family", 96)
    TRANSCRIPT.append(str(info.value))
    assert info.value.exit_code == 5
    assert "open a support request" in str(info.value) and "ContactSupport" in str(info.value)
    assert len(_puts(arm)) == 1  # never retried
    assert arm.usage(SUB, "eastus", "standardNDSv2Family").limit == 48


def test_other_failures_exit_1_with_arms_code(arm: ArmService) -> None:
    arm.script_quota(QuotaScript("Invalid", polls=0, code="InvalidQuotaRequest", message="limit not allowed"))
    with pytest.raises(QuotaRequestFailed, match="ended Invalid: InvalidQuotaRequest: limit not allowed") as info:
        request_quota(make_client(arm), "eastus", FAMILY, 200)
    assert info.value.exit_code == 1


def test_already_sufficient_sends_no_put(arm: ArmService) -> None:
    result = request_quota(make_client(arm), "eastus", FAMILY, 96)
    assert result.outcome == "sufficient" and "nothing requested" in result.message
    assert _puts(arm) == [] and [r.method for r in arm.arm_requests()] == ["GET"]


def test_below_usage_is_refused_before_any_put(arm: ArmService) -> None:
    with pytest.raises(AzureInputError, match=r"below the current usage .*\(72 vCPUs in use\)"):
        request_quota(make_client(arm), "eastus", FAMILY, 48)
    assert _puts(arm) == []


def test_check_reads_but_does_not_request(arm: ArmService) -> None:
    result = request_quota(make_client(arm), "eastus", FAMILY, 144, check=True)
    assert result.outcome == "check" and result.body == quota_request_body(FAMILY, 144)
    assert _puts(arm) == []


def test_throttled_then_succeeded_waits_retry_after(arm: ArmService) -> None:
    arm.throttle("GET", r"/usages$", times=1, retry_after=1)
    client = make_client(arm)
    usages = fetch_usages(client, "eastus")
    assert usages and client.stats.throttled == 1 and client.stats.retried == 1
    gets = [r for r in arm.arm_requests() if r.path.endswith("/usages")]
    assert [r.status for r in gets] == [429, 200]
    assert gets[1].at - gets[0].at >= 0.95  # Retry-After: 1 honoured


def test_throttled_put_is_retried_and_succeeds(arm: ArmService) -> None:
    arm.throttle("PUT", r"/quotas/", times=1, retry_after=1)
    arm.fail_next("GET", r"/operationsStatus/", times=1, status=503)
    result = request_quota(make_client(arm), "eastus", FAMILY, 120)
    assert result.outcome == "succeeded"
    assert [r.status for r in _puts(arm)] == [429, 202]


def test_retry_after_beyond_the_cap_is_reported_not_slept(arm: ArmService) -> None:
    arm.throttle("GET", r"/usages$", times=1, retry_after=600)
    with pytest.raises(ArmError, match=r"429 TooManyRequests.*Retry-After 600 s") as info:
        fetch_usages(make_client(arm, max_retry_after_s=5), "eastus")
    TRANSCRIPT.append(str(info.value))
    assert info.value.exit_code == 3 and len(arm.arm_requests()) == 1


def test_the_service_refuses_a_body_the_spec_does_not_allow(arm: ArmService) -> None:
    client = make_client(arm)
    path = (f"/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/providers/Microsoft.Quota/quotas/"
            f"{FAMILY}")
    body = {"properties": {"limit": {"limitObjectType": "LimitValue", "value": 120},
                           "name": {"value": FAMILY, "localizedValue": "x"}, "provisioningState": "Succeeded"}}
    with pytest.raises(ArmError) as info:
        client.send("PUT", client.url(path, "2023-02-01"), body)
    assert info.value.status == 400 and info.value.code == "InvalidRequestContent"
    assert "localizedValue: read-only" in info.value.arm_message
    assert "provisioningState: not a property the spec defines" in info.value.arm_message


def test_wrong_api_version_and_missing_token_get_arms_errors(arm: ArmService) -> None:
    import requests

    client = make_client(arm)
    with pytest.raises(ArmError, match="InvalidApiVersionParameter"):
        client.get(f"/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/usages", "2023-01-01")
    raw = requests.get(f"{arm.endpoint}/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/usages"
                       "?api-version=2024-11-01", timeout=10)
    assert raw.status_code == 401 and raw.json()["error"]["code"] == "AuthenticationFailed"


def test_a_link_to_another_host_never_gets_the_token(arm: ArmService) -> None:
    client = make_client(arm)
    before = client.stats.requests
    with pytest.raises(ArmError, match="refusing to send Azure credentials"):
        client.send("GET", "https://127.0.0.2:9/subscriptions/x?api-version=1")
    assert client.stats.requests == before and client.session.credential.calls == 0
