"""The local Azure OpenAI stand-in answers like Azure: admission charge, 429 wording and headers, errors."""

from __future__ import annotations

import json
import math
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
    # "Manage Azure OpenAI quota", "Understanding rate limits": the estimate counts the prompt text and count, the
    # max_tokens setting and best_of, "based in part on the character count of the API request"; it is not the
    # count used for billing (usage). The stand-in's own rule: characters of the messages as sent / 4, rounded up.
    svc.reset()
    body = chat(900, "fleet " * 40)
    first = post(svc, "tok", body)
    assert first.status_code == 200
    usage = first.json()["usage"]
    assert usage["completion_tokens"] == 900 and usage["total_tokens"] == usage["prompt_tokens"] + 900
    estimate = math.ceil(len(json.dumps(body["messages"])) / 4) + 900
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 1000 - estimate
    assert estimate != usage["total_tokens"]  # the rate limiter's estimate is not the billed count
    assert [a.charge for a in svc.arrivals_of("tok")] == [estimate]
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


def test_best_of_and_n_multiply_the_max_tokens_charged(svc: FakeAzureOpenAI) -> None:
    svc.reset()
    body = {**chat(100), "best_of": 3, "n": 2}
    answer = post(svc, "tok", body)
    assert answer.status_code == 200
    (arrival,) = svc.arrivals_of("tok")
    assert arrival.charge == math.ceil(len(json.dumps(body["messages"])) / 4) + 3 * 100  # the larger of n, best_of
    assert len(answer.json()["choices"]) == 2


def test_the_tokenizer_estimator_charges_the_billed_count() -> None:
    with FakeAzureOpenAI([FakeDeployment("t", tpm=1000, rpm=600)], window_s=12.0, estimator="tokenizer") as one:
        answer = post(one, "t", chat(100, "fleet " * 40), key="")
        assert answer.status_code == 200
        (arrival,) = one.arrivals_of("t")
        assert arrival.charge == answer.json()["usage"]["total_tokens"]
    with pytest.raises(LabError, match="estimator"):
        FakeAzureOpenAI([], estimator="tiktoken")


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
