"""The Azure OpenAI client layer: an httpx transport that keeps throughput under the rate limits.

Use it as the transport of any ``httpx.Client``, or give that client to the OpenAI SDK::

    from remediation.aoai import ClientConfig, Deployment, http_client
    import openai

    deployments = [
        Deployment("gpt-4o-eastus", "https://contoso-eastus.openai.azure.com", tpm=80_000, region="eastus"),
        Deployment("gpt-4o-swc", "https://contoso-swc.openai.azure.com", tpm=40_000, priority=2, region="swedencentral",
                   api_key=os.environ["AOAI_SWC_KEY"]),
    ]
    client = openai.AzureOpenAI(azure_endpoint=deployments[0].endpoint, api_key=os.environ["AOAI_KEY"],
                                api_version="2024-10-21", http_client=http_client(deployments))
    client.chat.completions.create(model="gpt-4o", messages=[...], max_tokens=200)

Every request to ``/openai/deployments/<any>/...`` is served by the pool of deployments (the name in the path is
replaced by the chosen deployment's, the host by its endpoint); other requests pass through untouched.

**Paths the client does not manage.** The Responses API (``client.responses.create``: ``/openai/responses``) and the
v1 API (``base_url=https://<resource>.openai.azure.com/openai/v1/``, the model in the body: ``/openai/v1/...``) pass
through as sent: no admission queue, no 429 handling, no records. The client says so once per path (a warning on the
``remediation.aoai.client`` logger, and ``ClientStats.unmanaged``), so nobody believes such traffic is kept under the
limits. Use the deployments route (``openai.AzureOpenAI(azure_endpoint=..., api_version=...)`` with
``chat.completions``) for traffic that must be.

**Credentials are scoped per deployment.** A deployment's own ``api_key`` (or ``token_provider``, sent as
``Authorization: Bearer``) is sent to that deployment only, and replaces whatever the caller sent. The caller's
``api-key``, ``Authorization`` and ``Ocp-Apim-Subscription-Key`` headers (the SDK's key) are sent only to a
deployment on the very host the caller addressed (same scheme, host and port) that has no credentials of its own;
never to another host. Endpoints must be ``https://``; plain ``http://`` is refused unless the host is loopback
(127.0.0.0/8, ``::1``, ``localhost``: the local stand-in). For each request:

1. **Admission queue.** The charge Azure will count (prompt tokens + ``max_tokens``, :mod:`remediation.aoai.tokens`)
   is checked against each deployment's rolling-minute TPM and 10-second RPM/6 windows
   (:mod:`remediation.aoai.admission`). A deployment's RPM is its ``rpm``, else its TPM times its model's RPM per
   1,000 TPM (:mod:`remediation.aoai.limits`: 1 for o3 and o4-mini, 1/6 for o1, 1/10 for o3-mini; 6 for models the
   table does not name), overridable per deployment with ``rpm_per_1000_tpm``. It goes to the highest-priority
   deployment that admits it now (weights share the load within a priority); when none does it waits, first in first
   out, for the earliest one. Nothing is sent that the client's own count says would be rejected.
2. **429.** The delay is the server's hint (``retry-after-ms`` > ``retry-after`` seconds > HTTP-date > "retry after N
   seconds" in the body, :mod:`remediation.aoai.hints`) when it is within ``retry_after_cap_s`` (60 s); without a hint,
   exponential backoff with jitter. The deployment is paused for that delay and the request queues again (ahead of
   new ones), so it goes to whichever deployment admits it first. A hint **above the cap** (Azure's "retry after 86400
   seconds") *cools* that deployment for the hinted time and moves the request to the next deployment at once: no
   request goes to a cooling deployment, and nobody sleeps for a day.
3. **Giving up** is a clear answer before the request's deadline (``deadline_s``): a 429 with ``x-should-retry:
   false`` (so the OpenAI SDK raises ``RateLimitError`` instead of retrying blindly) and ``x-aoai-client`` naming why:
   ``deadline`` (no deployment admits it in time), ``cooling`` (every deployment cools past the deadline),
   ``max-attempts``, ``too-large`` (the charge exceeds every deployment's TPM).
4. **Records.** One :class:`~remediation.aoai.records.RequestRecord` per request (estimated and actual tokens from
   ``usage``, deployment, latency, queueing, attempts, 429s, hints), and :class:`~remediation.aoai.records.ClientStats`
   counters. A response's ``usage`` above the estimate and its ``x-ratelimit-remaining-tokens`` below the client's
   own count (another client shares the deployment) are charged to the window, so the queue follows the server.

Thread-safe: one transport serves any number of threads. Synchronous httpx only (``httpx.Client``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import math
import random
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from remediation.aoai.admission import Admission, Limits
from remediation.aoai.hints import RetryHint, retry_hint
from remediation.aoai.limits import rpm_for, rpm_per_1000_tpm
from remediation.aoai.records import ClientStats, LogSink, RequestRecord, Sink
from remediation.aoai.tokens import OFFLINE_ENCODING, TokenCounter, TokenEstimate, counter, estimate_request
from remediation.core.errors import UsageError

__all__ = ["AoaiTransport", "ClientConfig", "Deployment", "Pool", "azure_openai", "http_client", "with_overrides"]

_ROUTE = re.compile(r"^(?P<prefix>.*?)/openai/deployments/(?P<deployment>[^/]+)/(?P<rest>.+)$")
# paths the client does not manage: the v1 API (model in the body) and the Responses API (no deployment in the path)
_UNMANAGED = re.compile(r"/openai/(?:(?P<v1>v1)/(?P<op>chat/completions|[^/]+)|(?P<responses>responses))(?:/|$)")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deployment:
    """One Azure OpenAI deployment the pool may send to."""

    name: str  # the deployment name in the URL path
    endpoint: str  # https://<resource>.openai.azure.com (or an APIM gateway URL)
    tpm: int  # tokens-per-minute quota of the deployment
    rpm: int | None = None  # requests per minute; default: tpm x the model's RPM per 1,000 TPM (limits.py)
    priority: int = 1  # lower first: 1 = primary, 2 = overflow, ...
    weight: float = 1.0  # share of the load among deployments of the same priority
    region: str = ""
    api_key: str | None = field(default=None, repr=False)  # sent as api-key to this deployment only; never logged
    # Microsoft Entra ID: called for each request to this deployment, sent as "Authorization: Bearer <token>"
    token_provider: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    model: str = ""  # the model deployed (o3-mini, gpt-4o, ...): picks the RPM per 1,000 TPM when rpm is not given
    rpm_per_1000_tpm: float | None = None  # overrides the model's ratio (limits.RPM_PER_1000_TPM)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise UsageError(f"deployment name {self.name!r}: give the deployment's name as in Azure (no '/')")
        _check_endpoint(self.name, self.endpoint)
        if self.tpm <= 0 or (self.rpm is not None and self.rpm <= 0) or self.weight <= 0:
            raise UsageError(f"deployment {self.name}: tpm, rpm and weight must be positive")
        if self.rpm_per_1000_tpm is not None and not (
            math.isfinite(self.rpm_per_1000_tpm) and self.rpm_per_1000_tpm > 0
        ):
            raise UsageError(f"deployment {self.name}: rpm_per_1000_tpm {self.rpm_per_1000_tpm} must be positive")

    @property
    def requests_per_minute(self) -> int:
        """``rpm``, else ``tpm`` x ``rpm_per_1000_tpm``, else ``tpm`` x the model's ratio (6 per 1,000 if unknown)."""
        if self.rpm is not None:
            return self.rpm
        return rpm_for(self.tpm, self.model, self.rpm_per_1000_tpm)

    @property
    def rpm_source(self) -> str:
        """Where :attr:`requests_per_minute` comes from, in words."""
        if self.rpm is not None:
            return "rpm given"
        if self.rpm_per_1000_tpm is not None:
            return f"{self.rpm_per_1000_tpm:g} RPM per 1,000 TPM given"
        ratio, known = rpm_per_1000_tpm(self.model)
        if known:
            return f"{self.model}: {float(ratio):g} RPM per 1,000 TPM (Azure's quota table)"
        what = f"model {self.model!r} not in the table" if self.model else "no model given"
        return f"{what}: the default {float(ratio):g} RPM per 1,000 TPM"


