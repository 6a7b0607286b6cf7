"""Azure Scheduled Events: the IMDS stand-in answers as Azure documents; the host program reads it (no proxy, the
Metadata header, bounded); the controller validates the document and decides clear / wait / escalate per host.

Everything here talks to the stand-in on 127.0.0.1; nothing ever addresses 169.254.169.254."""

from __future__ import annotations

import datetime as _dt
import json
import random
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from lab.services.imds import API_VERSIONS, BAD_VERSION, MISSING_HEADER, FakeImds, rfc1123
from remediation.azure import scheduled_events as se
from remediation.azure.errors import AzureInputError
from remediation.hostside import scheduled_events as program
from remediation.transport.fanout import HostRun, Status
from remediation.transport.inventory import Host

NOW = _dt.datetime(2026, 3, 2, 3, 0, tzinfo=_dt.UTC)
VM = "gpu-vm-2"


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds(clock=lambda: NOW) as service:
        yield service


def _get(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, Any]:
    method = "POST" if data else "GET"
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)  # noqa: S310 - loopback
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _url(imds: FakeImds, version: str | None = "2020-07-01") -> str:
    return imds.endpoint + (f"?api-version={version}" if version else "")


# --- the stand-in -------------------------------------------------------------------------------------------------


def test_the_stand_in_serves_loopback_only() -> None:
    for address in ("169.254.169.254", "10.0.0.4", "0.0.0.0"):  # noqa: S104 - the refusal is the point
        with pytest.raises(ValueError, match="loopback"):
            FakeImds(host=address)


def test_without_the_metadata_header_it_is_400(imds: FakeImds) -> None:
    assert _get(_url(imds)) == (400, {"error": MISSING_HEADER})
    assert _get(_url(imds), {"Metadata": "false"}) == (400, {"error": MISSING_HEADER})
    assert _get(_url(imds), {"Metadata": "true", "X-Forwarded-For": "10.0.0.1"})[0] == 400
    assert _get(_url(imds), {"Metadata": "true"})[0] == 200


def test_api_version_missing_or_unsupported_gives_imds_error_body(imds: FakeImds) -> None:
    for url in (_url(imds, None), _url(imds, "2099-01-01"), _url(imds, "latest")):
        status, body = _get(url, {"Metadata": "true"})
        assert status == 400
        assert body == {"error": BAD_VERSION, "newest-versions": list(API_VERSIONS[:3])}
    assert _get(_url(imds) + "&api-version=2019-08-01", {"Metadata": "true"})[0] == 400  # duplicate parameter
    assert _get(imds.url + "/metadata/instance?api-version=2020-07-01", {"Metadata": "true"})[0] == 404


def test_document_shape_and_incarnation(imds: FakeImds) -> None:
    status, empty = _get(_url(imds), {"Metadata": "true"})
    assert (status, empty) == (200, {"DocumentIncarnation": 1, "Events": []})
    eid = imds.schedule("Freeze", [VM, "gpu-vm-3"], in_seconds=900, description="Live migration", duration_s=5)
    _, doc = _get(_url(imds), {"Metadata": "true"})
    assert doc["DocumentIncarnation"] == 2
    assert doc["Events"] == [{
        "EventId": eid, "EventStatus": "Scheduled", "EventType": "Freeze", "ResourceType": "VirtualMachine",
        "Resources": [VM, "gpu-vm-3"], "NotBefore": rfc1123(NOW + _dt.timedelta(seconds=900)),
        "Description": "Live migration", "EventSource": "Platform", "DurationInSeconds": 5,
    }]
    assert doc["Events"][0]["NotBefore"] == "Mon, 02 Mar 2026 03:15:00 GMT"
    # reading does not change the incarnation; an older api-version lacks the newer fields
    _, again = _get(_url(imds, "2019-01-01"), {"Metadata": "true"})
    assert again["DocumentIncarnation"] == 2
    assert "DurationInSeconds" not in again["Events"][0] and "EventSource" not in again["Events"][0]


