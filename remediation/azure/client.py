"""One ARM client over one azure-core pipeline: auth, retries, long-running operations, ARM's errors.

The pipeline (outermost first): user agent -> retry (ARM throttling ``429`` and transient ``408``/``5xx``/connection
errors, honouring ``Retry-After`` up to ``max_retry_after_s``, exponential backoff otherwise, ``retry_total`` at most)
-> same-host guard (a bearer token only ever goes to the session's Resource Manager host: polling URLs and
``nextLink`` pointing anywhere else are refused) -> bearer token (azure-core sends it over https only).

Long-running operations (:meth:`ArmClient.wait`) follow ARM's async pattern: ``Azure-AsyncOperation`` (poll its
status body: ``InProgress`` -> ``Succeeded | Failed | Canceled``), else ``Location`` (``202`` while running, then the
final answer; Microsoft.Quota puts ``properties.provisioningState`` there: ``Succeeded | Failed | Invalid``), else the
resource's own ``provisioningState``. Each wait honours ``Retry-After`` and ends by ``poll_timeout_s``.

Errors: any other status >= 400 becomes :class:`~.errors.ArmError` with ARM's ``error.code`` and ``error.message``
(and the request id for a support case). Tokens are never logged or put in a message: no HTTP logging policy is
installed, and messages are built from status, code, message and URL path only.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from remediation.azure.errors import ArmError, AzureLoginError
from remediation.azure.session import ArmSession
from remediation.azure.settings import AzureSettings

__all__ = ["TERMINAL_STATES", "ArmClient", "ArmResponse", "ClientStats", "LroOutcome"]

TERMINAL_STATES = frozenset({"succeeded", "failed", "canceled", "cancelled", "invalid"})
USER_AGENT = "gpu-fleet-remediation/0.1"


@dataclass(frozen=True)
class ArmResponse:
    status: int
    headers: Mapping[str, str]
    body: Any  # parsed JSON, or None
    url: str

    def header(self, name: str) -> str | None:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return str(v)
        return None


@dataclass(frozen=True)
class LroOutcome:
    """How a long-running operation ended: ``state`` as ARM spelled it, the last body, ARM's error if any."""

    state: str
    body: Any
    error_code: str = ""
    error_message: str = ""
    polls: int = 0

    @property
    def succeeded(self) -> bool:
        return self.state.lower() == "succeeded"


@dataclass
class ClientStats:
    """What the pipeline did (for the report and the tests): requests sent, throttled answers, retries."""

    requests: int = 0
    throttled: int = 0
    retried: int = 0
    waited_s: float = 0.0
    statuses: list[int] = field(default_factory=list)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _path_of(url: str) -> str:
    """A URL without its query (api-version, skip tokens) and without any user info, for messages."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))


def arm_error_parts(body: Any) -> tuple[str, str]:
    """ARM's error envelope ``{"error": {"code", "message"}}`` (or a bare ``{"code", "message"}``)."""
    if isinstance(body, Mapping):
        err = body.get("error") if isinstance(body.get("error"), Mapping) else body
        if isinstance(err, Mapping):
            return str(err.get("code") or ""), str(err.get("message") or "")
    return "", ""