def with_overrides(deployments: Iterable[Deployment], rpm_per_1000_tpm: dict[str, float]) -> list[Deployment]:
    """``deployments`` with the ratios of ``aoai.rpm_per_1000_tpm`` (deployment name -> RPM per 1,000 TPM) applied;
    a deployment with its own ``rpm`` keeps it. A name that matches no deployment is an error (a typo)."""
    out = list(deployments)
    unknown = sorted(set(rpm_per_1000_tpm) - {d.name for d in out})
    if unknown:
        raise UsageError(f"aoai.rpm_per_1000_tpm names no deployment of the pool: {', '.join(unknown)}")
    return [
        dataclasses.replace(d, rpm_per_1000_tpm=rpm_per_1000_tpm[d.name]) if d.name in rpm_per_1000_tpm else d
        for d in out
    ]


@dataclass(frozen=True)
class ClientConfig:
    """How the client behaves; every duration in seconds."""

    retry_after_cap_s: float = 60.0  # a hint up to this is waited for; above it the deployment cools instead
    backoff_base_s: float = 1.0  # without a hint: base * 2**(attempt-1), with jitter, up to backoff_max_s
    backoff_max_s: float = 30.0
    max_attempts: int = 8  # HTTP requests per call, at most
    deadline_s: float = 300.0  # a call ends (answer or clear error) within this
    tpm_window_s: float = 60.0  # Azure's TPM window: a rolling minute
    rpm_window_s: float = 10.0  # Azure checks RPM/6 per 10 seconds
    headroom: float = 0.97  # share of each limit the queue fills
    admission_lag_s: float = 0.5  # a charge is held this long past its window: the time a request may take to
    # reach Azure's admission after it is sent (a real-time figure: keep it when the windows are scaled down)
    default_max_tokens: int = 4096  # charged when a request sets no max_tokens (set it: it is the charge)
    token_encoding: str = OFFLINE_ENCODING
    sync_remaining: bool = True  # follow x-ratelimit-remaining-tokens (other clients on the same deployment)

    def __post_init__(self) -> None:
        if not 0 < self.headroom <= 1:
            raise UsageError(f"headroom {self.headroom}: a share of the limit in (0, 1]")
        if self.admission_lag_s < 0:
            raise UsageError(f"admission_lag_s {self.admission_lag_s}: seconds, 0 or more")
        if self.max_attempts < 1 or self.deadline_s <= 0 or self.tpm_window_s <= 0 or self.rpm_window_s <= 0:
            raise UsageError("max_attempts, deadline_s and the windows must be positive")