def test_approval_starts_the_event_and_bumps_the_incarnation(imds: FakeImds) -> None:
    eid = imds.schedule("Reboot", [VM], in_seconds=900, source="User")
    body = json.dumps({"StartRequests": [{"EventId": eid}]}).encode()
    assert _get(_url(imds), {"Metadata": "true"}, body)[0] == 200
    _, doc = _get(_url(imds), {"Metadata": "true"})
    assert doc["DocumentIncarnation"] == 3
    assert doc["Events"][0]["EventStatus"] == "Started" and doc["Events"][0]["NotBefore"] == ""
    assert _get(_url(imds), {"Metadata": "true"}, body)[0] == 200  # approving again: still 200, no change
    assert imds.document()["DocumentIncarnation"] == 3
    assert imds.approvals() == [eid, eid]
    imds.complete_event(eid)  # terminal: the event leaves the document
    assert imds.document() == {"DocumentIncarnation": 4, "Events": []}


def test_malformed_or_unknown_approvals_are_400(imds: FakeImds) -> None:
    imds.schedule("Reboot", [VM], in_seconds=900)
    for bad in (b"{", b"[]", b'{"StartRequests": []}', b'{"StartRequests": "x"}', b'{"StartRequests": [{}]}',
                json.dumps({"StartRequests": [{"EventId": "NOT-AN-EVENT"}]}).encode()):
        assert _get(_url(imds), {"Metadata": "true"}, bad)[0] == 400, bad
    assert _get(_url(imds), {}, b'{"StartRequests": [{"EventId": "x"}]}') == (400, {"error": MISSING_HEADER})
    assert imds.document()["DocumentIncarnation"] == 2


def test_a_scheduled_event_starts_by_itself_at_not_before() -> None:
    clock = [NOW]
    with FakeImds(clock=lambda: clock[0]) as imds:
        imds.schedule("Redeploy", [VM], in_seconds=600)
        assert imds.document()["Events"][0]["EventStatus"] == "Scheduled"
        clock[0] = NOW + _dt.timedelta(seconds=601)
        doc = imds.document()
        assert doc["Events"][0]["EventStatus"] == "Started" and doc["DocumentIncarnation"] == 3


# --- the host program against the stand-in ----------------------------------------------------------------------


