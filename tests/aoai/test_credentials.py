"""Credentials are scoped per deployment: two loopback stand-ins on different hosts and ports, each with its own key,
record the headers they get; the caller's key never reaches the other host. Plain http off loopback is refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from lab.services.aoai import FakeAzureOpenAI, FakeDeployment, _Handler
from remediation.aoai.client import ClientConfig, Deployment, http_client
from remediation.core.errors import UsageError

V = "2024-10-21"
CONFIG = ClientConfig(deadline_s=15.0, max_attempts=2)
SECRET_HEADERS = ("api-key", "authorization", "ocp-apim-subscription-key")


class Recording(FakeAzureOpenAI):
    """The stand-in, keeping the headers of every POST it gets."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.seen: list[dict[str, str]] = []
        self._seen_lock = threading.Lock()
        service = self

        class Handler(_Handler):
            def do_POST(self) -> None:
                with service._seen_lock:
                    service.seen.append({k.lower(): v for k, v in self.headers.items()})
                super().do_POST()

        assert self._server is not None
        self._server.RequestHandlerClass = Handler


@pytest.fixture
def two() -> Iterator[tuple[Recording, Recording]]:
    with (
        Recording([FakeDeployment("east", tpm=100_000, rpm=6000)], api_key="key-a", host="127.0.0.1") as a,
        Recording([FakeDeployment("west", tpm=100_000, rpm=6000)], api_key="key-b", host="127.0.0.2") as b,
    ):
        yield a, b


def ask(client: httpx.Client, url: str, n: int, headers: dict[str, str]) -> list[int]:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    return [
        client.post(
            f"{url}/openai/deployments/any/chat/completions", params={"api-version": V}, json=body, headers=headers
        ).status_code
        for _ in range(n)
    ]


def test_the_callers_key_and_token_never_reach_another_host(two: tuple[Recording, Recording]) -> None:
    a, b = two
    pool = [Deployment("east", a.url, 100_000, rpm=6000), Deployment("west", b.url, 100_000, rpm=6000, api_key="key-b")]
    caller = {"api-key": "key-a", "Authorization": "Bearer token-for-a", "Ocp-Apim-Subscription-Key": "apim-a"}
    with http_client(pool, CONFIG, sink=lambda r: None) as client:
        codes = ask(client, a.url, 6, caller)
    assert codes == [200] * 6
    assert a.seen and b.seen  # both deployments served (same priority, equal weights)
    for headers in a.seen:  # the host the caller addressed gets the caller's credentials
        assert (headers["api-key"], headers["authorization"]) == ("key-a", "Bearer token-for-a")
    for headers in b.seen:  # the other host gets its own key, nothing of the caller's
        assert headers["api-key"] == "key-b"
        assert "authorization" not in headers and "ocp-apim-subscription-key" not in headers


def test_a_deployment_without_its_own_key_on_another_host_gets_none(two: tuple[Recording, Recording]) -> None:
    a, b = two
    pool = [Deployment("west", b.url, 100_000, rpm=6000)]
    with http_client(pool, CONFIG, sink=lambda r: None) as client:
        codes = ask(client, a.url, 1, {"api-key": "key-a", "Authorization": "Bearer token-for-a"})
    assert codes == [401]  # refused by the other host, and it never saw the caller's secrets
    (headers,) = b.seen
    assert not any(name in headers for name in SECRET_HEADERS)


def test_same_host_other_port_is_another_host(two: tuple[Recording, Recording]) -> None:
    a, _b = two
    with Recording([FakeDeployment("east", tpm=100_000, rpm=6000)], api_key="key-c", host="127.0.0.1") as c:
        assert c.url != a.url and c.url.split("//")[1].split(":")[0] == a.url.split("//")[1].split(":")[0]
        pool = [Deployment("east", c.url, 100_000, rpm=6000)]
        with http_client(pool, CONFIG, sink=lambda r: None) as client:
            assert ask(client, a.url, 1, {"api-key": "key-a"}) == [401]
        assert "api-key" not in c.seen[0]


def test_token_provider_is_per_deployment(two: tuple[Recording, Recording]) -> None:
    a, b = two
    calls: list[str] = []

    def token() -> str:
        calls.append("west")
        return "entra-west"

    pool = [Deployment("west", b.url, 100_000, rpm=6000, api_key="key-b", token_provider=token)]
    with http_client(pool, CONFIG, sink=lambda r: None) as client:
        assert ask(client, a.url, 2, {"Authorization": "Bearer token-for-a"}) == [200, 200]
    assert [h["authorization"] for h in b.seen] == ["Bearer entra-west"] * 2 and calls == ["west", "west"]
    assert a.seen == []


def test_the_sdk_key_goes_only_to_its_own_endpoint(two: tuple[Recording, Recording]) -> None:
    a, b = two
    pool = [Deployment("east", a.url, 100_000, rpm=6000), Deployment("west", b.url, 100_000, rpm=6000, api_key="key-b")]
    client = openai.AzureOpenAI(
        azure_endpoint=a.url, api_key="key-a", api_version=V, http_client=http_client(pool, CONFIG, sink=lambda r: None)
    )
    for _ in range(4):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert {h["api-key"] for h in a.seen} == {"key-a"} and {h["api-key"] for h in b.seen} == {"key-b"}


@pytest.mark.parametrize(
    "endpoint",
    ["http://contoso.openai.azure.com", "http://10.0.0.4:8080", "http://[2001:db8::1]", "http://127.example.com"],
)
def test_plain_http_off_loopback_is_refused(endpoint: str) -> None:
    with pytest.raises(UsageError) as err:
        Deployment("d", endpoint, 1000)
    message = str(err.value)
    assert endpoint in message and "https://" in message and "\n" not in message


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:8080",
        "http://127.3.4.5",
        "http://[::1]:9000",
        "http://localhost:1234",
        "https://contoso.openai.azure.com",
    ],
)
def test_https_and_loopback_http_are_accepted(endpoint: str) -> None:
    assert Deployment("d", endpoint, 1000).endpoint == endpoint