def _build_pipeline(session: ArmSession, settings: AzureSettings, stats: ClientStats) -> Any:
    from azure.core import PipelineClient
    from azure.core.pipeline.policies import (
        BearerTokenCredentialPolicy,
        RetryPolicy,
        SansIOHTTPPolicy,
        UserAgentPolicy,
    )
    from azure.core.pipeline.transport import RequestsTransport

    allowed = urlsplit(session.endpoint)

    class SameHostPolicy(SansIOHTTPPolicy):  # type: ignore[type-arg]
        """Never send the token anywhere but the session's Resource Manager (scheme, host and port)."""

        def on_request(self, request: Any) -> None:
            target = urlsplit(request.http_request.url)
            if (target.scheme, target.hostname, target.port) != (allowed.scheme, allowed.hostname, allowed.port):
                raise ArmError(
                    f"refusing to send Azure credentials to {_path_of(request.http_request.url)}: not the Resource"
                    f" Manager endpoint {session.endpoint} of the active cloud"
                )
            stats.requests += 1

        def on_response(self, request: Any, response: Any) -> None:
            status = int(response.http_response.status_code)
            stats.statuses.append(status)
            if status == 429:
                stats.throttled += 1

    class CappedRetryPolicy(RetryPolicy[Any, Any]):
        """azure-core's retry, but a Retry-After longer than ``max_retry_after_s`` is reported, not slept through."""

        def is_retry(self, settings_: Any, response: Any) -> bool:
            wait = retry_after_seconds(response.http_response.headers.get("Retry-After"))
            if wait is not None and wait > settings.max_retry_after_s:
                return False
            retry = bool(super().is_retry(settings_, response))
            if retry:
                stats.retried += 1
                stats.waited_s += wait or 0.0
            return retry

    policies = [
        UserAgentPolicy(base_user_agent=USER_AGENT),
        CappedRetryPolicy(
            retry_total=settings.retry_total,
            retry_backoff_factor=settings.retry_backoff_s,
            retry_backoff_max=settings.retry_backoff_max_s,
        ),
        SameHostPolicy(),
        BearerTokenCredentialPolicy(session.credential, session.scope),
    ]
    transport = RequestsTransport(
        connection_timeout=settings.request_timeout_s, read_timeout=settings.request_timeout_s
    )
    return PipelineClient(base_url=session.endpoint, policies=policies, transport=transport)


