"""Findings about Azure OpenAI rate limits (S4: the 429 storm), from request logs, Azure Monitor metrics and pasted
429 text. The rules that decide them live in :mod:`remediation.aoai.rules`, used by ``invoke aoai.diagnose`` and by
``invoke diagnose`` (kind ``aoai-429``) alike."""

from __future__ import annotations

from remediation.core.catalog.entry import CatalogEntry, Runbook
from remediation.core.findings import Scenario, Severity

__all__ = ["ENTRIES"]

_SYMPTOMS = (
    "30% or more of the requests come back HTTP 429; users report slowness or timeouts. The body reads: "
    '"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version ... have exceeded token rate '
    'limit of your current OpenAI S0 pricing tier. Please retry after N seconds." (or "call rate limit" for requests '
    "per minute)."
)
_DIAGNOSIS = (
    "- Read the Retry-After (`retry-after-ms`, `retry-after`) of the 429s: 1 s = slightly over the limit, 30 s = far "
    "over it\n"
    "- Tokens per minute against the limit: `az monitor metrics list --resource /subscriptions/SUB/resourceGroups/RG/"
    "providers/Microsoft.CognitiveServices/accounts/ACCOUNT --metric TokenTransaction --interval PT1M --aggregation "
    "Total --filter \"ModelDeploymentName eq 'DEPLOYMENT'\"`\n"
    "- 429s over time: the same with `--metric AzureOpenAIRequests --filter \"StatusCode eq '429'\"`\n"
    "- `invoke aoai.diagnose FILE` on the client's request log or that metrics export; `invoke diagnose` on a pasted "
    "429"
)
_ROOT_CAUSE = (
    "A Standard deployment enforces hard rate limits: with an 80K TPM quota, a product launch that drives 200K+ TPM "
    "gets a 429 for every request above the limit. Azure charges a request at admission as its prompt tokens + "
    "max_tokens over a rolling minute, and checks requests per minute over 10-second windows (RPM/6)."
)
_RESOLUTION = (
    "1. Immediately: exponential backoff with jitter that honours Retry-After (remediation.aoai's client does, and "
    "queues by the token charge instead of sending what would be rejected)\n"
    "2. Short term: a second deployment in another region for overflow (the client's deployment pool, or APIM: "
    "`invoke aoai.apim`)\n"
    "3. Long term: evaluate provisioned throughput (PTU) for predictable, high-volume workloads"
)
_PREVENTION = (
    "- Multi-deployment architecture with APIM load balancing (backend pool with circuit breaker: `invoke aoai.apim`)\n"
    "- Alerts at 80% of the provisioned TPM and on 429s (`invoke aoai.alerts`)\n"
    "- A token-aware queue in the client: estimate tokens before sending (remediation.aoai)\n"
    "- Log the token count of every request, to forecast before launches (the client's request records)"
)


def _rb(
    symptoms: str = _SYMPTOMS,
    diagnosis: str = _DIAGNOSIS,
    root_cause: str = _ROOT_CAUSE,
    resolution: str = _RESOLUTION,
    prevention: str = _PREVENTION,
) -> Runbook:
    return Runbook(symptoms, diagnosis, root_cause, resolution, prevention)


_S4 = Scenario.S4
_C, _W, _I = Severity.CRITICAL, Severity.WARNING, Severity.INFO

ENTRIES: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        "AOAI-429-001",
        _S4,
        _W,
        "Azure OpenAI rate limit exceeded (HTTP 429): requests or tokens per minute above the deployment's quota",
        "honour Retry-After with backoff and queue by token charge (remediation.aoai client); add an overflow "
        "deployment in another region",
        _rb(),
    ),
    CatalogEntry(
        "AOAI-429-002",
        _S4,
        _W,
        "Retry-After far above any sensible wait (e.g. 86400 s): move to another deployment instead of sleeping",
        "cool the deployment for the hinted time and send to the next one (remediation.aoai client); check the "
        "quota of the deployment in the Azure portal",
        _rb(
            root_cause=_ROOT_CAUSE + ' A 429 that says "retry after 86400 seconds" is a known, misleading answer '
            "(users report their real limit was per minute): a client that obeys it sleeps a day, one that caps it "
            "and retries hammers a deployment that keeps refusing.",
            resolution='1. Treat a hint above the cap (60 s) as "this deployment is unavailable": cool it for the '
            "hinted time and send the request to the next deployment (remediation.aoai does)\n"
            "2. Keep a second deployment in another region so there is a next one\n"
            "3. Check the deployment's quota and the subscription's regional quota; raise it at "
            "https://aka.ms/oai/quotaincrease",
        ),
    ),
    CatalogEntry(
        "AOAI-429-003",
        _S4,
        _W,
        "Azure OpenAI at peak load (capacity 429): the service's capacity, not the deployment's quota",
        "retry after the hint on another region's deployment; evaluate provisioned throughput (PTU)",
        _rb(
            root_cause='The region\'s shared capacity is exhausted ("high demand", "exceeds the maximum usage size '
            'allowed during peak load"): every Standard deployment there is affected, whatever its quota.',
            resolution="1. Honour the Retry-After and send to a deployment in another region\n"
            "2. Evaluate provisioned throughput (PTU), which reserves capacity",
        ),
    ),
    CatalogEntry(
        "AOAI-TPM-001",
        _S4,
        _C,
        "A burst above the deployment's tokens-per-minute limit",
        "queue by token charge in the client (remediation.aoai) and add an overflow deployment in another region; "
        "alert at 80% of TPM (`invoke aoai.alerts`)",
        _rb(),
    ),
    CatalogEntry(
        "AOAI-TPM-002",
        _S4,
        _W,
        "Sustained load near the tokens-per-minute limit: evaluate provisioned throughput (PTU)",
        "evaluate PTU for the deployment; meanwhile a second deployment for overflow and alerts at 80% of TPM",
        _rb(
            resolution="1. Long term: size provisioned throughput (PTU) for the sustained load\n"
            "2. Until then: a second deployment for overflow, the client's admission queue, alerts at 80% of TPM",
        ),
    ),
)