class _State:
    """A deployment's mutable state in the pool (guarded by the transport's lock)."""

    def __init__(self, deployment: Deployment, config: ClientConfig) -> None:
        self.deployment = deployment
        self.admission = Admission(
            Limits(
                tpm=deployment.tpm,
                rpm=deployment.requests_per_minute,
                tpm_window_s=config.tpm_window_s,
                rpm_window_s=config.rpm_window_s,
                headroom=config.headroom,
                lag_s=config.admission_lag_s,
            )
        )
        self.paused_until = 0.0  # a hint within the cap, or a backoff
        self.cooled_until = 0.0  # a hint above the cap
        self.current_weight = 0.0  # smooth weighted round robin

    @property
    def name(self) -> str:
        return self.deployment.name

    def blocked_until(self) -> float:
        return max(self.paused_until, self.cooled_until)


class Pool:
    """Which deployment a request goes to, and when. Pure: time is passed in; not thread-safe on its own."""

    def __init__(self, deployments: Sequence[Deployment], config: ClientConfig, rng: random.Random | None = None):
        if not deployments:
            raise UsageError("the client needs at least one deployment")
        names = [d.name + "@" + d.endpoint for d in deployments]
        if len(set(names)) != len(names):
            raise UsageError("each deployment (name at endpoint) may be given once")
        self.config = config
        self.states = [_State(d, config) for d in deployments]
        for d in deployments:
            if d.rpm is None and d.rpm_per_1000_tpm is None and d.model and not rpm_per_1000_tpm(d.model)[1]:
                _log.warning(
                    "remediation.aoai: deployment %s: %s; give rpm or rpm_per_1000_tpm if Azure shows another RPM",
                    d.name,
                    d.rpm_source,
                )
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security

    def choose(self, charge: float, now: float, deadline: float) -> tuple[_State | None, float, str | None]:
        """``(deployment, when, None)``: send at ``when`` (``now``: at once); ``(None, inf, why)``: give up."""
        candidates: list[tuple[float, _State]] = []
        for state in self.states:
            if not state.admission.fits_ever(charge):
                continue
            at = max(now, state.blocked_until(), now + state.admission.wait(charge, now))
            candidates.append((at, state))
        if not candidates:
            return None, math.inf, "too-large"
        ready = [s for at, s in candidates if at <= now]
        if ready:
            best = min(s.deployment.priority for s in ready)
            return self._weighted([s for s in ready if s.deployment.priority == best]), now, None
        at, state = min(candidates, key=lambda c: (c[0], c[1].deployment.priority))
        if at > deadline:
            cooling = all(s.cooled_until > deadline for _, s in candidates)
            return None, math.inf, "cooling" if cooling else "deadline"
        return state, at, None

    def _weighted(self, group: list[_State]) -> _State:
        if len(group) == 1:
            return group[0]
        total = 0.0
        for state in group:
            state.current_weight += state.deployment.weight
            total += state.deployment.weight
        chosen = max(group, key=lambda s: s.current_weight)
        chosen.current_weight -= total
        return chosen

    def admit(self, state: _State, charge: float, now: float) -> None:
        state.admission.charge(charge, now)

    def throttled(self, state: _State, hint: RetryHint | None, now: float, attempt: int) -> tuple[str, float]:
        """Record a 429 from ``state``: ``("retry-after" | "cooldown" | "backoff", seconds)``."""
        cfg = self.config
        if hint is not None and hint.seconds <= cfg.retry_after_cap_s:
            state.paused_until = max(state.paused_until, now + hint.seconds)
            return "retry-after", hint.seconds
        if hint is not None:
            state.cooled_until = max(state.cooled_until, now + hint.seconds)
            return "cooldown", hint.seconds
        delay = min(cfg.backoff_base_s * 2.0 ** max(0, attempt - 1), cfg.backoff_max_s)
        delay = delay / 2 + self.rng.uniform(0, delay / 2)  # equal jitter: never less than half the step
        state.paused_until = max(state.paused_until, now + delay)
        return "backoff", delay