class ArmClient:
    """Requests to one Resource Manager endpoint with one credential (see the module docstring)."""

    def __init__(
        self,
        session: ArmSession,
        settings: AzureSettings | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.session = session
        self.settings = settings or AzureSettings()
        self.stats = ClientStats()
        self._sleep = sleep
        self._pipeline = _build_pipeline(session, self.settings, self.stats)

    # -- plain requests ----------------------------------------------------------------------------------------
    def url(self, path: str, api_version: str | None = None, **query: str) -> str:
        """An absolute URL for ``path`` (a resource path or an absolute URL from ARM) with its query."""
        from urllib.parse import urlencode

        base = path if path.startswith("https://") else self.session.endpoint + "/" + path.lstrip("/")
        params = {**({"api-version": api_version} if api_version else {}), **query}
        if not params:
            return base
        return base + ("&" if "?" in base else "?") + urlencode(params)

    def send(self, method: str, url: str, body: Any = None, *, ok: tuple[int, ...] = ()) -> ArmResponse:
        """One request (retries included); :class:`ArmError` for a status >= 400 not in ``ok``."""
        from azure.core.exceptions import AzureError, ClientAuthenticationError, ServiceRequestError
        from azure.core.rest import HttpRequest

        headers = {"Accept": "application/json"}
        request = HttpRequest(method, url, headers=headers, json=body) if body is not None else HttpRequest(
            method, url, headers=headers
        )
        try:
            response = self._pipeline.send_request(request)
            response.read()
        except ArmError:
            raise
        except ClientAuthenticationError as exc:
            raise AzureLoginError(f"could not get an Azure token: {_first_line(exc)}; run `az login`") from None
        except ServiceRequestError as exc:
            raise ArmError(f"could not reach Azure Resource Manager at {_path_of(url)}: {_first_line(exc)}") from None
        except AzureError as exc:
            raise ArmError(f"{method} {_path_of(url)} failed: {_first_line(exc)}") from None
        except Exception as exc:  # the credential's own errors (azure-cli, MSAL): a login problem, never a token
            if type(exc).__module__.split(".")[0] in ("azure", "msal", "knack"):
                raise AzureLoginError(f"could not get an Azure token: {_first_line(exc)}; run `az login`") from None
            raise
        text = response.text()
        try:
            parsed = json.loads(text) if text.strip() else None
        except ValueError:
            parsed = None
        result = ArmResponse(int(response.status_code), dict(response.headers), parsed, url)
        if result.status >= 400 and result.status not in ok:
            raise self.error(method, result)
        return result

    def error(self, method: str, response: ArmResponse) -> ArmError:
        code, message = arm_error_parts(response.body)
        request_id = response.header("x-ms-request-id") or response.header("x-ms-correlation-request-id") or ""
        extra = ""
        if response.status == 429:
            wait = retry_after_seconds(response.header("Retry-After"))
            extra = f" (throttled; Retry-After {wait:.0f} s)" if wait is not None else " (throttled)"
        what = f"{code}: {message}" if code or message else f"HTTP {response.status}"
        return ArmError(
            f"{method} {_path_of(response.url)} -> {response.status} {what}{extra}"
            + (f" [request id {request_id}]" if request_id else ""),
            status=response.status, code=code, arm_message=message, request_id=request_id,
        )

    def get(self, path: str, api_version: str, **query: str) -> Any:
        return self.send("GET", self.url(path, api_version, **query)).body

    def list(self, path: str, api_version: str) -> Iterator[Any]:
        """Every item of a list operation, following ``nextLink`` (``max_pages`` at most)."""
        url: str | None = self.url(path, api_version)
        pages = 0
        while url:
            pages += 1
            if pages > self.settings.max_pages:
                raise ArmError(
                    f"GET {_path_of(url)}: more than {self.settings.max_pages} pages; raise azure.max_pages"
                )
            body = self.send("GET", url).body or {}
            yield from body.get("value") or []
            url = body.get("nextLink") or None

    # -- long-running operations -------------------------------------------------------------------------------
    def wait(self, initial: ArmResponse, what: str, *, timeout_s: float | None = None) -> LroOutcome:
        """Poll a long-running operation started by ``initial`` to a terminal state (see the module docstring)."""
        timeout = self.settings.poll_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        async_url = initial.header("Azure-AsyncOperation")
        location = initial.header("Location")
        state = _provisioning_state(initial.body)
        if not async_url and not location:
            if initial.status in (200, 201) and state and state.lower() not in TERMINAL_STATES:
                poll_url = initial.url  # the resource's own provisioningState
            else:
                code, message = _body_error(initial.body)
                return LroOutcome(state or "Succeeded", initial.body, code, message)
        else:
            poll_url = async_url or location or initial.url
        last = initial
        polls = 0
        while True:
            delay = retry_after_seconds(last.header("Retry-After"))
            delay = self.settings.poll_interval_s if delay is None else delay
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ArmError(
                    f"{what}: not finished after {timeout:.0f} s (last state {state or 'unknown'}); follow it at"
                    f" {_path_of(poll_url)} or raise azure.poll_timeout_s"
                )
            self._sleep(min(delay, remaining))
            polls += 1
            last = self.send("GET", poll_url)
            if async_url:
                body = last.body or {}
                state = str(body.get("status") or "InProgress")
                if state.lower() in TERMINAL_STATES:
                    code, message = arm_error_parts(body)
                    return LroOutcome(state, body, code, message, polls)
            elif location and poll_url == location:
                if last.status == 202:
                    state = _provisioning_state(last.body) or "InProgress"
                    continue
                state = _provisioning_state(last.body) or "Succeeded"
                if state.lower() in TERMINAL_STATES:
                    code, message = _body_error(last.body)
                    return LroOutcome(state, last.body, code, message, polls)
            else:
                state = _provisioning_state(last.body) or "Succeeded"
                if state.lower() in TERMINAL_STATES:
                    code, message = _body_error(last.body)
                    return LroOutcome(state, last.body, code, message, polls)


def _provisioning_state(body: Any) -> str | None:
    if isinstance(body, Mapping):
        props = body.get("properties")
        if isinstance(props, Mapping) and props.get("provisioningState"):
            return str(props["provisioningState"])
    return None


def _body_error(body: Any) -> tuple[str, str]:
    """The error a terminal resource/status body carries: ``properties.error`` (Microsoft.Quota) or ``error``."""
    if isinstance(body, Mapping):
        props = body.get("properties")
        if isinstance(props, Mapping) and isinstance(props.get("error"), Mapping):
            err = props["error"]
            return str(err.get("code") or ""), str(err.get("message") or props.get("message") or "")
        if isinstance(body.get("error"), Mapping):
            return arm_error_parts(body)
    return "", ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
