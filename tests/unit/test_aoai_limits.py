"""RPM per model and the paths the client does not manage.

The figures are those of "Azure OpenAI in Azure AI Foundry Models quotas and limits"
(https://learn.microsoft.com/en-us/azure/ai-foundry/openai/quotas-limits, ms.date 2025-07-11): the capacity-unit
table under "o-series rate limits" (older chat models 1 unit = 6 RPM / 1,000 TPM; o1 & o1-preview 1 RPM / 6,000 TPM;
o3 and o4-mini 1 RPM / 1,000 TPM; o3-mini, o1-mini, o3-pro 1 RPM / 10,000 TPM) and the per-model quota tables
(gpt-4.1 Default 1 M TPM / 1 K RPM; gpt-4o Default 450 K TPM / 2.7 K RPM).
"""

from __future__ import annotations

import contextlib
import logging
from fractions import Fraction

import httpx
import openai
import pytest

from remediation.aoai.admission import Admission, Limits
from remediation.aoai.client import AoaiTransport, ClientConfig, Deployment, with_overrides
from remediation.aoai.limits import DEFAULT_RPM_PER_1000_TPM, rpm_for, rpm_per_1000_tpm
from remediation.aoai.records import RequestRecord
from remediation.aoai.settings import AoaiSettings
from remediation.config import load_section
from remediation.core.errors import UsageError


@pytest.mark.parametrize(
    ("model", "tpm", "rpm"),
    [
        ("o1", 6000, 1),  # 1 unit of o1: 1 RPM, 6,000 TPM
        ("o1", 3_000_000, 500),  # o-series global standard, Default: 3 M TPM, 500 RPM
        ("o1-preview", 60_000, 10),
        ("o3", 1_000_000, 1000),  # Default: 1 M TPM, 1 K RPM
        ("o4-mini", 1_000_000, 1000),
        ("o3-mini", 5_000_000, 500),  # Default: 5 M TPM, 500 RPM
        ("o3-mini-2025-01-31", 10_000, 1),  # a dated version is the same model
        ("o1-mini", 5_000_000, 500),
        ("o3-pro", 1_600_000, 160),  # Default: 1.6 M TPM, 160 RPM
        ("gpt-4.1", 1_000_000, 1000),  # GPT-4.1 series global standard, Default: 1 M TPM, 1 K RPM
        ("gpt-4.1-mini", 5_000_000, 5000),
        ("gpt-4o", 450_000, 2700),  # gpt-4o global standard, Default: 450 K TPM, 2.7 K RPM
        ("gpt-4o-mini", 2_000_000, 12_000),
        ("gpt-4o-2024-08-06", 150_000, 900),  # gpt-4o standard, Default: 150 K TPM, 900 RPM
    ],
)
def test_rpm_follows_the_quota_pages_figures(model: str, tpm: int, rpm: int) -> None:
    assert rpm_for(tpm, model) == rpm
    assert Deployment("d", "https://d.openai.azure.com", tpm, model=model).requests_per_minute == rpm


def test_a_model_the_table_does_not_name_gets_the_older_chat_ratio(caplog: pytest.LogCaptureFixture) -> None:
    assert rpm_per_1000_tpm("gpt-5") == (DEFAULT_RPM_PER_1000_TPM, False)
    assert rpm_per_1000_tpm("") == (Fraction(6), False)
    d = Deployment("d", "https://d.openai.azure.com", 100_000, model="gpt-5")
    assert d.requests_per_minute == 600
    assert "not in the table" in d.rpm_source
    with caplog.at_level(logging.WARNING, logger="remediation.aoai.client"):
        AoaiTransport([d], inner=httpx.MockTransport(lambda r: httpx.Response(200)))
    assert any("gpt-5" in r.getMessage() and "default 6" in r.getMessage() for r in caplog.records)


def test_rpm_and_the_ratio_override_the_model() -> None:
    base = "https://d.openai.azure.com"
    assert Deployment("d", base, 100_000, model="o3-mini", rpm=50).requests_per_minute == 50
    assert Deployment("d", base, 100_000, model="o3-mini", rpm_per_1000_tpm=1).requests_per_minute == 100
    assert Deployment("d", base, 60_000, rpm_per_1000_tpm=1 / 6).requests_per_minute == 10
    with pytest.raises(UsageError):
        Deployment("d", base, 1000, rpm_per_1000_tpm=0)


