"""An Alertmanager-compatible webhook receiver on loopback: what a paging service's Alertmanager integration is.

It takes ``POST`` of Alertmanager's webhook payload, ``version "4"`` (prometheus.io, ``<webhook_config>``):
``receiver``, ``status`` (firing | resolved), ``alerts`` (each ``status``, ``labels``, ``annotations``,
``startsAt``, ``endsAt``, ``fingerprint``, ``generatorURL``), ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL``, ``groupKey``, ``truncatedAlerts``, and records what it got:

- ``deliveries``: every well-formed POST, duplicates included (so a test sees a retry or a repeat);
- ``pages``: one entry per distinct alert notification, keyed on ``(groupKey, fingerprint, status)``: Alertmanager
  (and our sender) deliver at least once, so the same firing alert delivered again is not a new page, while the
  same alert resolved is. A duplicate is answered 200 like the first delivery: the receiver is idempotent.

400 for a body that is not such a payload (not JSON, another version, an alert without a fingerprint or labels),
401 when a bearer token is set and the request does not carry it, 405 for anything but POST. :meth:`fail_next`
makes the next N deliveries fail with a status (503 by default), to exercise a sender's retry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lab.services import LoopbackService, require_loopback
from lab.services.jsonhttp import json_handler

__all__ = ["AlertReceiver", "Page", "validate_payload"]

MAX_BODY = 1024 * 1024
ALERT_KEYS = ("status", "labels", "annotations", "startsAt", "endsAt", "fingerprint")
PAYLOAD_KEYS = ("receiver", "status", "alerts", "groupLabels", "commonLabels", "groupKey", "version")


def validate_payload(doc: Any) -> str | None:
    """Why ``doc`` is not an Alertmanager version-4 webhook payload, or None."""
    if not isinstance(doc, Mapping):
        return "the body is not a JSON object"
    missing = [k for k in PAYLOAD_KEYS if k not in doc]
    if missing:
        return f"no {', '.join(missing)}"
    if doc["version"] != "4":
        return f"version {doc['version']!r} is not \"4\""
    if doc["status"] not in ("firing", "resolved"):
        return f"status {doc['status']!r} is not firing or resolved"
    if not isinstance(doc["alerts"], list) or not doc["alerts"]:
        return "alerts is not a non-empty list"
    for i, alert in enumerate(doc["alerts"]):
        if not isinstance(alert, Mapping):
            return f"alerts[{i}] is not an object"
        gone = [k for k in ALERT_KEYS if k not in alert]
        if gone:
            return f"alerts[{i}] has no {', '.join(gone)}"
        if not isinstance(alert["labels"], Mapping) or not isinstance(alert["fingerprint"], str):
            return f"alerts[{i}] labels or fingerprint malformed"
    return None


@dataclass(frozen=True)
class Page:
    group_key: str
    fingerprint: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str


class AlertReceiver(LoopbackService):
    """``with AlertReceiver() as rx: rx.url`` (POST there); ``rx.pages`` after."""

    thread_name = "alert-webhook"

    def __init__(self, host: str = "127.0.0.1", token: str | None = None, path: str = "/alerts") -> None:
        require_loopback(host, "webhook receiver stand-in")
        self.token = token
        self.path = path
        self.deliveries: list[dict[str, Any]] = []
        self.pages: list[Page] = []
        self.refused: list[tuple[int, str]] = []
        self.authorizations: list[str] = []  # what came in Authorization headers (tests check the token was sent)
        self._seen: set[tuple[str, str, str]] = set()
        self._fail: list[int] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler())

    @property
    def webhook_url(self) -> str:
        return self.url + self.path

    def fail_next(self, count: int, status: int = 503) -> None:
        """The next ``count`` deliveries are answered ``status`` (and not recorded as pages)."""
        with self._lock:
            self._fail.extend([status] * count)

    def answer(self, method: str, path: str, authorization: str, body: bytes) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.authorizations.append(authorization)
            if method != "POST":
                return self._refuse(405, f"method {method} not allowed")
            if path != self.path:
                return self._refuse(404, f"no receiver at {path}")
            if self.token is not None and authorization != f"Bearer {self.token}":
                return self._refuse(401, "unauthorized")
            if self._fail:
                return self._refuse(self._fail.pop(0), "failing on purpose")
            try:
                doc = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                return self._refuse(400, "body is not JSON")
            problem = validate_payload(doc)
            if problem is not None:
                return self._refuse(400, problem)
            self.deliveries.append(doc)
            new = 0
            for alert in doc["alerts"]:
                key = (str(doc["groupKey"]), alert["fingerprint"], str(alert["status"]))
                if key in self._seen:
                    continue
                self._seen.add(key)
                new += 1
                self.pages.append(Page(key[0], key[1], key[2], {str(k): str(v) for k, v in alert["labels"].items()},
                                       {str(k): str(v) for k, v in dict(alert["annotations"]).items()},
                                       str(alert["startsAt"])))
            return 200, {"status": "success", "new": new, "duplicates": len(doc["alerts"]) - new}

    def _refuse(self, status: int, why: str) -> tuple[int, dict[str, Any]]:
        self.refused.append((status, why))
        return status, {"status": "error", "error": why}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return json_handler(lambda method, path, headers, body: self.answer(
            method, path, headers.get("authorization", ""), body), max_body=MAX_BODY)
