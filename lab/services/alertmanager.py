"""An Alertmanager stand-in on loopback: ``GET /api/v2/alerts`` as Alertmanager's API v2 answers it.

From Alertmanager's OpenAPI spec (``api/v2/openapi.yaml``, operation ``getAlerts``): the query parameters
``active``, ``silenced``, ``inhibited``, ``unprocessed`` (booleans, each ``true`` when absent), ``filter`` (matchers,
repeatable: ``name="value"``, ``!=``, ``=~``, ``!~``) and ``receiver`` (a regex); the answer is a JSON array of
``gettableAlert`` (``labels``, ``annotations``, ``startsAt``, ``updatedAt``, ``endsAt``, ``fingerprint``,
``receivers``, ``status`` {``state``: active | suppressed | unprocessed, ``silencedBy``, ``inhibitedBy``},
``generatorURL``). A parameter it cannot read is 400 with the error as a JSON string; an unknown path 404.

Tests set the alerts with :meth:`FakeAlertmanager.fire` (``silenced`` / ``inhibited``: the alert is suppressed by a
silence or an inhibition) and :meth:`FakeAlertmanager.resolve`; ``down`` makes it answer 503. Only loopback
addresses are served.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lab.services import LoopbackService, require_loopback
from lab.services.jsonhttp import json_handler

__all__ = ["FakeAlertmanager"]

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$')
_BOOL = {"true": True, "false": False}


def _fingerprint(labels: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(sorted(labels.items()))).encode()).hexdigest()[:16]


def _matches(labels: Mapping[str, str], matcher: tuple[str, str, str]) -> bool:
    name, op, value = matcher
    have = labels.get(name, "")
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    hit = re.fullmatch(value, have) is not None
    return hit if op == "=~" else not hit


class FakeAlertmanager(LoopbackService):
    """``with FakeAlertmanager() as am: am.fire({"alertname": "GpuXid", "instance": "gpu-1:9100"}); am.url``."""

    thread_name = "fake-alertmanager"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        require_loopback(host, "Alertmanager stand-in")
        self.alerts: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []
        self.down = False
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())

    def fire(self, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None, *,
             silenced: bool = False, inhibited: bool = False, receiver: str = "default") -> str:
        """An alert that fires (from now until an hour from now, as Prometheus resends it); its fingerprint."""
        now = _dt.datetime.now(_dt.UTC)
        fp = _fingerprint(labels)
        state = "suppressed" if silenced or inhibited else "active"
        with self._lock:
            self.alerts[fp] = {
                "labels": dict(labels), "annotations": dict(annotations or {}),
                "startsAt": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "updatedAt": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "endsAt": (now + _dt.timedelta(hours=1)).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "fingerprint": fp, "receivers": [{"name": receiver}],
                "status": {"state": state, "silencedBy": ["lab-silence"] if silenced else [],
                           "inhibitedBy": ["lab-inhibitor"] if inhibited else []},
                "generatorURL": "http://prometheus.lab/graph",
            }
        return fp

    def resolve(self, fingerprint: str) -> None:
        with self._lock:
            self.alerts.pop(fingerprint, None)

    def answer(self, method: str, target: str) -> tuple[int, Any]:
        """(status, body) for one request; pure apart from the request log."""
        with self._lock:
            self.requests.append(f"{method} {target}")
            alerts = list(self.alerts.values())
        if self.down:
            return 503, "service unavailable"
        url = urlsplit(target)
        if url.path.rstrip("/") != "/api/v2/alerts":
            return 404, "not found"
        if method != "GET":
            return 405, f"method {method} not allowed"
        query = parse_qs(url.query, keep_blank_values=True)
        flags = {}
        for name in ("active", "silenced", "inhibited", "unprocessed"):
            raw = query.get(name, ["true"])[-1].lower()
            if raw not in _BOOL:
                return 400, f"{name} in query must be of type boolean: {raw!r}"
            flags[name] = _BOOL[raw]
        matchers = []
        for text in query.get("filter", []):
            m = _MATCHER.match(text)
            if m is None:
                return 400, f"bad matcher format: {text}"
            matchers.append((m[1], m[2], m[3]))
        receiver = query.get("receiver", [""])[-1]
        out = []
        for a in alerts:
            st = a["status"]
            if st["state"] == "active" and not flags["active"]:
                continue
            if st["state"] == "unprocessed" and not flags["unprocessed"]:
                continue
            if st["silencedBy"] and not flags["silenced"]:
                continue
            if st["inhibitedBy"] and not flags["inhibited"]:
                continue
            if not all(_matches(a["labels"], m) for m in matchers):
                continue
            if receiver and not any(re.fullmatch(receiver, r["name"]) for r in a["receivers"]):
                continue
            out.append(a)
        return 200, out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return json_handler(lambda method, path, headers, body: self.answer(method, path))
