"""A page for one host's finding, to an Alertmanager-compatible webhook receiver.

The body is Alertmanager's webhook payload, ``version "4"`` (prometheus.io, Alertmanager configuration,
``<webhook_config>``): ``receiver``, ``status``, ``alerts`` (each with ``status``, ``labels``, ``annotations``,
``startsAt``, ``endsAt``, ``generatorURL``, ``fingerprint``), ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL``, ``groupKey`` and ``truncatedAlerts``. So whatever already takes
Alertmanager's pages (a paging service's Alertmanager integration, a chat bridge, a ticket hook) takes ours.

The page's **dedupe key** is stable: the same host, finding ID and boot ID (and discriminator, for a finding that
can occur more than once per host, such as one Xid code on one GPU) give the same key, whatever the run, the time
or the wording of the summary; a new boot gives a new one. It is the alert's ``fingerprint``, a label, and part of
the ``groupKey``, so a receiver that dedupes on either sees a repeated run's page as the same page.

:func:`send_page` posts with a bounded retry: at most ``attempts`` tries, each with a ``timeout``, waiting
``backoff_s`` doubled after each (at most 30 s); a connection error, a timeout, 408, 429 or a 5xx is retried, any
other answer is final. Redirects are not followed, no proxy is used unless asked, at most 64 KiB of the answer is
read. The bearer token (a setting) is sent only over https or to a loopback address, and never appears in a
result or an exception: every error text has it replaced by ``***``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import http.client
import ipaddress
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from remediation.core.findings import Finding
from remediation.escalation import EscalationError

__all__ = [
    "ALERTNAME",
    "PageResult",
    "build_payload",
    "check_url",
    "dedupe_key",
    "redact",
    "send_page",
]

ALERTNAME = "GpuFleetEscalation"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert
MAX_EVIDENCE = 4096  # characters of evidence in the description annotation
MAX_ANSWER = 64 * 1024
MAX_BACKOFF_S = 30.0
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def dedupe_key(host: str, finding_id: str, boot_id: str | None, discriminator: str = "") -> str:
    """16 hex digits (the width of Alertmanager's fingerprints) from (host, finding ID, boot ID, discriminator)."""
    material = "\x00".join((host, finding_id, boot_id or "", discriminator))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


def _iso(moment: _dt.datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("the page's time must be timezone-aware")
    return moment.astimezone(_dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _line(text: str) -> str:
    return _CONTROL.sub("?", text)


def build_payload(
    finding: Finding,
    *,
    boot_id: str | None,
    host: str | None = None,
    discriminator: str = "",
    detected_at: _dt.datetime | None = None,
    receiver: str = "gpufleet",
    fleet: str | None = None,
    external_url: str = "",
) -> dict[str, Any]:
    """The webhook body (Alertmanager payload version 4) for one finding; ``host`` defaults to the finding's."""
    name = host or finding.host
    if not name:
        raise EscalationError(f"finding {finding.id}: no host to page about")
    key = dedupe_key(name, finding.id, boot_id, discriminator)
    labels = {
        "alertname": ALERTNAME,
        "host": name,
        "finding_id": finding.id,
        "severity": finding.severity.value,
        "scenario": finding.scenario.value,
        "dedupe_key": key,
        "boot_id": boot_id or "",
    }
    if fleet:
        labels["fleet"] = fleet
    evidence = "\n".join(_line(e) for e in finding.evidence)
    if len(evidence) > MAX_EVIDENCE:
        evidence = evidence[:MAX_EVIDENCE] + "\n..."
    annotations = {"summary": _line(finding.summary), "description": evidence, "remedy": _line(finding.remedy)}
    group_labels = {"alertname": ALERTNAME, "dedupe_key": key}
    alert = {
        "status": "firing",
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(detected_at or _dt.datetime.now(_dt.UTC)),
        "endsAt": ZERO_TIME,
        "generatorURL": external_url,
        "fingerprint": key,
    }
    return {
        "version": "4",
        "groupKey": "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": dict(labels),
        "commonAnnotations": dict(annotations),
        "externalURL": external_url,
        "alerts": [alert],
    }


def redact(text: str, token: str | None) -> str:
    """``text`` with ``token`` (and any ``Bearer ...`` credential) replaced by ``***``."""
    if token:
        text = text.replace(token, "***")
    return re.sub(r"(?i)(bearer\s+)[^\s\"',;]+", r"\1***", text)


def _loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def check_url(url: str, token: str | None = None) -> str:
    """``url`` when pages may be posted there (with ``token``); :class:`EscalationError` naming the problem."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port
    except ValueError as exc:
        raise EscalationError(f"webhook URL is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EscalationError(f"webhook URL {redact(url, token)!r} must be http(s)://host/...")
    if parts.username is not None or parts.password is not None:
        raise EscalationError("webhook URL carries credentials: give the bearer token as the token setting instead")
    if token and parts.scheme != "https" and not _loopback(parts.hostname):
        raise EscalationError(
            f"webhook URL {parts.scheme}://{parts.hostname}: a bearer token is only sent over https (or to loopback)"
        )
    return url


@dataclass(frozen=True)
class PageResult:
    delivered: bool
    status: int | None  # the receiver's last HTTP status
    attempts: int
    error: str | None = None  # redacted


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is the receiver's answer, not somewhere to send the token


def send_page(
    url: str,
    payload: Mapping[str, Any],
    *,
    token: str | None = None,
    timeout: float = 10.0,
    attempts: int = 3,
    backoff_s: float = 1.0,
    use_env_proxy: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> PageResult:
    """POST ``payload`` to the webhook at ``url``, at most ``attempts`` times; never raises for what the network or
    the receiver does (only :class:`EscalationError` for unusable settings, before anything is sent)."""
    check_url(url, token)
    if not 1 <= attempts <= 10:
        raise EscalationError(f"page attempts {attempts} must be between 1 and 10")
    if not 0 < timeout <= 120:
        raise EscalationError(f"page timeout {timeout:g} s must be between 0 and 120 seconds")
    body = json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json", "User-Agent": "gpufleet-escalation/1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    proxies = urllib.request.ProxyHandler() if use_env_proxy else urllib.request.ProxyHandler({})
    opener = urllib.request.build_opener(proxies, _NoRedirect())
    status: int | None = None
    error: str | None = None
    for attempt in range(1, attempts + 1):
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 - http(s)
        retry = False
        try:
            with opener.open(request, timeout=timeout) as response:
                status = int(response.status)
                response.read(MAX_ANSWER)
            return PageResult(True, status, attempt)
        except urllib.error.HTTPError as exc:
            status = exc.code
            with exc:
                answer = exc.read(512).decode("utf-8", "replace")
            error = f"HTTP {exc.code} from the webhook: {' '.join(answer.split())[:200]}"
            retry = exc.code in RETRY_STATUS
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # TimeoutError is an OSError
            status = None
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            error = f"webhook not reached: {reason}"
            retry = True
        if not retry or attempt == attempts:
            return PageResult(False, status, attempt, redact(error or "?", token))
        sleep(min(backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
    raise AssertionError("unreachable")  # pragma: no cover
