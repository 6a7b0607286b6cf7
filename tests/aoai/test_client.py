"""The client against the local Azure OpenAI stand-in, over real HTTP: alone with httpx and inside the OpenAI SDK.

The stand-in's minute is 2 seconds (its windows, hints and the client's windows on the same scaled clock), so the
queue, the 429 handling and the cooldowns are exercised in seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from lab.services.aoai import FakeAzureOpenAI, FakeDeployment
from remediation.aoai.client import AoaiTransport, ClientConfig, Deployment, http_client
from remediation.aoai.records import JsonLinesSink, RequestRecord

W = 2.0  # the stand-in's minute
V = "2024-10-21"
CONFIG = ClientConfig(
    tpm_window_s=W,
    rpm_window_s=W / 6,
    retry_after_cap_s=W + 1,
    backoff_base_s=0.2,
    backoff_max_s=1.0,
    deadline_s=15.0,
    admission_lag_s=0.5,  # real seconds from sending to the stand-in's admission, generous: a shared, loaded machine
)


@pytest.fixture(scope="module")
def svc() -> Iterator[FakeAzureOpenAI]:
    deployments = [
        FakeDeployment("primary", tpm=3000, rpm=600),
        FakeDeployment("overflow", tpm=2000, rpm=600, region="Sweden Central"),
        FakeDeployment("nohint", tpm=1000, rpm=600, hints=False),
    ]
    with FakeAzureOpenAI(deployments, window_s=W, api_key="k") as service:
        yield service


@pytest.fixture
def fresh(svc: FakeAzureOpenAI) -> FakeAzureOpenAI:
    """The stand-in with empty windows (and every deployment back to its real Retry-After)."""
    time.sleep(0.05)
    svc.reset()
    for name in ("primary", "overflow", "nohint"):
        svc.set_retry_after_override(name, None)
    return svc


def chat(max_tokens: int, content: str = "hello there") -> dict[str, object]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}


def deps(svc: FakeAzureOpenAI, *names: str, priorities: tuple[int, ...] = ()) -> list[Deployment]:
    tpm = {"primary": 3000, "overflow": 2000, "nohint": 1000}
    return [
        Deployment(n, svc.url, tpm[n], rpm=600, priority=(priorities[i] if priorities else 1))
        for i, n in enumerate(names)
    ]


def hog(svc: FakeAzureOpenAI, deployment: str, tokens: int) -> None:
    """Another application spends ``tokens`` of the deployment's minute (the client cannot see it)."""
    prompt = svc.rate_limit_charge(chat(0, "x"), 0)  # what the service's rate limiter charges the prompt
    answer = httpx.post(
        f"{svc.url}/openai/deployments/{deployment}/chat/completions?api-version={V}",
        json=chat(tokens - prompt, "x"),
        headers={"api-key": "k"},
        timeout=10,
    )
    assert answer.status_code == 200


def sdk(svc: FakeAzureOpenAI, client: httpx.Client) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(azure_endpoint=svc.url, api_key="k", api_version=V, http_client=client)


def test_httpx_alone_routes_to_the_pool_and_logs_tokens(fresh: FakeAzureOpenAI, tmp_path: object) -> None:
    records: list[RequestRecord] = []
    pool = [Deployment("primary", fresh.url, 3000, api_key="k")]  # its own key replaces the caller's
    with httpx.Client(transport=AoaiTransport(pool, CONFIG, sink=records.append)) as client:
        answer = client.post(
            "https://any-name.openai.azure.com/openai/deployments/gpt-4o/chat/completions",
            params={"api-version": V},
            json=chat(50),
            headers={"api-key": "not-this-one"},
        )
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 50
    assert [a.deployment for a in fresh.arrivals] == ["primary"]
    (record,) = records
    usage = answer.json()["usage"]
    assert (record.deployment, record.status, record.outcome, record.attempts) == ("primary", 200, "ok", 1)
    # token logging: the estimate before sending, and the actual count from usage
    assert record.est_prompt_tokens == usage["prompt_tokens"]  # tiktoken cl100k offline, as the stand-in counts
    assert (record.est_max_tokens, record.est_tokens) == (50, usage["total_tokens"])
    assert (record.prompt_tokens, record.completion_tokens, record.total_tokens) == (
        usage["prompt_tokens"],
        50,
        usage["total_tokens"],
    )
    assert "k" not in record.to_dict().values()  # no key in the record


def test_other_routes_pass_through(fresh: FakeAzureOpenAI) -> None:
    with httpx.Client(transport=AoaiTransport(deps(fresh, "primary"), CONFIG, sink=lambda r: None)) as client:
        answer = client.get(f"{fresh.url}/openai/models", params={"api-version": V})
    assert answer.status_code == 404 and fresh.arrivals == []


def test_openai_sdk_with_the_client_and_a_json_lines_log(fresh: FakeAzureOpenAI, tmp_path: object) -> None:
    from pathlib import Path

    log = Path(str(tmp_path)) / "requests.jsonl"
    sink = JsonLinesSink(log)
    client = sdk(fresh, http_client(deps(fresh, "primary", "overflow"), CONFIG, sink=sink))
    answer = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=20)
    sink.close()
    assert answer.usage is not None and answer.usage.completion_tokens == 20
    assert answer.choices[0].message.content
    assert '"outcome": "ok"' in log.read_text()


