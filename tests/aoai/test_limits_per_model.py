"""End to end: the client keeps a reasoning model's deployment under its lower RPM, against the local stand-in that
enforces RPM per model from its own table.

Azure's figures: "Azure OpenAI in Azure AI Foundry Models quotas and limits"
(https://learn.microsoft.com/en-us/azure/ai-foundry/openai/quotas-limits), the capacity-unit table under "o-series
rate limits": o3-mini, 1 unit = 1 RPM and 10,000 TPM (older chat models: 6 RPM and 1,000 TPM). An o3-mini deployment
of 100,000 TPM has 10 RPM: Azure checks RPM/6 per 10 seconds, so 1 request per 10 s (here: per sixth of the stand-in's
2-second minute)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from lab.services.aoai import FakeAzureOpenAI, FakeDeployment
from remediation.aoai.client import AoaiTransport, ClientConfig, Deployment, with_overrides

W = 2.0
V = "2024-10-21"
CONFIG = ClientConfig(
    tpm_window_s=W, rpm_window_s=W / 6, retry_after_cap_s=W + 1, backoff_base_s=0.2, backoff_max_s=1.0,
    deadline_s=20.0, admission_lag_s=0.5,
)
BURST = 6


@pytest.fixture
def svc() -> Iterator[FakeAzureOpenAI]:
    with FakeAzureOpenAI([FakeDeployment("reasoner", tpm=100_000, model="o3-mini")], window_s=W, api_key="k") as s:
        yield s


def burst(svc: FakeAzureOpenAI, deployment: Deployment) -> AoaiTransport:
    transport = AoaiTransport([deployment], CONFIG)
    statuses: list[int] = []
    with httpx.Client(transport=transport, timeout=30) as http:

        def one() -> None:
            answer = http.post(
                f"{svc.url}/openai/deployments/any/chat/completions?api-version={V}",
                json={"messages": [{"role": "user", "content": "think"}], "max_completion_tokens": 50},
                headers={"api-key": "k"},
            )
            statuses.append(answer.status_code)

        threads = [threading.Thread(target=one) for _ in range(BURST)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert statuses == [200] * BURST
    return transport


def test_the_stand_in_gives_o3_mini_one_rpm_per_10000_tpm(svc: FakeAzureOpenAI) -> None:
    dep = svc.deployment("reasoner")
    assert dep is not None and dep.requests_per_minute == 10


@pytest.mark.parametrize(
    "deployment",
    [
        Deployment("reasoner", "http://127.0.0.1", 100_000, model="o3-mini"),  # the model's ratio from the table
        with_overrides([Deployment("reasoner", "http://127.0.0.1", 100_000)], {"reasoner": 0.1})[0],  # config
    ],
    ids=["model", "override"],
)
def test_the_client_keeps_a_reasoning_deployment_under_its_rpm(svc: FakeAzureOpenAI, deployment: Deployment) -> None:
    deployment = Deployment("reasoner", svc.url, deployment.tpm, model=deployment.model,
                            rpm_per_1000_tpm=deployment.rpm_per_1000_tpm)
    assert deployment.requests_per_minute == 10
    transport = burst(svc, deployment)
    arrivals = svc.arrivals_of("reasoner")
    assert len(arrivals) == BURST and all(a.admitted for a in arrivals)  # no 429: none reached the stand-in over
    assert transport.stats.throttled == 0


def test_at_six_rpm_per_1000_tpm_the_same_burst_meets_429s(svc: FakeAzureOpenAI) -> None:
    """The old assumption (600 RPM for 100,000 TPM) sends the burst at once; the stand-in refuses on RPM."""
    deployment = Deployment("reasoner", svc.url, 100_000)  # no model: 6 per 1,000
    assert deployment.requests_per_minute == 600
    transport = burst(svc, deployment)  # the 429 handling still gets every request through
    refused = [a for a in svc.arrivals_of("reasoner") if not a.admitted]
    assert refused and all(a.limit == "requests" for a in refused)
    assert transport.stats.throttled == len(refused)