class _Waiter:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


@dataclass
class _Call:
    """One call's progress (for its record)."""

    request_id: str
    operation: str
    estimate: TokenEstimate
    started: float
    attempts: int = 0
    throttled: int = 0
    hints: list[float] = field(default_factory=list)
    cooled: list[str] = field(default_factory=list)
    queued: float = 0.0


class AoaiTransport(httpx.BaseTransport):
    """An httpx transport over a pool of Azure OpenAI deployments (see the module's documentation)."""

    def __init__(
        self,
        deployments: Iterable[Deployment],
        config: ClientConfig | None = None,
        *,
        inner: httpx.BaseTransport | None = None,
        sink: Sink | None = None,
        token_counter: TokenCounter | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        self.pool = Pool(list(deployments), self.config, rng)
        self.inner = inner or httpx.HTTPTransport()
        self.sink = sink or LogSink()
        self.counter = token_counter or counter(self.config.token_encoding)
        self.stats = ClientStats()
        self._lock = threading.Lock()
        self._queue: deque[_Waiter] = deque()
        self._warned: set[str] = set()  # unmanaged paths already named once

    # --- the queue -------------------------------------------------------------------------------------------

    def _acquire(self, charge: float, deadline: float, retry: bool) -> tuple[_State | None, str | None]:
        waiter = _Waiter()
        with self._lock:
            if retry:
                self._queue.appendleft(waiter)  # a request already admitted once goes before new ones
            else:
                self._queue.append(waiter)
        try:
            while True:
                with self._lock:
                    now = time.monotonic()
                    if self._queue[0] is waiter:
                        state, at, why = self.pool.choose(charge, now, deadline)
                        if state is None:
                            return None, why
                        if at <= now:
                            self.pool.admit(state, charge, now)
                            return state, None
                        timeout = at - now
                    else:
                        if now >= deadline:
                            return None, "deadline"
                        timeout = deadline - now
                    waiter.event.clear()
                waiter.event.wait(timeout)
        finally:
            with self._lock:
                was_head = bool(self._queue) and self._queue[0] is waiter
                self._queue.remove(waiter)
                if was_head and self._queue:
                    self._queue[0].event.set()

    # --- one request -----------------------------------------------------------------------------------------

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        route = _ROUTE.match(request.url.path)
        if route is None:
            self._unmanaged(request)
            return self.inner.handle_request(request)
        body = request.read()
        estimate = estimate_request(body, self.counter, self.config.default_max_tokens)
        call = _Call(uuid.uuid4().hex[:16], route.group("rest"), estimate, time.monotonic())
        deadline = call.started + self.config.deadline_s
        with self.stats._lock:
            self.stats.requests += 1
        last_429: httpx.Response | None = None
        while True:
            if call.attempts >= self.config.max_attempts:
                return self._give_up(request, call, last_429, "max-attempts")
            waited_from = time.monotonic()
            state, why = self._acquire(estimate.charge, deadline, retry=call.attempts > 0)
            call.queued += time.monotonic() - waited_from
            if state is None:
                return self._give_up(request, call, last_429, why or "deadline")
            call.attempts += 1
            with self.stats._lock:
                counters = self.stats.for_deployment(state.name)
                counters.sent += 1
                counters.est_tokens += estimate.charge
            response = self.inner.handle_request(self._to_deployment(request, state.deployment, route, body))
            if response.status_code != 429:
                return self._answer(response, state, call)
            response.read()
            response.close()
            hint = retry_hint(response.headers, response.content, now=time.time())
            call.throttled += 1
            if hint is not None:
                call.hints.append(round(hint.seconds, 3))
            with self._lock:
                kind, _delay = self.pool.throttled(state, hint, time.monotonic(), call.attempts)
            with self.stats._lock:
                counters = self.stats.for_deployment(state.name)
                counters.throttled += 1
                if kind == "cooldown":
                    counters.cooldowns += 1
            if kind == "cooldown":
                call.cooled.append(state.name)
            last_429 = response

    def _unmanaged(self, request: httpx.Request) -> None:
        """Say once per path that a v1 API or Responses API request passes through unmanaged."""
        found = _UNMANAGED.search(request.url.path)
        if found is None:
            return
        if found.group("responses"):
            path, what = "/openai/responses", "the Responses API"
        else:
            path, what = f"/openai/v1/{found.group('op')}", "the v1 API, model in the body"
        with self._lock:
            if path in self._warned:
                return
            self._warned.add(path)
        with self.stats._lock:
            self.stats.unmanaged.append(path)
        _log.warning(
            "remediation.aoai: %s (%s) is not managed: no admission queue, no 429 handling, no request records; "
            "it passes through as sent (use /openai/deployments/<name>/chat/completions for managed traffic)",
            path,
            what,
        )

    def _to_deployment(
        self, request: httpx.Request, deployment: Deployment, route: re.Match[str], body: bytes
    ) -> httpx.Request:
        url = httpx.URL(f"{deployment.endpoint.rstrip('/')}/openai/deployments/{deployment.name}/{route.group('rest')}")
        url = url.copy_with(params=request.url.params)
        headers = httpx.Headers(request.headers)
        # the caller's credentials were given for the host it addressed: they go there and nowhere else, and a
        # deployment with its own credentials gets only those
        own = deployment.api_key is not None or deployment.token_provider is not None
        dropped = _CREDENTIALS if own or _origin(request.url) != _origin(url) else ()
        for name in ("host", "content-length", *dropped):
            if name in headers:
                del headers[name]
        if deployment.api_key is not None:
            headers["api-key"] = deployment.api_key
        if deployment.token_provider is not None:
            headers["authorization"] = f"Bearer {deployment.token_provider()}"
        return httpx.Request(request.method, url, headers=headers, content=body, extensions=request.extensions)

    def _answer(self, response: httpx.Response, state: _State, call: _Call) -> httpx.Response:
        usage: dict[str, Any] = {}
        streaming = "text/event-stream" in response.headers.get("content-type", "")
        if response.is_success and not streaming:
            response.read()
            try:
                parsed = json.loads(response.content)
                usage = parsed.get("usage") or {} if isinstance(parsed, dict) else {}
            except (ValueError, UnicodeDecodeError):
                usage = {}
        prompt = _int(usage.get("prompt_tokens"))
        now = time.monotonic()
        with self._lock:
            if prompt is not None and prompt > call.estimate.prompt_tokens:
                state.admission.tokens.charge(prompt - call.estimate.prompt_tokens, now)
            synced = 0.0
            remaining = _int(response.headers.get("x-ratelimit-remaining-tokens"))
            if self.config.sync_remaining and remaining is not None:
                synced = state.admission.sync(state.deployment.tpm - remaining, now)
        ok = response.is_success
        with self.stats._lock:
            counters = self.stats.for_deployment(state.name)
            counters.synced_tokens += synced
            if ok:
                counters.ok += 1
                counters.actual_tokens += _int(usage.get("total_tokens")) or 0
                self.stats.succeeded += 1
            else:
                self.stats.http_errors += 1
            self.stats.queued_s += call.queued
        self._emit(
            call,
            state.deployment,
            response.status_code,
            "ok" if ok else "http_error",
            usage,
            None if ok else f"HTTP {response.status_code}",
        )
        return response

    def _give_up(self, request: httpx.Request, call: _Call, last: httpx.Response | None, why: str) -> httpx.Response:
        now = time.monotonic()
        states = ", ".join(
            f"{s.name} {'cooling' if s.cooled_until > now else 'paused' if s.paused_until > now else 'full'}"
            for s in self.pool.states
        )
        messages = {
            "deadline": f"no deployment could admit this request ({call.estimate.charge} tokens) within its deadline "
            f"of {self.config.deadline_s:g} s ({states})",
            "cooling": f"every deployment is cooling down past this request's deadline after a Retry-After above "
            f"{self.config.retry_after_cap_s:g} s ({states})",
            "max-attempts": f"still throttled after {call.attempts} attempts ({states})",
            "too-large": f"this request would be charged {call.estimate.charge} tokens (prompt "
            f"{call.estimate.prompt_tokens} + max_tokens {call.estimate.max_tokens}), more than any deployment's "
            "tokens-per-minute limit; lower max_tokens or split the prompt",
        }
        message = f"remediation.aoai gave up: {messages.get(why, why)}"
        headers = {"content-type": "application/json", "x-should-retry": "false", "x-aoai-client": why}
        if last is not None:
            for name in ("retry-after", "retry-after-ms", "x-ms-region", "apim-request-id", "policy-id"):
                if name in last.headers:
                    headers[name] = last.headers[name]
            headers["x-aoai-client-detail"] = message
            content = last.content
        else:
            content = json.dumps({"error": {"code": f"client-{why}", "message": message}}).encode()
        with self.stats._lock:
            self.stats.gave_up += 1
            self.stats.queued_s += call.queued
        self._emit(call, None, 429, "too_large" if why == "too-large" else "gave_up", {}, message)
        return httpx.Response(429, headers=headers, content=content, request=request)

    def _emit(
        self,
        call: _Call,
        deployment: Deployment | None,
        status: int,
        outcome: str,
        usage: dict[str, Any],
        detail: str | None,
    ) -> None:
        record = RequestRecord(
            ts=time.time(),
            request_id=call.request_id,
            operation=call.operation,
            deployment=deployment.name if deployment else None,
            region=(deployment.region or None) if deployment else None,
            status=status,
            outcome=outcome,
            attempts=call.attempts,
            throttled=call.throttled,
            hints_s=tuple(call.hints),
            cooled=tuple(call.cooled),
            est_prompt_tokens=call.estimate.prompt_tokens,
            est_max_tokens=call.estimate.max_tokens,
            est_tokens=call.estimate.charge,
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            total_tokens=_int(usage.get("total_tokens")),
            queued_s=round(call.queued, 4),
            latency_s=round(time.monotonic() - call.started, 4),
            detail=detail,
        )
        try:
            self.sink(record)
        except Exception:  # a broken log sink must not fail the request it logs
            import logging

            logging.getLogger(__name__).exception("request record sink failed")

    def close(self) -> None:
        self.inner.close()


#: Request headers that carry a credential: never sent to a host other than the one they were given for.
_CREDENTIALS = ("api-key", "authorization", "ocp-apim-subscription-key", "cookie", "proxy-authorization")


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default when not written): the unit a credential is scoped to."""
    default = {"https": 443, "http": 80}.get(url.scheme)
    return url.scheme, url.host.lower(), url.port or default


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_endpoint(name: str, endpoint: str) -> None:
    """``https://`` anywhere; plain ``http://`` only on loopback (a local stand-in), where no key crosses a network."""
    try:
        url = httpx.URL(endpoint)
    except (httpx.InvalidURL, TypeError):
        url = None
    if url is None or url.scheme not in ("https", "http") or not url.host:
        raise UsageError(f"deployment {name}: endpoint {endpoint!r} must be an https:// URL with a host")
    if url.scheme == "http" and not _loopback(url.host):
        raise UsageError(
            f"deployment {name}: endpoint {endpoint!r} is plain http to a host that is not loopback (its key would "
            "cross the network in clear text); use https:// (http is accepted only for 127.0.0.0/8, ::1, localhost)"
        )


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value))
        except ValueError:
            return None
    return None


