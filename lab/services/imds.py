"""An Azure Instance Metadata Service stand-in for Scheduled Events, on a loopback address the test chooses.

It answers ``/metadata/scheduledevents`` the way Azure documents it (learn.microsoft.com: "Azure Metadata Service:
Scheduled Events for Linux VMs" and "Azure Instance Metadata Service", Errors and debugging):

- ``GET /metadata/scheduledevents?api-version=V`` -> 200 ``{"DocumentIncarnation": N, "Events": [...]}``; each event
  has ``EventId``, ``EventType`` (Reboot | Redeploy | Freeze | Preempt | Terminate), ``ResourceType``
  (``VirtualMachine``), ``Resources`` (VM names), ``EventStatus`` (Scheduled | Started), ``NotBefore`` (an RFC 1123
  date, ``""`` once started), ``Description``, ``EventSource`` (Platform | User) and ``DurationInSeconds`` (-1 when
  unknown). Older api-versions lack the fields added after them (Description 2019-04-01, EventSource 2019-08-01,
  DurationInSeconds 2020-07-01), as the version table says.
- ``POST`` of ``{"StartRequests": [{"EventId": ...}]}`` approves events: each one becomes ``Started`` with a blank
  ``NotBefore``; 200 for known IDs (also when already started), 400 for a malformed body or an ID it does not know.
- ``DocumentIncarnation`` goes up by one on every change of the events array, and only then.
- A ``Scheduled`` event whose ``NotBefore`` has passed starts by itself ("automatically approved when the NotBefore
  time is reached"); :meth:`FakeImds.complete_event` removes an event (its terminal state: "removed from the list").
- 400 without the header ``Metadata: true`` (``{"error": "Bad request. Required metadata header not specified"}``),
  400 with an ``X-Forwarded-For`` header or a duplicated query parameter (both "rejected by the service"), 400 with
  IMDS's error body for a missing or unsupported api-version (``{"error": "Bad request. api-version is invalid or was
  not specified in the request. For more information refer to aka.ms/azureimds", "newest-versions": [...]}``),
  404 for another path, 405 for another method.

Events are scheduled and cleared by the test through Python methods (:meth:`schedule`, :meth:`start_event`,
:meth:`complete_event`, :meth:`clear`), not over HTTP: the only HTTP surface is the one Azure has. ``requests`` records
every request (method, path, whether the Metadata header was there), so a test can show what a client sent.

Lab hosts share the controller's network stack (they are mount/UTS/PID namespaces, not network ones: see
:mod:`lab.boot`), so a stand-in bound to a 127.0.0.0/8 address is reachable from a host's own ``python3``, over its
SSH session, exactly as 169.254.169.254 is from an Azure VM. The endpoint is always a setting: nothing here, nor any
test, ever sends a request to the real link-local address.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from lab.services import LoopbackService, require_loopback
from lab.services.jsonhttp import json_handler

__all__ = ["API_VERSIONS", "EVENT_TYPES", "PATH", "FakeImds", "ImdsEvent", "rfc1123"]

PATH = "/metadata/scheduledevents"
#: The Scheduled Events versions of the documentation's version table (newest first; 2017-03-01 was a preview).
API_VERSIONS = ("2020-07-01", "2019-08-01", "2019-04-01", "2019-01-01", "2017-11-01", "2017-08-01")
EVENT_TYPES = ("Reboot", "Redeploy", "Freeze", "Preempt", "Terminate")
MISSING_HEADER = "Bad request. Required metadata header not specified"
BAD_VERSION = (
    "Bad request. api-version is invalid or was not specified in the request. For more information refer to "
    "aka.ms/azureimds"
)
MAX_BODY = 64 * 1024  # the most of a POST body read


def rfc1123(moment: _dt.datetime) -> str:
    """``Mon, 19 Sep 2016 18:29:47 GMT``, the form of ``NotBefore``."""
    return email.utils.format_datetime(moment.astimezone(_dt.UTC), usegmt=True)


@dataclass(frozen=True)
class ImdsEvent:
    event_id: str
    event_type: str
    resources: tuple[str, ...]
    not_before: _dt.datetime | None
    status: str = "Scheduled"
    description: str = ""
    source: str = "Platform"
    duration_s: int = -1

    def to_wire(self, api_version: str) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "EventId": self.event_id,
            "EventStatus": self.status,
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(self.resources),
            "NotBefore": rfc1123(self.not_before) if self.not_before and self.status == "Scheduled" else "",
        }
        if api_version >= "2019-04-01":
            doc["Description"] = self.description
        if api_version >= "2019-08-01":
            doc["EventSource"] = self.source
        if api_version >= "2020-07-01":
            doc["DurationInSeconds"] = self.duration_s
        return doc


@dataclass
class _Request:
    method: str
    path: str
    metadata_header: bool
    status: int
    body: dict[str, Any] | None = field(default=None)


class FakeImds(LoopbackService):
    """``with FakeImds(host="127.0.0.1") as imds: imds.endpoint`` (the URL to give as the IMDS endpoint setting)."""

    thread_name = "fake-imds"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], _dt.datetime] | None = None,
        api_versions: Iterable[str] = API_VERSIONS,
    ) -> None:
        require_loopback(host, "IMDS stand-in")
        self.clock = clock or (lambda: _dt.datetime.now(_dt.UTC))
        self.api_versions = tuple(api_versions)
        self.incarnation = 1
        self.events: list[ImdsEvent] = []
        self.requests: list[_Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())

    @property
    def endpoint(self) -> str:
        """The Scheduled Events URL of this stand-in (no query: the client adds the api-version)."""
        return self.url + PATH

    # --- what the test does -------------------------------------------------------------------------------------

    def schedule(
        self,
        event_type: str,
        resources: Iterable[str],
        not_before: _dt.datetime | None = None,
        *,
        in_seconds: float | None = None,
        status: str = "Scheduled",
        description: str = "",
        source: str = "Platform",
        duration_s: int = -1,
        event_id: str | None = None,
    ) -> str:
        """Add an event (``in_seconds`` from now, or at ``not_before``); its EventId. The incarnation goes up."""
        if event_type not in EVENT_TYPES:
            raise ValueError(f"EventType {event_type!r} is not one of {', '.join(EVENT_TYPES)}")
        if status not in ("Scheduled", "Started"):
            raise ValueError(f"EventStatus {status!r} is not Scheduled or Started")
        if in_seconds is not None:
            not_before = self.clock() + _dt.timedelta(seconds=in_seconds)
        eid = event_id or str(uuid.uuid4()).upper()
        event = ImdsEvent(eid, event_type, tuple(resources), not_before, status, description, source, duration_s)
        with self._lock:
            self.events.append(event)
            self.incarnation += 1
        return eid

    def start_event(self, event_id: str) -> None:
        """The platform starts the event (as after an approval, or at NotBefore)."""
        with self._lock:
            self._start({event_id})

    def complete_event(self, event_id: str) -> None:
        """The event reached its terminal state: it leaves the document."""
        with self._lock:
            before = len(self.events)
            self.events = [e for e in self.events if e.event_id != event_id]
            if len(self.events) != before:
                self.incarnation += 1

    def clear(self) -> None:
        """Every event leaves the document."""
        with self._lock:
            if self.events:
                self.events = []
                self.incarnation += 1

    def document(self, api_version: str = API_VERSIONS[0]) -> dict[str, Any]:
        """The document a GET would return now."""
        with self._lock:
            self._tick()
            return self._document(api_version)

    def approvals(self) -> list[str]:
        """The EventIds that were approved over HTTP (StartRequests), in order."""
        with self._lock:
            return [
                str(item["EventId"])
                for r in self.requests
                if r.method == "POST" and r.status == 200 and r.body
                for item in r.body.get("StartRequests", [])
            ]

    # --- the service ----------------------------------------------------------------------------------------------

    def _start(self, ids: set[str]) -> bool:
        changed = False
        for i, event in enumerate(self.events):
            if event.event_id in ids and event.status != "Started":
                self.events[i] = replace(event, status="Started")
                changed = True
        if changed:
            self.incarnation += 1
        return changed

    def _tick(self) -> None:
        now = self.clock()
        due = {e.event_id for e in self.events if e.status == "Scheduled" and e.not_before and e.not_before <= now}
        if due:
            self._start(due)

    def _document(self, api_version: str) -> dict[str, Any]:
        return {"DocumentIncarnation": self.incarnation, "Events": [e.to_wire(api_version) for e in self.events]}

    def answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) for one request; records it."""
        status, doc, parsed = self._answer(method, target, headers, body)
        with self._lock:
            self.requests.append(
                _Request(method, urlsplit(target).path, headers.get("metadata") == "true", status, parsed)
            )
        return status, doc

    def _answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        url = urlsplit(target)
        if url.path.rstrip("/") != PATH:
            return 404, {"error": "Not found"}, None
        if method not in ("GET", "POST"):
            return 405, {"error": f"Method not allowed: {method}"}, None
        if headers.get("metadata") != "true":
            return 400, {"error": MISSING_HEADER}, None
        if "x-forwarded-for" in headers:
            return 400, {"error": "Bad request. X-Forwarded-For header is not allowed"}, None
        query = parse_qsl(url.query, keep_blank_values=True)
        names = [k for k, _ in query]
        if len(names) != len(set(names)):
            return 400, {"error": "Bad request. Duplicate query parameter"}, None
        version = dict(query).get("api-version", "")
        if version not in self.api_versions:
            return 400, {"error": BAD_VERSION, "newest-versions": list(self.api_versions[:3])}, None
        if method == "GET":
            with self._lock:
                self._tick()
                return 200, self._document(version), None
        try:
            parsed = json.loads(body.decode("utf-8"))
            requests = parsed["StartRequests"]
            if not isinstance(requests, list) or not requests:
                raise ValueError("no StartRequests")
            ids = {str(item["EventId"]) for item in requests}
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            return 400, {"error": "Bad request. The request body is malformed"}, None
        with self._lock:
            known = {e.event_id for e in self.events}
            if not ids <= known:
                return 400, {"error": f"Bad request. Unknown EventId {sorted(ids - known)[0]}"}, None
            self._start(ids)
        return 200, {}, parsed

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        def answer(method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, Any]:
            status, doc = self.answer(method, path, dict(headers), body)
            return status, doc if doc or status != 200 else None

        return json_handler(answer, max_body=MAX_BODY, content_type="application/json; charset=utf-8")