def test_the_typed_config_overrides_the_ratio_per_deployment() -> None:
    settings = load_section(AoaiSettings, {"rpm_per_1000_tpm": {"reasoner": 0.1}}, "aoai")
    assert settings.rpm_per_1000_tpm == {"reasoner": 0.1}
    pool = [
        Deployment("reasoner", "https://a.openai.azure.com", 100_000),
        Deployment("chat", "https://a.openai.azure.com", 100_000, model="gpt-4o"),
    ]
    reasoner, chat = with_overrides(pool, settings.rpm_per_1000_tpm)
    assert (reasoner.requests_per_minute, chat.requests_per_minute) == (10, 600)
    with pytest.raises(UsageError, match="typo"):
        with_overrides(pool, {"typo": 1.0})
    with pytest.raises(UsageError, match="rpm_per_1000_tpm"):
        load_section(AoaiSettings, {"rpm_per_1000_tpm": {"reasoner": -1}}, "aoai")
    with pytest.raises(UsageError):
        load_section(AoaiSettings, {"rpm_per_1000_tpm": {"reasoner": "fast"}}, "aoai")


def test_a_reasoning_deployment_admits_rpm_over_six_per_ten_seconds() -> None:
    """Azure checks RPM/6 per 10 seconds: an o3-mini deployment of 600,000 TPM (60 RPM) takes 10 per 10 s, not 600."""
    d = Deployment("d", "https://d.openai.azure.com", 600_000, model="o3-mini")
    admission = Admission(Limits(tpm=d.tpm, rpm=d.requests_per_minute))
    for _ in range(10):
        assert admission.wait(100, now=0) == 0
        admission.charge(100, now=0)
    assert admission.wait(100, now=0) == pytest.approx(10)


# --- the Responses API and the v1 API: not managed, said once per path -----------------------------------------


def _passthrough() -> tuple[AoaiTransport, list[str], list[RequestRecord]]:
    seen: list[str] = []
    records: list[RequestRecord] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"id": "x", "object": "response", "output": [], "usage": None})

    transport = AoaiTransport(
        [Deployment("gpt-4o", "https://contoso.openai.azure.com", 100_000, model="gpt-4o")],
        ClientConfig(),
        inner=httpx.MockTransport(answer),
        sink=records.append,
    )
    return transport, seen, records


def test_responses_and_v1_requests_pass_through_with_one_warning_per_path(caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's own paths: ``AzureOpenAI.responses.create`` posts to ``/openai/responses``; an ``OpenAI`` client with
    ``base_url=https://<resource>.openai.azure.com/openai/v1/`` (Azure's v1 API, model in the body) posts to
    ``/openai/v1/chat/completions`` and ``/openai/v1/responses``."""
    transport, seen, records = _passthrough()
    http = httpx.Client(transport=transport)
    azure = openai.AzureOpenAI(
        azure_endpoint="https://contoso.openai.azure.com", api_key="k", api_version="2025-04-01-preview",
        http_client=http, max_retries=0,
    )
    v1 = openai.OpenAI(base_url="https://contoso.openai.azure.com/openai/v1/", api_key="k", http_client=http,
                       max_retries=0)
    with caplog.at_level(logging.WARNING, logger="remediation.aoai.client"):
        for _ in range(2):
            azure.responses.create(model="gpt-4o", input="hi")
            v1.responses.create(model="gpt-4o", input="hi")
            with contextlib.suppress(Exception):  # the canned body is no chat completion: the path is what counts
                v1.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert seen.count("/openai/responses") == 2
    assert seen.count("/openai/v1/responses") == 2
    assert seen.count("/openai/v1/chat/completions") == 2
    warnings = [r.getMessage() for r in caplog.records if "is not managed" in r.getMessage()]
    assert len(warnings) == 3  # once per path
    assert any(w.startswith("remediation.aoai: /openai/responses (the Responses API)") for w in warnings)
    assert any("/openai/v1/chat/completions (the v1 API, model in the body)" in w for w in warnings)
    assert all("no admission queue, no 429 handling, no request records" in w for w in warnings)
    assert transport.stats.unmanaged == ["/openai/responses", "/openai/v1/responses", "/openai/v1/chat/completions"]
    assert transport.stats.snapshot()["unmanaged"] == transport.stats.unmanaged
    assert records == [] and transport.stats.requests == 0


def test_the_deployments_route_and_other_paths_are_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    transport, seen, _records = _passthrough()
    with caplog.at_level(logging.WARNING, logger="remediation.aoai.client"), httpx.Client(transport=transport) as http:
        http.get("https://contoso.openai.azure.com/openai/models?api-version=2024-10-21")
    assert seen == ["/openai/models"]
    assert not [r for r in caplog.records if "is not managed" in r.getMessage()]
