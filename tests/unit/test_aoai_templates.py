"""The S4 templates: metric alerts and the APIM backend pool, built as data; the checked-in copies match."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from remediation.aoai import templates
from remediation.core.errors import TemplateError

ACCOUNT = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.CognitiveServices/accounts/contoso"


def test_checked_in_templates_are_what_the_code_builds(tmp_path: object) -> None:
    assert (templates.TEMPLATES / templates.ALERTS_FILE).read_text() == templates.render_json(
        templates.metric_alerts_template()
    )
    assert (templates.TEMPLATES / templates.APIM_FILE).read_text() == templates.render_json(templates.apim_template())
    assert (templates.TEMPLATES / templates.POLICY_FILE).read_text() == templates.apim_policy()


def test_alerts_watch_tokens_at_80_percent_and_429s() -> None:
    doc = json.loads(templates.render_json(templates.metric_alerts_template()))
    assert doc["parameters"]["alertPercent"]["defaultValue"] == 80
    tokens, throttled = (r["properties"]["criteria"]["allOf"][0] for r in doc["resources"])
    assert tokens["metricName"] == "TokenTransaction" and tokens["timeAggregation"] == "Total"
    assert "parameters('alertPercent')" in tokens["threshold"] and "parameters('tpmLimit')" in tokens["threshold"]
    assert throttled["metricName"] == "AzureOpenAIRequests"
    assert {"name": "StatusCode", "operator": "Include", "values": ["429"]} in throttled["dimensions"]
    for resource in doc["resources"]:
        assert resource["type"] == "Microsoft.Insights/metricAlerts"
        assert resource["properties"]["scopes"] == ["[parameters('accountResourceId')]"]
        assert resource["properties"]["criteria"]["odata.type"].endswith("SingleResourceMultipleMetricCriteria")
    used = {p for r in json.dumps(doc["resources"]).split("parameters('")[1:] for p in [r.split("'")[0]]}
    assert used <= set(doc["parameters"])  # every parameter the resources name is declared


def test_apim_pool_with_circuit_breakers_honouring_retry_after() -> None:
    doc = templates.apim_template()
    backends = [r for r in doc["resources"] if r["type"].endswith("/backends")]
    breakers = [b["properties"]["circuitBreaker"]["rules"][0] for b in backends if "circuitBreaker" in b["properties"]]
    assert len(breakers) == 2
    assert all(
        rule["acceptRetryAfter"] and {"min": 429, "max": 429} in rule["failureCondition"]["statusCodeRanges"]
        for rule in breakers
    )
    pool = next(b for b in backends if b["properties"].get("type") == "Pool")
    assert [(s["id"], s["priority"]) for s in pool["properties"]["pool"]["services"]] == [
        ("/backends/aoai-primary", 1),
        ("/backends/aoai-secondary", 2),
    ]
    policy = next(r for r in doc["resources"] if r["type"].endswith("/policies"))["properties"]
    root = ET.fromstring(policy["value"])  # noqa: S314 - our own generated XML, checked to be well-formed
    assert root.find("inbound/set-backend-service").get("backend-id") == "aoai-pool"  # type: ignore[union-attr]
    assert "429" in root.find("backend/retry").get("condition")  # type: ignore[union-attr,operator]


def test_parameters_and_their_validation() -> None:
    params = templates.alert_parameters(ACCOUNT, "gpt-4o-prod", 80_000)["parameters"]
    assert params["tpmLimit"] == {"value": 80_000} and params["deploymentName"] == {"value": "gpt-4o-prod"}
    with pytest.raises(TemplateError, match="--account-id"):
        templates.alert_parameters("/subscriptions/s/resourceGroups/rg", "d", 1)
    with pytest.raises(TemplateError, match="--tpm-limit"):
        templates.alert_parameters(ACCOUNT, "d", 0)
    with pytest.raises(TemplateError, match="--deployment"):
        templates.alert_parameters(ACCOUNT, "bad name'", 10)
    apim = templates.apim_parameters(
        "apim-prod", "https://a.openai.azure.com/openai", "https://b.openai.azure.com/openai"
    )
    assert apim["parameters"]["secondaryUrl"]["value"].startswith("https://b.")
    with pytest.raises(TemplateError, match="same"):
        templates.apim_parameters("apim", "https://a.x/openai", "https://a.x/openai/")
    with pytest.raises(TemplateError, match="--primary-url"):
        templates.apim_parameters("apim", "http://a.x", "https://b.x")