def http_client(deployments: Iterable[Deployment], config: ClientConfig | None = None, **kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` whose transport is an :class:`AoaiTransport` (``kwargs`` go to the transport:
    ``inner``, ``sink``, ``token_counter``, ``rng``). Pass it as ``openai.AzureOpenAI(http_client=...)``."""
    timeout = kwargs.pop("timeout", httpx.Timeout(600.0, connect=5.0))
    return httpx.Client(transport=AoaiTransport(deployments, config, **kwargs), timeout=timeout)


def azure_openai(
    deployments: Sequence[Deployment],
    api_version: str,
    api_key: str | None = None,
    config: ClientConfig | None = None,
    **kwargs: Any,
) -> Any:
    """An ``openai.AzureOpenAI`` client over the pool (needs the ``openai`` package: ``pip install .[aoai]``).

    ``api_key`` is the key of the first deployment's endpoint: it is sent only to deployments at that same endpoint
    (scheme, host and port) that have no credentials of their own; give every deployment elsewhere its own ``api_key``
    or ``token_provider``. Call it with ``model=<any name>``: the pool chooses the deployment.
    """
    import openai

    client: Any = http_client(deployments, config, **kwargs)  # the SDK types it httpx2.Client; it accepts httpx's
    return openai.AzureOpenAI(
        azure_endpoint=deployments[0].endpoint, api_key=api_key, api_version=api_version, http_client=client
    )
