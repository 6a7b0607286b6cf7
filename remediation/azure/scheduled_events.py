"""Azure Scheduled Events of each GPU host, read on the host from its IMDS, and what they mean for remediation.

Azure announces platform maintenance of a VM (a reboot, a redeploy to another node, a freeze for a live migration,
a Spot eviction, a scale-set deletion) as *Scheduled Events* in the VM's Instance Metadata Service, reachable only
from inside the VM. So the reading is done on the host: :mod:`remediation.hostside.scheduled_events` travels over
the fan-out's SSH session (bundled by :func:`remediation.hostside.bundle_program`), asks IMDS with ``Metadata:
true``, no proxy, a short timeout and a bounded answer, and prints one JSON document. Here that document is
validated into frozen values (:class:`EventsDocument`, :class:`ScheduledEvent`) and judged per host
(:func:`decide`):

- ``clear``: no event concerns this VM: nothing of Azure's stands in the way of acting on the host;
- ``wait``: an event is pending whose ``NotBefore`` is later than now + ``horizon``: do not act on top of it, look
  again on a later run;
- ``escalate``: an event has started, or is due within the horizon (or its time cannot be read): the platform is
  about to act on a host that has a finding, so a person hears of it now, with the evidence, before it does.

Whatever the event type (Reboot, Redeploy, Freeze, Preempt, Terminate, or a type Azure adds later), remediation never
acts on top of a pending event. An event concerns the VM when ``Resources`` names it (events of an availability set
or a placement group are delivered to every VM in it); with no VM name known every event counts.

A host whose IMDS cannot be read is never ``clear``: an unreachable host, a timeout, IMDS's 410/429/5xx are
``wait`` (transient, by Azure's own guidance); a 4xx, an answer that is not JSON, too large, or not shaped like an
events document is ``escalate`` with one line that says why. Text from IMDS is untrusted: it never raises past
:func:`parse_document`'s :class:`MalformedDocument`, and what is shown of it is bounded and stripped of control
characters.

:func:`acknowledge` approves one event (``StartRequests``), which lets Azure start it before its ``NotBefore``; it
is only ever called when a caller asks for it, never by :func:`read_events` or :func:`decide`.

The endpoint is a parameter everywhere: :data:`DEFAULT_ENDPOINT` is the documented link-local URL; the lab and the
tests pass the stand-in's loopback URL (:mod:`lab.services.imds`).
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from remediation.azure.errors import AzureInputError
from remediation.core.findings import Finding, make_finding
from remediation.hostside import SCHEDULED_EVENTS_PATH, bundle_program
from remediation.hostside.scheduled_events import DEFAULT_API_VERSION, DEFAULT_ENDPOINT, SCHEMA, endpoint_problem
from remediation.transport.fanout import HostRun, Status, fan_out, run_one
from remediation.transport.inventory import Host

__all__ = [
    "DEFAULT_API_VERSION",
    "DEFAULT_ENDPOINT",
    "DEFAULT_HORIZON",
    "KNOWN_EVENT_TYPES",
    "AckResult",
    "EventsDocument",
    "HostDecision",
    "HostEvents",
    "MalformedDocument",
    "ScheduledEvent",
    "Verdict",
    "acknowledge",
    "bundle",
    "check_endpoint",
    "clean",
    "decide",
    "decide_all",
    "event_finding",
    "event_key",
    "events_from_run",
    "parse_document",
    "read_events",
    "remote_command",
    "summary",
    "vm_name_of",
]

DEFAULT_HORIZON = _dt.timedelta(minutes=30)
KNOWN_EVENT_TYPES = frozenset({"Reboot", "Redeploy", "Freeze", "Preempt", "Terminate"})
KNOWN_STATUSES = frozenset({"Scheduled", "Started"})
MAX_EVENTS = 100  # a document with more is not one IMDS sends
MAX_TEXT = 200  # the most of any one string from IMDS kept for display
_EVENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
TRANSIENT_HTTP = frozenset({410, 429, 500, 502, 503, 504})


class Verdict(StrEnum):
    CLEAR = "clear"
    WAIT = "wait"
    ESCALATE = "escalate"


class MalformedDocument(ValueError):
    """The answer is not a Scheduled Events document; the message is one line naming the first problem."""


def clean(text: object, limit: int = MAX_TEXT) -> str:
    """Untrusted text for one line of output: control and bidi characters replaced, at most ``limit`` characters."""
    flat = _CONTROL.sub("?", str(text))
    return flat if len(flat) <= limit else flat[:limit] + "..."


@dataclass(frozen=True)
class ScheduledEvent:
    event_id: str
    event_type: str  # one of KNOWN_EVENT_TYPES, or a type Azure added later (treated the same way)
    status: str  # Scheduled | Started (another value is kept and treated as started)
    resources: tuple[str, ...]
    not_before: _dt.datetime | None  # None: blank (a started event) or absent
    description: str = ""
    source: str = ""  # Platform | User ("" before api-version 2019-08-01)
    duration_s: int | None = None  # -1: unknown; None: not given (before 2020-07-01)
    resource_type: str = "VirtualMachine"

    @property
    def started(self) -> bool:
        return self.status != "Scheduled"

    def concerns(self, vm_name: str | None) -> bool:
        """Whether the event is for ``vm_name`` (Azure VM names are case-insensitive); every event when None."""
        return vm_name is None or vm_name.casefold() in {r.casefold() for r in self.resources}

    def describe(self) -> str:
        when = "started" if self.started else (
            f"not before {self.not_before.isoformat(timespec='seconds')}" if self.not_before else "no NotBefore"
        )
        source = f", {self.source}" if self.source else ""
        return f"{self.event_type} {self.event_id} ({self.status}, {when}{source})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "status": self.status,
            "resources": list(self.resources),
            "not_before": self.not_before.isoformat() if self.not_before else None,
            "description": self.description,
            "source": self.source,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True)
class EventsDocument:
    incarnation: int
    events: tuple[ScheduledEvent, ...]


def _field(event: Mapping[str, Any], where: str, name: str, required: bool = True) -> Any:
    if name not in event:
        if required:
            raise MalformedDocument(f"{where}: no {name}")
        return None
    return event[name]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedDocument(f"{where} is {type(value).__name__}, not a string")
    return value


def _not_before(value: Any, where: str) -> _dt.datetime | None:
    text = _text(value, where).strip()
    if not text:
        return None
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        moment = None
    if moment is None:
        raise MalformedDocument(f"{where} {clean(text, 60)!r} is not an RFC 1123 date")
    return moment.replace(tzinfo=_dt.UTC) if moment.tzinfo is None else moment.astimezone(_dt.UTC)


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise MalformedDocument(f"{where} is {type(value).__name__}, not an integer")
    if isinstance(value, str):
        if not re.fullmatch(r"-?[0-9]{1,18}", value.strip()):
            raise MalformedDocument(f"{where} {clean(value, 40)!r} is not an integer")
        return int(value)
    if not -(2**63) <= value < 2**63:
        raise MalformedDocument(f"{where} {value} is out of range")
    return value


def _event(raw: Any, i: int) -> ScheduledEvent:
    where = f"Events[{i}]"
    if not isinstance(raw, Mapping):
        raise MalformedDocument(f"{where} is {type(raw).__name__}, not an object")
    event_id = _text(_field(raw, where, "EventId"), f"{where}.EventId").strip()
    if not _EVENT_ID.match(event_id):
        raise MalformedDocument(f"{where}.EventId {clean(event_id, 60)!r} is not an event ID")
    event_type = _text(_field(raw, where, "EventType"), f"{where}.EventType").strip()
    if not event_type:
        raise MalformedDocument(f"{where}.EventType is empty")
    status = _text(_field(raw, where, "EventStatus"), f"{where}.EventStatus").strip()
    if not status:
        raise MalformedDocument(f"{where}.EventStatus is empty")
    resources_raw = _field(raw, where, "Resources")
    if not isinstance(resources_raw, list) or not all(isinstance(r, str) for r in resources_raw):
        raise MalformedDocument(f"{where}.Resources is not a list of VM names")
    not_before = _not_before(_field(raw, where, "NotBefore"), f"{where}.NotBefore")
    description = _field(raw, where, "Description", required=False)
    source = _field(raw, where, "EventSource", required=False)
    duration = _field(raw, where, "DurationInSeconds", required=False)
    resource_type = _field(raw, where, "ResourceType", required=False)
    return ScheduledEvent(
        event_id=event_id,
        event_type=clean(event_type, 40),
        status=clean(status, 40),
        resources=tuple(clean(r, 120) for r in resources_raw[:MAX_EVENTS]),
        not_before=not_before,
        description=clean(_text(description, f"{where}.Description")) if description is not None else "",
        source=clean(_text(source, f"{where}.EventSource"), 40) if source is not None else "",
        duration_s=_integer(duration, f"{where}.DurationInSeconds") if duration is not None else None,
        resource_type=clean(_text(resource_type, f"{where}.ResourceType"), 40) if resource_type is not None
        else "VirtualMachine",
    )


def parse_document(doc: Any) -> EventsDocument:
    """IMDS's answer (parsed JSON) -> :class:`EventsDocument`; :class:`MalformedDocument` with one line otherwise."""
    if not isinstance(doc, Mapping):
        raise MalformedDocument(f"the answer is {type(doc).__name__}, not an object")
    if "DocumentIncarnation" not in doc:
        raise MalformedDocument("no DocumentIncarnation")
    incarnation = _integer(doc["DocumentIncarnation"], "DocumentIncarnation")
    events = doc.get("Events")
    if not isinstance(events, list):
        raise MalformedDocument("Events is missing or not a list")
    if len(events) > MAX_EVENTS:
        raise MalformedDocument(f"{len(events)} events (more than {MAX_EVENTS})")
    parsed = tuple(_event(raw, i) for i, raw in enumerate(events))
    ids = [e.event_id for e in parsed]
    if len(ids) != len(set(ids)):
        raise MalformedDocument("an EventId appears twice")
    return EventsDocument(incarnation, parsed)