def _program(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-I", "-", *args], input=se.bundle(), capture_output=True, timeout=60,
                          check=False, env={"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                                            "no_proxy": "", "PATH": "/usr/bin:/bin"})
    assert proc.returncode in (0, 2), proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_the_host_program_reads_acknowledges_and_ignores_proxies(imds: FakeImds) -> None:
    eid = imds.schedule("Reboot", [VM], in_seconds=3600)
    got = _program("--endpoint", imds.endpoint, "--timeout", "5")  # a proxy in the environment is not used
    assert got["ok"] and got["status"] == 200 and got["body"]["Events"][0]["EventId"] == eid
    assert imds.requests[-1].metadata_header and imds.requests[-1].method == "GET"
    ack = _program("--endpoint", imds.endpoint, "--acknowledge", eid)
    assert ack["ok"] and ack["op"] == "acknowledge" and imds.approvals() == [eid]
    bad = _program("--endpoint", imds.endpoint, "--api-version", "2099-01-01")
    assert not bad["ok"] and bad["status"] == 400 and bad["error_class"] == "http"
    assert bad["body"]["newest-versions"] == list(API_VERSIONS[:3])


def test_the_host_program_refuses_what_is_not_an_imds_url() -> None:
    for endpoint in ("https://127.0.0.1/x", "http://user:pw@127.0.0.1/x", "http://127.0.0.1/x?a=1", "ftp://x/",
                     "http:///nohost", "http://127.0.0.1:99999/x"):
        got = _program("--endpoint", endpoint)
        assert got["error_class"] == "usage" and not got["ok"], endpoint


def test_the_host_program_bounds_the_answer_and_reports_a_dead_endpoint(imds: FakeImds) -> None:
    for _ in range(40):
        imds.schedule("Freeze", [f"vm-{'x' * 60}-{_}"], in_seconds=900, description="d" * 100)
    big = _program("--endpoint", imds.endpoint, "--max-bytes", "2048")
    assert big["error_class"] == "too_large" and big["body"] is None
    dead = _program("--endpoint", "http://127.0.0.1:1/metadata/scheduledevents", "--timeout", "2")
    assert dead["error_class"] == "unreachable"


def test_redirects_are_not_followed() -> None:
    import http.server
    import threading

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        got = program.call(f"http://127.0.0.1:{server.server_address[1]}/metadata/scheduledevents", "2020-07-01",
                           5, 4096)
        assert got["status"] == 302 and got["error_class"] == "http" and not got["ok"]
    finally:
        server.shutdown()
        server.server_close()


# --- parsing untrusted documents ---------------------------------------------------------------------------------


def _event(**over: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "EventId": "602D9444-D2CD-49C7-8624-8643E7171297", "EventType": "Reboot", "ResourceType": "VirtualMachine",
        "Resources": [VM], "EventStatus": "Scheduled", "NotBefore": "Mon, 02 Mar 2026 04:00:00 GMT",
        "Description": "Host server is undergoing maintenance.", "EventSource": "Platform", "DurationInSeconds": -1,
    }
    event.update(over)
    return {k: v for k, v in event.items() if v is not ...}


def test_a_documented_document_parses() -> None:
    doc = se.parse_document({"DocumentIncarnation": 2, "Events": [_event(), _event(
        EventId="C7061BAC-AFDC-4513-B24B-AA5F13A16123", EventType="Freeze", EventStatus="Started", NotBefore="",
        DurationInSeconds=5)]})
    first, second = doc.events
    assert doc.incarnation == 2
    assert first.not_before == _dt.datetime(2026, 3, 2, 4, tzinfo=_dt.UTC) and not first.started
    assert second.started and second.not_before is None and second.duration_s == 5
    old = se.parse_document({"DocumentIncarnation": "7", "Events": [_event(Description=..., EventSource=...,
                                                                             DurationInSeconds=...)]})
    assert old.incarnation == 7 and old.events[0].source == "" and old.events[0].duration_s is None


@pytest.mark.parametrize(("doc", "reason"), [
    (None, "not an object"),
    ([], "not an object"),
    ({"Events": []}, "no DocumentIncarnation"),
    ({"DocumentIncarnation": True, "Events": []}, "not an integer"),
    ({"DocumentIncarnation": "1e9", "Events": []}, "not an integer"),
    ({"DocumentIncarnation": 10**30, "Events": []}, "out of range"),
    ({"DocumentIncarnation": 1}, "Events is missing"),
    ({"DocumentIncarnation": 1, "Events": {}}, "not a list"),
    ({"DocumentIncarnation": 1, "Events": ["x"]}, "Events[0] is str"),
    ({"DocumentIncarnation": 1, "Events": [_event(EventId=...)]}, "no EventId"),
    ({"DocumentIncarnation": 1, "Events": [_event(EventId="../../etc")]}, "not an event ID"),
    ({"DocumentIncarnation": 1, "Events": [_event(EventId=7)]}, "not a string"),
    ({"DocumentIncarnation": 1, "Events": [_event(EventType="")]}, "EventType is empty"),
    ({"DocumentIncarnation": 1, "Events": [_event(Resources="gpu-vm-2")]}, "not a list of VM names"),
    ({"DocumentIncarnation": 1, "Events": [_event(Resources=[1])]}, "not a list of VM names"),
    ({"DocumentIncarnation": 1, "Events": [_event(NotBefore="tomorrow")]}, "not an RFC 1123 date"),
    ({"DocumentIncarnation": 1, "Events": [_event(NotBefore=None)]}, "not a string"),
    ({"DocumentIncarnation": 1, "Events": [_event(DurationInSeconds="long")]}, "not an integer"),
    ({"DocumentIncarnation": 1, "Events": [_event(), _event()]}, "appears twice"),
    ({"DocumentIncarnation": 1, "Events": [_event(EventId=f"E{i}") for i in range(101)]}, "more than 100"),
])
def test_malformed_documents_give_one_reason(doc: Any, reason: str) -> None:
    with pytest.raises(se.MalformedDocument) as caught:
        se.parse_document(doc)
    message = str(caught.value)
    assert reason in message and "\n" not in message


def test_untrusted_text_is_cleaned() -> None:
    doc = se.parse_document({"DocumentIncarnation": 1, "Events": [_event(
        EventType="Reboot\x1b[2J\u202e", Description="x" * 10_000 + "\n", Resources=["gpu-vm-2\r\n"])]})
    event = doc.events[0]
    assert "\x1b" not in event.event_type and "\u202e" not in event.event_type
    assert len(event.description) <= se.MAX_TEXT + 3 and "\n" not in event.description
    with pytest.raises(se.MalformedDocument) as caught:
        se.parse_document({"DocumentIncarnation": 1, "Events": [_event(NotBefore="\x1b]0;pwned\x07" * 20)]})
    assert "\x1b" not in str(caught.value) and len(str(caught.value)) < 200


def _mutate(value: Any, rng: random.Random) -> Any:
    junk = [None, True, 0, -1, 2**70, "", "\x00", "Mon, 99 Foo 2026", [], {}, [None], {"a": 1}, "x" * 5000, 1.5]
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        copy = dict(value)
        if rng.random() < 0.2:
            del copy[key]
        else:
            copy[key] = _mutate(copy[key], rng)
        return copy
    if isinstance(value, list) and value and rng.random() < 0.7:
        copy = list(value)
        i = rng.randrange(len(copy))
        copy[i] = _mutate(copy[i], rng)
        return copy
    return rng.choice(junk)


def test_fuzzed_documents_never_crash() -> None:
    rng = random.Random(26)  # noqa: S311 - a reproducible fuzz, not security
    base = {"DocumentIncarnation": 3, "Events": [_event(), _event(EventId="B2", EventStatus="Started",
                                                                   NotBefore="")]}
    for _ in range(3000):
        doc = _mutate(base, rng)
        try:
            parsed = se.parse_document(doc)
        except se.MalformedDocument as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        decision = se.decide(se.HostEvents("h", parsed), now=NOW, vm_name=VM)
        assert decision.verdict in se.Verdict


# --- reading a host's output ----------------------------------------------------------------------------------------


def _run(out: Any, status: Status = Status.OK, stdout: str | None = None) -> HostRun:
    text = stdout if stdout is not None else json.dumps(out)
    return HostRun("gpu-2", status, 0 if status is Status.OK else None, text, "", 0.1, None)


def _ok(body: Any, status: int = 200) -> dict[str, Any]:
    return {"schema": program.SCHEMA, "ok": status == 200, "status": status, "body": body,
            "error_class": None if status == 200 else "http", "error": None if status == 200 else f"HTTP {status}"}


def test_events_from_run_reads_the_program_document() -> None:
    read = se.events_from_run(_run(_ok({"DocumentIncarnation": 4, "Events": [_event()]})))
    assert read.document is not None and read.document.incarnation == 4 and read.error is None


@pytest.mark.parametrize(("run", "transient", "words"), [
    (_run(None, Status.UNREACHABLE, ""), True, "unreachable"),
    (_run(None, Status.TIMED_OUT, ""), True, "timed_out"),
    (_run(None, stdout="Traceback ...\n"), False, "no result"),
    (_run(None, stdout=""), False, "no result"),
    (_run({"schema": "other/1"}), False, "no result"),
    (_run(_ok({"error": "Bad request"}, 400)), False, "IMDS http"),
    (_run(_ok(None, 503)), True, "IMDS http"),
    (_run(_ok(None, 429)), True, "IMDS http"),
    (_run({**_ok(None), "ok": False, "error_class": "timeout", "error": "no answer"}), True, "IMDS timeout"),
    (_run(_ok({"DocumentIncarnation": 1, "Events": "none"})), False, "malformed document"),
])
def test_what_cannot_be_read_is_one_line_and_never_clear(run: HostRun, transient: bool, words: str) -> None:
    read = se.events_from_run(run)
    assert read.document is None and read.transient is transient
    assert words in (read.error or "") and "\n" not in (read.error or "")
    decision = se.decide(read, now=NOW)
    assert decision.verdict is (se.Verdict.WAIT if transient else se.Verdict.ESCALATE)
    assert "cannot read Scheduled Events" in decision.reason


# --- deciding -------------------------------------------------------------------------------------------------------


def _decide(events: list[dict[str, Any]], horizon_min: int = 30, vm: str | None = VM) -> se.HostDecision:
    doc = se.parse_document({"DocumentIncarnation": 5, "Events": events})
    return se.decide(se.HostEvents("gpu-2", doc), now=NOW, horizon=_dt.timedelta(minutes=horizon_min), vm_name=vm)


def test_no_event_for_this_vm_is_clear() -> None:
    assert _decide([]).verdict is se.Verdict.CLEAR
    other = _decide([_event(Resources=["gpu-vm-9"])])
    assert other.verdict is se.Verdict.CLEAR and "1 for other VMs" in other.reason and other.events == ()


@pytest.mark.parametrize("event_type", ["Reboot", "Redeploy", "Freeze", "Preempt", "Terminate", "SomethingNew"])
def test_a_pending_event_beyond_the_horizon_is_wait(event_type: str) -> None:
    decision = _decide([_event(EventType=event_type, NotBefore=rfc1123(NOW + _dt.timedelta(hours=2)))])
    assert decision.verdict is se.Verdict.WAIT and event_type in decision.reason and "horizon" in decision.reason
    assert decision.incarnation == 5 and len(decision.events) == 1


@pytest.mark.parametrize("event_type", ["Reboot", "Redeploy", "Freeze", "Preempt", "Terminate"])
def test_an_event_due_within_the_horizon_or_started_is_escalate(event_type: str) -> None:
    soon = _decide([_event(EventType=event_type, NotBefore=rfc1123(NOW + _dt.timedelta(minutes=10)))])
    assert soon.verdict is se.Verdict.ESCALATE and "due within the 30 min horizon" in soon.reason
    started = _decide([_event(EventType=event_type, EventStatus="Started", NotBefore="")])
    assert started.verdict is se.Verdict.ESCALATE and "has started" in started.reason
    past = _decide([_event(EventType=event_type, NotBefore=rfc1123(NOW - _dt.timedelta(minutes=1)))])
    assert past.verdict is se.Verdict.ESCALATE


def test_the_horizon_is_a_setting_and_resources_are_matched_case_insensitively() -> None:
    event = _event(Resources=["GPU-VM-2"], NotBefore=rfc1123(NOW + _dt.timedelta(hours=2)))
    assert _decide([event], horizon_min=30).verdict is se.Verdict.WAIT
    assert _decide([event], horizon_min=180).verdict is se.Verdict.ESCALATE
    assert _decide([event], vm=None).verdict is se.Verdict.WAIT  # no VM name: every event counts
    unknown_status = _event(EventStatus="Cancelling", NotBefore=rfc1123(NOW + _dt.timedelta(hours=2)))
    assert _decide([unknown_status]).verdict is se.Verdict.ESCALATE  # an unknown status is treated as started
    with pytest.raises(ValueError, match="aware"):
        se.decide(se.HostEvents("h", None, "x"), now=NOW.replace(tzinfo=None))


def test_the_soonest_event_decides() -> None:
    far = _event(EventId="A1", NotBefore=rfc1123(NOW + _dt.timedelta(days=5)))
    near = _event(EventId="B2", EventType="Freeze", NotBefore=rfc1123(NOW + _dt.timedelta(minutes=5)))
    decision = _decide([far, near])
    assert decision.verdict is se.Verdict.ESCALATE and "Freeze B2" in decision.reason


# --- settings -------------------------------------------------------------------------------------------------------


def test_the_endpoint_and_version_are_checked_before_anything_is_sent() -> None:
    assert se.DEFAULT_ENDPOINT == "http://169.254.169.254/metadata/scheduledevents"  # the library's default only
    for bad in ("https://127.0.0.1/m", "http://a:b@127.0.0.1/m", "http://127.0.0.1/m?x=1", "127.0.0.1"):
        with pytest.raises(AzureInputError):
            se.check_endpoint(bad)
    with pytest.raises(AzureInputError, match="api-version"):
        se.remote_command("http://127.0.0.1:8/m", "latest; rm -rf /", 5)
    command = se.remote_command("http://127.0.0.1:8/m", "2020-07-01", 5, "602D9444-D2CD-49C7-8624-8643E7171297")
    assert command.startswith("python3 -I - --endpoint http://127.0.0.1:8/m --api-version 2020-07-01")
    with pytest.raises(AzureInputError, match="not a Scheduled Event ID"):
        se.acknowledge(Host("gpu-2", "127.0.0.1"), "x; reboot", endpoint="http://127.0.0.1:8/m")


def test_vm_name_of_host() -> None:
    rid = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/gpu-vm-7"
    assert se.vm_name_of(Host("a", "x", vars={"azure_vm_resource_id": rid})) == "gpu-vm-7"
    assert se.vm_name_of(Host("a", "x", vars={"azure_vm_name": "n1", "azure_vm_resource_id": rid})) == "n1"
    assert se.vm_name_of(Host("a", "x")) is None


def test_the_bundle_needs_no_pynvml() -> None:
    assert b"_PYNVML = ''" in se.bundle()
