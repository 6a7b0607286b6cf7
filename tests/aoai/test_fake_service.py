"""The local Azure OpenAI stand-in answers like Azure: admission charge, 429 wording and headers, errors."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from lab.errors import LabError
from lab.services.aoai import FakeAzureOpenAI, FakeDeployment
from remediation.aoai import text

V = "2024-10-21"


@pytest.fixture(scope="module")
def svc() -> Iterator[FakeAzureOpenAI]:
    deployments = [
        FakeDeployment("tok", tpm=1000, rpm=600),
        FakeDeployment("req", tpm=100_000, rpm=60, wording="newer", region="Sweden Central"),
        FakeDeployment("huge", tpm=1000, rpm=600, retry_after_override_s=86400),
    ]
    with FakeAzureOpenAI(deployments, window_s=12.0, api_key="k") as service:
        yield service


def post(
    svc: FakeAzureOpenAI, deployment: str, body: object, key: str = "k", version: str | None = V
) -> httpx.Response:
    query = f"?api-version={version}" if version else ""
    return httpx.post(
        f"{svc.url}/openai/deployments/{deployment}/chat/completions{query}",
        json=body,
        headers={"api-key": key},
        timeout=10,
    )


def chat(max_tokens: int, content: str = "hello") -> dict[str, object]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}


def test_loopback_only() -> None:
    with pytest.raises(LabError, match="loopback"):
        FakeAzureOpenAI([], host="0.0.0.0")  # noqa: S104 - the point: it refuses


def test_token_limit_is_charged_at_admission_as_prompt_plus_max_tokens(svc: FakeAzureOpenAI) -> None:
    svc.reset()
    first = post(svc, "tok", chat(900))
    assert first.status_code == 200
    usage = first.json()["usage"]
    assert usage["completion_tokens"] == 900 and usage["total_tokens"] == usage["prompt_tokens"] + 900
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 1000 - usage["total_tokens"]
    second = post(svc, "tok", chat(200))
    assert second.status_code == 429
    assert second.headers["policy-id"] == "DeploymentRatelimit-Token"
    seconds = int(second.headers["retry-after"])
    assert 1 <= seconds <= 12 and 0 < int(second.headers["retry-after-ms"]) <= 12_000
    message = second.json()["error"]["message"]
    assert message.startswith(
        "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
        f"{V} have exceeded token rate limit of your current OpenAI S0 pricing tier."
    )
    parsed = text.parse(second.text)
    assert (parsed.limit_kind, parsed.retry_after_seconds) == ("tokens", float(seconds))
    assert [a.admitted for a in svc.arrivals_of("tok")] == [True, False]  # a refused request is not charged


def test_rpm_is_checked_per_sixth_of_the_window(svc: FakeAzureOpenAI) -> None:
    svc.reset()
    answers = [post(svc, "req", chat(1)) for _ in range(11)]  # 60 RPM: 10 per 10 s (2 s here)
    assert [a.status_code for a in answers] == [200] * 10 + [429]
    refused = answers[-1]
    assert refused.headers["policy-id"] == "DeploymentRatelimit-Call"
    assert refused.json()["error"]["code"] == "RateLimitReached"
    parsed = text.parse(refused.text)
    assert (parsed.limit_kind, parsed.deployment, parsed.region) == ("requests", "req", "Sweden Central")


def test_the_huge_retry_after_case(svc: FakeAzureOpenAI) -> None:
    svc.reset()
    assert post(svc, "huge", chat(990)).status_code == 200
    refused = post(svc, "huge", chat(990))
    assert refused.headers["retry-after"] == "86400" and refused.headers["retry-after-ms"] == "86400000"
    assert "Please retry after 86400 seconds" in refused.json()["error"]["message"]


def test_errors_like_azure(svc: FakeAzureOpenAI) -> None:
    assert post(svc, "nope", chat(1)).json()["error"]["code"] == "DeploymentNotFound"
    assert post(svc, "tok", chat(1), version=None).status_code == 404
    assert post(svc, "tok", chat(1), key="wrong").status_code == 401
    bad = post(svc, "tok", {"prompt": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