# --- reading on the hosts -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostEvents:
    """What one host's IMDS said: a document, or ``error`` (one line) with whether it is ``transient``."""

    host: str
    document: EventsDocument | None
    error: str | None = None
    transient: bool = False
    status: int | None = None  # IMDS's HTTP status, when it answered


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` when it is a URL the host program will call; :class:`AzureInputError` naming the problem."""
    problem = endpoint_problem(endpoint)
    if problem is not None:
        raise AzureInputError(f"Scheduled Events {problem}")
    return endpoint


def _check_api_version(api_version: str) -> str:
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(-preview)?", api_version):
        raise AzureInputError(f"Scheduled Events api-version {api_version!r} is not a date such as 2020-07-01")
    return api_version


def bundle() -> bytes:
    """The host program as one program for a remote ``python3 -`` (it needs no pynvml)."""
    return bundle_program(SCHEDULED_EVENTS_PATH.read_text(encoding="utf-8"), "scheduled_events", include_pynvml=False)


def remote_command(endpoint: str, api_version: str, timeout: float, event_id: str | None = None) -> str:
    """The host program's command line, every argument one shell word."""
    argv = ["python3", "-I", "-", "--endpoint", check_endpoint(endpoint), "--api-version",
            _check_api_version(api_version), "--timeout", f"{timeout:g}"]
    if event_id is not None:
        argv += ["--acknowledge", event_id]
    return shlex.join(argv)


def _program_output(run: HostRun) -> tuple[dict[str, Any] | None, str | None]:
    """The host program's JSON object, or why there is none (the SSH session's failure, or garbage)."""
    if run.status in (Status.UNREACHABLE, Status.TIMED_OUT):
        return None, f"{run.status.value}: {clean(run.error or 'no detail')}"
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        out = None
    if not isinstance(out, dict) or out.get("schema") != SCHEMA:
        detail = run.error or (run.stderr.strip().splitlines() or [f"exit {run.exit_code}"])[-1]
        return None, f"the Scheduled Events program gave no result ({clean(detail)})"
    return out, None


def events_from_run(run: HostRun) -> HostEvents:
    """One host's fan-out result -> :class:`HostEvents` (never raises)."""
    out, problem = _program_output(run)
    if out is None:
        return HostEvents(run.host, None, problem, transient=run.status in (Status.UNREACHABLE, Status.TIMED_OUT))
    status = out.get("status") if isinstance(out.get("status"), int) else None
    if not out.get("ok"):
        error_class = clean(out.get("error_class") or "error", 20)
        transient = error_class in ("timeout", "unreachable") or status in TRANSIENT_HTTP
        return HostEvents(run.host, None, f"IMDS {error_class}: {clean(out.get('error') or '?')}", transient, status)
    try:
        return HostEvents(run.host, parse_document(out.get("body")), status=status)
    except MalformedDocument as exc:
        return HostEvents(run.host, None, f"IMDS answered a malformed document: {exc}", False, status)


def read_events(
    hosts: Iterable[Host],
    *,
    endpoint: str = DEFAULT_ENDPOINT,
    api_version: str = DEFAULT_API_VERSION,
    request_timeout: float = 5.0,
    concurrency: int = 32,
    connect_timeout: float = 10.0,
) -> dict[str, HostEvents]:
    """Every host's Scheduled Events (one SSH round trip each, at most ``concurrency`` at once), by host name."""
    if not 0 < request_timeout <= 60:
        raise AzureInputError(f"IMDS request timeout {request_timeout:g} s must be between 0 and 60 seconds")
    command = remote_command(endpoint, api_version, request_timeout)
    result = fan_out(hosts, command, stdin=bundle(), concurrency=concurrency, connect_timeout=connect_timeout,
                     timeout=request_timeout + 30, max_stdout=1024 * 1024)
    return {name: events_from_run(run) for name, run in result.runs.items()}


# --- deciding -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostDecision:
    host: str
    verdict: Verdict
    reason: str
    events: tuple[ScheduledEvent, ...] = ()  # those that concern the VM
    incarnation: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "events": [e.to_dict() for e in self.events],
            "incarnation": self.incarnation,
        }


def vm_name_of(host: Host) -> str | None:
    """The host's Azure VM name: ``azure_vm_name``, else the last segment of ``azure_vm_resource_id``; else None."""
    name = host.vars.get("azure_vm_name")
    if isinstance(name, str) and name.strip():
        return name.strip()
    rid = host.vars.get("azure_vm_resource_id")
    if isinstance(rid, str) and "/virtualmachines/" in rid.lower():
        return rid.rstrip("/").rsplit("/", 1)[-1] or None
    return None


def decide(
    events: HostEvents,
    *,
    now: _dt.datetime,
    horizon: _dt.timedelta = DEFAULT_HORIZON,
    vm_name: str | None = None,
) -> HostDecision:
    """``clear``, ``wait`` or ``escalate`` for one host (see the module's docstring); ``now`` must be aware."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if horizon < _dt.timedelta(0):
        raise AzureInputError(f"Scheduled Events horizon {horizon} must not be negative")
    if events.document is None:
        verdict = Verdict.WAIT if events.transient else Verdict.ESCALATE
        why = "try again later" if events.transient else "a person must look at it"
        return HostDecision(events.host, verdict, f"cannot read Scheduled Events ({events.error}); {why}")
    doc = events.document
    mine = tuple(e for e in doc.events if e.concerns(vm_name))
    if not mine:
        others = len(doc.events)
        tail = f" ({others} for other VMs of its availability set or placement group)" if others else ""
        return HostDecision(events.host, Verdict.CLEAR, f"no Scheduled Event for this VM{tail}", (), doc.incarnation)
    deadline = now + horizon
    urgent = [e for e in mine if e.started or e.not_before is None or e.not_before <= deadline]
    if urgent:
        first = urgent[0]
        if first.started:
            why = "has started: the platform is acting on this VM now"
        elif first.not_before is None:
            why = "is pending with no NotBefore"
        else:
            why = f"is due within the {_span(horizon)} horizon"
        reason = f"Scheduled Event {first.describe()} {why}; never act on top of it"
        return HostDecision(events.host, Verdict.ESCALATE, reason, mine, doc.incarnation)
    soonest = min(mine, key=lambda e: e.not_before or deadline)
    reason = (f"Scheduled Event {soonest.describe()} is pending beyond the {_span(horizon)} horizon; "
              "do not act on top of it, look again later")
    return HostDecision(events.host, Verdict.WAIT, reason, mine, doc.incarnation)


def _span(delta: _dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def decide_all(
    read: Mapping[str, HostEvents],
    *,
    now: _dt.datetime,
    horizon: _dt.timedelta = DEFAULT_HORIZON,
    vm_names: Mapping[str, str | None] | None = None,
) -> dict[str, HostDecision]:
    """:func:`decide` for every host read."""
    names = vm_names or {}
    return {h: decide(e, now=now, horizon=horizon, vm_name=names.get(h)) for h, e in read.items()}


def event_key(decision: HostDecision) -> str:
    """What tells one escalation of ``decision`` from another on the same host and boot: its events' IDs (sorted,
    joined by ``+``), or ``unreadable`` when the events could not be read. A new event is a new page; the same event
    seen by the next run is not."""
    ids = sorted({e.event_id for e in decision.events})
    return "+".join(ids) if ids else "unreadable"


def event_finding(decision: HostDecision, pending: Sequence[str] = ()) -> Finding:
    """AZ-SE-001: the Scheduled Events of a host the closed loop was to fix say ``escalate``; the loop leaves the host
    to the platform and a person hears of it. ``pending``: the finding IDs the loop would have acted on."""
    if decision.verdict is not Verdict.ESCALATE:
        raise ValueError(f"{decision.host}: Scheduled Events say {decision.verdict.value}, not escalate")
    evidence = [decision.reason, *(f"event {e.describe()}: {', '.join(e.resources) or 'no resource named'}"
                                   + (f" ({clean(e.description, 120)})" if e.description else "")
                                   for e in decision.events)]
    if pending:
        evidence.append(f"the loop was to fix: {', '.join(pending)}; nothing was done on the host")
    what = decision.events[0].event_type if decision.events else "unreadable Scheduled Events"
    return make_finding("AZ-SE-001", f"{what} on {decision.host} while it has a fault the loop would fix: left to "
                        "the platform, not acted on", evidence, host=decision.host)


# --- acknowledging --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AckResult:
    host: str
    event_id: str
    ok: bool
    status: int | None
    error: str | None = None


def acknowledge(
    host: Host,
    event_id: str,
    *,
    endpoint: str = DEFAULT_ENDPOINT,
    api_version: str = DEFAULT_API_VERSION,
    request_timeout: float = 5.0,
    connect_timeout: float = 10.0,
) -> AckResult:
    """Approve ``event_id`` on ``host``'s IMDS (``POST {"StartRequests": [{"EventId": ...}]}``).

    Azure may then start the event before its NotBefore, for every VM it names: call this only when told to."""
    if not _EVENT_ID.match(event_id):
        raise AzureInputError(f"{clean(event_id, 60)!r} is not a Scheduled Event ID")
    command = remote_command(endpoint, api_version, request_timeout, event_id)
    run = run_one(host, command, bundle(), connect_timeout, timeout=request_timeout + 30, max_stdout=64 * 1024)
    out, problem = _program_output(run)
    if out is None:
        return AckResult(host.name, event_id, False, None, problem)
    status = out.get("status") if isinstance(out.get("status"), int) else None
    if out.get("ok") and status == 200:
        return AckResult(host.name, event_id, True, status)
    error = f"IMDS {clean(out.get('error_class') or 'error', 20)}: {clean(out.get('error') or '?')}"
    return AckResult(host.name, event_id, False, status, error)


def summary(decisions: Sequence[HostDecision]) -> dict[str, list[str]]:
    """Hosts by verdict, for a one-line report."""
    out: dict[str, list[str]] = {v.value: [] for v in Verdict}
    for d in decisions:
        out[d.verdict.value].append(d.host)
    return out