def test_queue_keeps_a_burst_under_the_limits(fresh: FakeAzureOpenAI) -> None:
    transport = AoaiTransport(deps(fresh, "primary", "overflow"), CONFIG, sink=lambda r: None)
    client = sdk(fresh, httpx.Client(transport=transport))
    errors: list[Exception] = []

    def worker(n: int) -> None:
        for i in range(6):
            try:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"q{n}-{i} " * 20}], max_tokens=150
                )
            except Exception as exc:  # collected: the assertion below names it
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert transport.stats.succeeded == 48
    arrivals = fresh.arrivals
    assert len(arrivals) == 48 and all(a.admitted for a in arrivals)  # not one 429: the queue held them
    for name, tpm in (("primary", 3000), ("overflow", 2000)):
        mine = [a for a in arrivals if a.deployment == name]
        for a in mine:  # no rolling minute of the server ever received more than the limit
            assert sum(b.charge for b in mine if a.at <= b.at < a.at + W) <= tpm
    assert {a.deployment for a in arrivals} == {"primary", "overflow"}


def test_a_429_within_the_cap_is_waited_for_then_retried(fresh: FakeAzureOpenAI) -> None:
    hog(fresh, "primary", 2900)
    records: list[RequestRecord] = []
    client = sdk(fresh, http_client(deps(fresh, "primary"), CONFIG, sink=records.append))
    start = time.monotonic()
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=200)
    elapsed = time.monotonic() - start
    (record,) = records
    assert (record.attempts, record.throttled, record.outcome) == (2, 1, "ok")
    (hint,) = record.hints_s
    assert 0 < hint <= W  # retry-after-ms, the most precise hint
    assert elapsed >= hint * 0.95  # it waited for the hint, not less


def test_a_hint_above_the_cap_cools_the_deployment_and_moves_the_request(fresh: FakeAzureOpenAI) -> None:
    fresh.set_retry_after_override("primary", 86400)
    hog(fresh, "primary", 3000)
    fresh.arrivals.clear()
    records: list[RequestRecord] = []
    transport = AoaiTransport(deps(fresh, "primary", "overflow", priorities=(1, 2)), CONFIG, sink=records.append)
    client = sdk(fresh, httpx.Client(transport=transport))
    start = time.monotonic()
    for _ in range(4):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=100)
    assert time.monotonic() - start < W  # nobody slept
    first = records[0]
    assert (first.deployment, first.cooled, first.hints_s, first.attempts) == ("overflow", ("primary",), (86400.0,), 2)
    assert all(r.deployment == "overflow" and r.attempts == 1 for r in records[1:])
    assert [a.deployment for a in fresh.arrivals].count("primary") == 1  # never again to the cooling deployment
    assert transport.stats.for_deployment("primary").cooldowns == 1


def test_every_deployment_cooling_is_a_clear_error_at_once(fresh: FakeAzureOpenAI) -> None:
    fresh.set_retry_after_override("primary", 86400)
    hog(fresh, "primary", 3000)
    client = sdk(fresh, http_client(deps(fresh, "primary"), CONFIG, sink=lambda r: None))
    start = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=100)
    assert time.monotonic() - start < 1.0
    assert caught.value.response.headers["x-aoai-client"] == "cooling"
    assert caught.value.response.headers["x-should-retry"] == "false"  # so the SDK does not retry blindly
    assert "retry after 86400 seconds" in str(caught.value).lower()  # the server's own answer is kept
    assert len([a for a in fresh.arrivals if a.deployment == "primary"]) == 2  # the hog and one try


def test_no_hint_means_exponential_backoff(fresh: FakeAzureOpenAI) -> None:
    hog(fresh, "nohint", 950)
    records: list[RequestRecord] = []
    client = sdk(fresh, http_client(deps(fresh, "nohint"), CONFIG, sink=records.append))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=100)
    (record,) = records
    assert record.outcome == "ok" and record.throttled >= 1 and record.hints_s == ()
    assert record.latency_s < W + 2.5  # the minute freed after W; backoff steps of 0.2, 0.4, 0.8 (+jitter)


def test_deadline_and_too_large_are_clear_errors_before_the_deadline(fresh: FakeAzureOpenAI) -> None:
    hog(fresh, "primary", 2900)
    short = ClientConfig(tpm_window_s=W, rpm_window_s=W / 6, retry_after_cap_s=W + 1, deadline_s=0.5)
    records: list[RequestRecord] = []
    client = sdk(fresh, http_client(deps(fresh, "primary"), short, sink=records.append))
    start = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=200)
    assert time.monotonic() - start < 0.5 + 0.3
    assert caught.value.response.headers["x-aoai-client"] == "deadline"
    with pytest.raises(openai.RateLimitError, match="more than any deployment's tokens-per-minute limit"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    assert [r.outcome for r in records] == ["gave_up", "too_large"]
    assert records[1].attempts == 0  # nothing sent


def test_another_client_on_the_deployment_is_followed_through_remaining_tokens(fresh: FakeAzureOpenAI) -> None:
    hog(fresh, "primary", 2000)  # another application; the client's own count does not know
    transport = AoaiTransport(deps(fresh, "primary"), CONFIG, sink=lambda r: None)
    client = sdk(fresh, httpx.Client(transport=transport))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], max_tokens=50)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}], max_tokens=900)
    counters = transport.stats.for_deployment("primary")
    assert counters.synced_tokens >= 1900  # learned from x-ratelimit-remaining-tokens
    assert counters.throttled == 0  # so the second request queued instead of drawing a 429
