"""Azure templates for S4, built as data and serialised (never assembled as text).

- :func:`metric_alerts_template`: an ARM template with two Azure Monitor metric alerts on one Azure OpenAI
  deployment: ``TokenTransaction`` at ``alertPercent`` (80) % of its TPM over the window, and ``AzureOpenAIRequests``
  with ``StatusCode`` 429 at ``count429`` or more in the window. Both filter on ``ModelDeploymentName``.
- :func:`apim_template`: an ARM template for API Management: two backends (the deployments' resources, e.g. two
  regions) each with a circuit breaker that trips on 429 and honours Retry-After, a priority pool over them
  (primary 1, overflow 2), and the API policy (:func:`apim_policy`) that sends to the pool with managed-identity
  authentication and retries a 429/5xx on the pool's next backend.

The checked-in copies live in ``remediation/templates/azure/``, package data installed with the library
(``templates/azure/`` at the top of the checkout links there; ``az deployment group create --template-file ...``);
a test keeps them equal to what these functions build. ``invoke aoai.alerts`` / ``invoke aoai.apim`` write the
parameters file for a given deployment.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from remediation.aoai.settings import AoaiSettings
from remediation.core.errors import TemplateError
from remediation.core.resources import package_dir

__all__ = [
    "ALERTS_FILE",
    "APIM_FILE",
    "POLICY_FILE",
    "TEMPLATES",
    "alert_parameters",
    "apim_parameters",
    "apim_policy",
    "apim_template",
    "metric_alerts_template",
    "render_json",
    "write_templates",
]

#: The package's copies (package data, ``remediation/templates/azure``).
TEMPLATES = package_dir("templates", "azure")
ALERTS_FILE = "aoai-metric-alerts.json"
APIM_FILE = "aoai-apim-backend-pool.json"
POLICY_FILE = "aoai-apim-policy.xml"

_SCHEMA = "https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#"
_PARAMS_SCHEMA = "https://schema.management.azure.com/schemas/2019-04-01/deploymentParameters.json#"
_NAMESPACE = "Microsoft.CognitiveServices/accounts"
_ALERTS_API = "2018-03-01"
_APIM_API = "2024-05-01"
_RESOURCE_ID = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.CognitiveServices/accounts/[^/]+$", re.I
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _param(kind: str, description: str, default: Any = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind}
    if default is not None:
        out["defaultValue"] = default
    out.update(extra)
    out["metadata"] = {"description": description}
    return out


def _criterion(
    name: str, metric: str, threshold: Any, operator: str, dimensions: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "name": name,
        "criterionType": "StaticThresholdCriterion",
        "metricNamespace": _NAMESPACE,
        "metricName": metric,
        "dimensions": dimensions,
        "operator": operator,
        "threshold": threshold,
        "timeAggregation": "Total",
    }


def _alert(name: str, description: str, criterion: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "Microsoft.Insights/metricAlerts",
        "apiVersion": _ALERTS_API,
        "name": name,
        "location": "global",
        "properties": {
            "description": description,
            "severity": "[parameters('severity')]",
            "enabled": True,
            "scopes": ["[parameters('accountResourceId')]"],
            "evaluationFrequency": "PT1M",
            "windowSize": "[format('PT{0}M', parameters('windowMinutes'))]",
            "autoMitigate": True,
            "criteria": {
                "odata.type": "Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria",
                "allOf": [criterion],
            },
            "actions": "[if(empty(parameters('actionGroupId')), createArray(), "
            "createArray(createObject('actionGroupId', parameters('actionGroupId'))))]",
        },
    }


def metric_alerts_template(settings: AoaiSettings | None = None) -> dict[str, Any]:
    """The ARM template of the two alerts (defaults of ``alertPercent`` etc. from ``settings``)."""
    cfg = settings or AoaiSettings()
    deployment_dim = {
        "name": "ModelDeploymentName",
        "operator": "Include",
        "values": ["[parameters('deploymentName')]"],
    }
    tokens = _criterion(
        "TokensAbovePercentOfTpm",
        "TokenTransaction",
        "[div(mul(mul(parameters('tpmLimit'), parameters('alertPercent')), parameters('windowMinutes')), 100)]",
        "GreaterThan",
        [deployment_dim],
    )
    throttled = _criterion(
        "Http429",
        "AzureOpenAIRequests",
        "[parameters('count429')]",
        "GreaterThanOrEqual",
        [deployment_dim, {"name": "StatusCode", "operator": "Include", "values": ["429"]}],
    )
    return {
        "$schema": _SCHEMA,
        "contentVersion": "1.0.0.0",
        "metadata": {
            "description": "Azure OpenAI S4 alerts (gpu-fleet-remediation): tokens per minute at a share of the "
            "deployment's TPM quota, and HTTP 429 answers. Generated by remediation.aoai.templates."
        },
        "parameters": {
            "accountResourceId": _param("string", "Resource ID of the Azure OpenAI (Cognitive Services) account"),
            "deploymentName": _param("string", "The model deployment to watch (ModelDeploymentName)"),
            "tpmLimit": _param("int", "The deployment's tokens-per-minute quota", minValue=1),
            "alertPercent": _param(
                "int",
                "Fire when tokens per minute exceed this share of tpmLimit",
                int(cfg.alert_pct),
                minValue=1,
                maxValue=100,
            ),
            "windowMinutes": _param(
                "int",
                "Evaluation window in minutes (evaluated every minute)",
                cfg.alert_window_minutes,
                allowedValues=[1, 5, 15, 30],
            ),
            "count429": _param(
                "int", "Fire at this many HTTP 429 answers in the window", cfg.alert_429_count, minValue=1
            ),
            "severity": _param(
                "int", "Alert severity, 0 (critical) to 4 (verbose)", cfg.alert_severity, allowedValues=[0, 1, 2, 3, 4]
            ),
            "actionGroupId": _param("string", "Resource ID of the action group to notify (empty: none)", ""),
        },
        "variables": {},
        "resources": [
            _alert(
                "[format('aoai-{0}-tpm-{1}pct', parameters('deploymentName'), parameters('alertPercent'))]",
                "[format('Azure OpenAI deployment {0}: tokens per minute above {1}% of its {2} TPM quota (runbook "
                "S4, AOAI-TPM-001)', parameters('deploymentName'), parameters('alertPercent'), "
                "parameters('tpmLimit'))]",
                tokens,
            ),
            _alert(
                "[format('aoai-{0}-http-429', parameters('deploymentName'))]",
                "[format('Azure OpenAI deployment {0}: {1} or more HTTP 429 answers in {2} minutes (runbook S4, "
                "AOAI-429-001)', parameters('deploymentName'), parameters('count429'), parameters('windowMinutes'))]",
                throttled,
            ),
        ],
    }


def apim_policy() -> str:
    """The API policy: managed identity to Azure OpenAI, the pool as backend, a 429/5xx/no answer retried on the
    pool (whose circuit breakers have taken the throttled backend out)."""
    root = ET.Element("policies")
    inbound = ET.SubElement(root, "inbound")
    ET.SubElement(inbound, "base")
    ET.SubElement(inbound, "authentication-managed-identity", {"resource": "https://cognitiveservices.azure.com"})
    ET.SubElement(inbound, "set-backend-service", {"backend-id": "aoai-pool"})
    backend = ET.SubElement(root, "backend")
    retry = ET.SubElement(
        backend,
        "retry",
        {
            "condition": "@(context.Response == null || context.Response.StatusCode == 429 || "
            "context.Response.StatusCode >= 500)",
            "count": "2",
            "interval": "0",
            "first-fast-retry": "true",
        },
    )
    ET.SubElement(retry, "forward-request", {"buffer-request-body": "true"})
    for section in ("outbound", "on-error"):
        ET.SubElement(ET.SubElement(root, section), "base")
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _backend(name_param: str, url_param: str, region_note: str) -> dict[str, Any]:
    return {
        "type": "Microsoft.ApiManagement/service/backends",
        "apiVersion": _APIM_API,
        "name": f"[format('{{0}}/{{1}}', parameters('apimServiceName'), {name_param})]",
        "properties": {
            "description": f"Azure OpenAI {region_note}",
            "url": f"[parameters('{url_param}')]",
            "protocol": "http",
            "circuitBreaker": {
                "rules": [
                    {
                        "name": "aoai-throttled",
                        "failureCondition": {
                            "count": 1,
                            "interval": "PT10S",
                            "statusCodeRanges": [{"min": 429, "max": 429}, {"min": 500, "max": 599}],
                        },
                        "tripDuration": "[parameters('tripDuration')]",
                        "acceptRetryAfter": True,
                    }
                ]
            },
        },
    }


def apim_template() -> dict[str, Any]:
    """The ARM template of the backends, the pool and the API policy."""
    primary = "'aoai-primary'"
    secondary = "'aoai-secondary'"
    return {
        "$schema": _SCHEMA,
        "contentVersion": "1.0.0.0",
        "metadata": {
            "description": "Azure OpenAI S4 overflow (gpu-fleet-remediation): two deployments behind an API "
            "Management backend pool with circuit breakers that honour Retry-After. Generated by "
            "remediation.aoai.templates."
        },
        "parameters": {
            "apimServiceName": _param("string", "The API Management service"),
            "apiName": _param("string", "The API (in that service) that fronts Azure OpenAI", "azure-openai"),
            "primaryUrl": _param("string", "Primary Azure OpenAI endpoint, e.g. https://NAME.openai.azure.com/openai"),
            "secondaryUrl": _param("string", "Overflow endpoint in another region, same deployment names"),
            "tripDuration": _param("string", "How long a tripped backend stays out when no Retry-After says", "PT1M"),
        },
        "variables": {},
        "resources": [
            _backend(primary, "primaryUrl", "primary deployment"),
            _backend(secondary, "secondaryUrl", "overflow deployment (another region)"),
            {
                "type": "Microsoft.ApiManagement/service/backends",
                "apiVersion": _APIM_API,
                "name": "[format('{0}/{1}', parameters('apimServiceName'), 'aoai-pool')]",
                "dependsOn": [
                    "[resourceId('Microsoft.ApiManagement/service/backends', parameters('apimServiceName'), "
                    "'aoai-primary')]",
                    "[resourceId('Microsoft.ApiManagement/service/backends', parameters('apimServiceName'), "
                    "'aoai-secondary')]",
                ],
                "properties": {
                    "description": "Azure OpenAI pool: primary first, overflow when it is throttled",
                    "type": "Pool",
                    "pool": {
                        "services": [
                            {"id": "/backends/aoai-primary", "priority": 1, "weight": 1},
                            {"id": "/backends/aoai-secondary", "priority": 2, "weight": 1},
                        ]
                    },
                },
            },
            {
                "type": "Microsoft.ApiManagement/service/apis/policies",
                "apiVersion": _APIM_API,
                "name": "[format('{0}/{1}/policy', parameters('apimServiceName'), parameters('apiName'))]",
                "dependsOn": [
                    "[resourceId('Microsoft.ApiManagement/service/backends', parameters('apimServiceName'), "
                    "'aoai-pool')]"
                ],
                "properties": {"format": "xml", "value": apim_policy()},  # well-formed XML, escaped
            },
        ],
    }


def _parameters(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": _PARAMS_SCHEMA,
        "contentVersion": "1.0.0.0",
        "parameters": {name: {"value": value} for name, value in values.items()},
    }


def alert_parameters(
    account_resource_id: str,
    deployment: str,
    tpm_limit: int,
    settings: AoaiSettings | None = None,
    action_group_id: str = "",
) -> dict[str, Any]:
    """The parameters file for :func:`metric_alerts_template`; :class:`TemplateError` on a bad value."""
    cfg = settings or AoaiSettings()
    if not _RESOURCE_ID.match(account_resource_id):
        raise TemplateError(
            f"--account-id {account_resource_id!r} is not an Azure OpenAI account resource ID "
            "(/subscriptions/SUB/resourceGroups/RG/providers/Microsoft.CognitiveServices/accounts/NAME)"
        )
    if not _NAME.match(deployment):
        raise TemplateError(f"--deployment {deployment!r}: a deployment name (letters, digits, . _ -)")
    if tpm_limit <= 0:
        raise TemplateError(f"--tpm-limit {tpm_limit}: the deployment's tokens-per-minute quota, a positive number")
    if cfg.alert_window_minutes not in (1, 5, 15, 30) or not 0 < cfg.alert_pct <= 100:
        raise TemplateError("aoai.alert_window_minutes must be 1, 5, 15 or 30 and aoai.alert_pct in (0, 100]")
    if action_group_id and not action_group_id.lower().startswith("/subscriptions/"):
        raise TemplateError(f"--action-group {action_group_id!r}: an action group resource ID (/subscriptions/...)")
    return _parameters(
        {
            "accountResourceId": account_resource_id,
            "deploymentName": deployment,
            "tpmLimit": int(tpm_limit),
            "alertPercent": int(cfg.alert_pct),
            "windowMinutes": cfg.alert_window_minutes,
            "count429": cfg.alert_429_count,
            "severity": cfg.alert_severity,
            "actionGroupId": action_group_id,
        }
    )


def apim_parameters(apim: str, primary_url: str, secondary_url: str, api_name: str = "azure-openai") -> dict[str, Any]:
    """The parameters file for :func:`apim_template`; :class:`TemplateError` on a bad value."""
    if not _NAME.match(apim) or not _NAME.match(api_name):
        raise TemplateError(f"--apim {apim!r} / --api {api_name!r}: API Management and API names")
    for flag, url in (("--primary-url", primary_url), ("--secondary-url", secondary_url)):
        if not url.startswith("https://"):
            raise TemplateError(f"{flag} {url!r}: the Azure OpenAI endpoint, https://NAME.openai.azure.com/openai")
    if primary_url.rstrip("/") == secondary_url.rstrip("/"):
        raise TemplateError("--primary-url and --secondary-url are the same: the overflow needs another deployment")
    return _parameters(
        {"apimServiceName": apim, "apiName": api_name, "primaryUrl": primary_url, "secondaryUrl": secondary_url}
    )


def render_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def write_templates(directory: Path = TEMPLATES) -> list[Path]:
    """(Re)write the checked-in templates from the data above."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        ALERTS_FILE: render_json(metric_alerts_template()),
        APIM_FILE: render_json(apim_template()),
        POLICY_FILE: apim_policy(),
    }
    written = []
    for name, content in files.items():
        path = directory / name
        path.write_text(content, encoding="utf-8")
        written.append(path)
    return written
