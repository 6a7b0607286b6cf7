"""Azure Scheduled Events as this VM sees them, read from its Instance Metadata Service. Runs ON the host.

Sent over SSH on stdin by :mod:`remediation.azure.scheduled_events` (``python3 -I - --endpoint URL ...``, bundled by
:func:`remediation.hostside.bundle_program`); standard library only, Python 3.8 syntax, like the probe.

It does what Azure's documentation asks of a Scheduled Events client and nothing more:

- ``GET <endpoint>?api-version=<v>`` with the header ``Metadata: true`` (without it IMDS answers 400);
- never through a proxy, whatever the environment says (``ProxyHandler({})``: IMDS "is not intended to be used
  behind a proxy"), and never following a redirect (IMDS does not redirect; a redirect is something else answering);
- a short timeout, and at most ``--max-bytes`` of answer read: what IMDS says is data, never the host's memory;
- with ``--acknowledge EVENT_ID``: ``POST`` of ``{"StartRequests": [{"EventId": EVENT_ID}]}`` instead, which approves
  that event (Azure may then start it before its ``NotBefore``). Only ever sent when the controller is asked to.

The endpoint is an argument: the real one is ``http://169.254.169.254/metadata/scheduledevents``; the lab's stand-in
listens on a loopback address. Only ``http`` URLs without credentials, query or fragment are accepted.

Prints one JSON object (schema ``gpufleet.scheduled-events/1``) and exits 0 whatever IMDS answered: ``ok``, the HTTP
``status``, the parsed ``body`` (the events document, or IMDS's error object), and for a failure an ``error_class``
(``timeout``, ``unreachable``, ``http``, ``too_large``, ``not_json``, ``usage``) with a one-line ``error``. The
controller validates the document; this program only carries it.
"""

import argparse
import http.client
import json
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple  # noqa: F401 - used in type comments (3.8)

SCHEMA = "gpufleet.scheduled-events/1"
DEFAULT_ENDPOINT = "http://169.254.169.254/metadata/scheduledevents"
DEFAULT_API_VERSION = "2020-07-01"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 256 * 1024
MAX_TEXT = 512  # the most of a non-JSON answer or an exception text kept in ``error``


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is answered as the error it is (urllib raises HTTPError when no redirect request is made)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        # type: (urllib.request.Request, Any, int, str, Any, str) -> Optional[urllib.request.Request]
        return None


def _opener():
    # type: () -> urllib.request.OpenerDirector
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def _short(text):
    # type: (str) -> str
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MAX_TEXT else flat[:MAX_TEXT] + "..."


def endpoint_problem(endpoint):
    # type: (str) -> Optional[str]
    """Why ``endpoint`` is not a Scheduled Events URL this program will call, or None."""
    try:
        parts = urllib.parse.urlsplit(endpoint)
        _ = parts.port  # raises ValueError for a port out of range
    except ValueError as exc:
        return "endpoint %r is not a URL (%s)" % (endpoint, exc)
    if parts.scheme != "http":
        return "endpoint %r: IMDS is plain http, not %r" % (endpoint, parts.scheme or "no scheme")
    if not parts.hostname:
        return "endpoint %r has no host" % endpoint
    if parts.username is not None or parts.password is not None:
        return "endpoint %r carries credentials; IMDS takes none" % endpoint
    if parts.query or parts.fragment:
        return "endpoint %r has a query or fragment; the api-version is added by this program" % endpoint
    return None


def _read_bounded(response, max_bytes):
    # type: (Any, int) -> Tuple[bytes, bool]
    data = response.read(max_bytes + 1)
    return data[:max_bytes], len(data) > max_bytes


def _parse(data):
    # type: (bytes) -> Tuple[Any, Optional[str]]
    try:
        return json.loads(data.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError) as exc:
        return None, _short("answer is not JSON (%s): %r" % (exc, data[:80]))


def call(endpoint, api_version, timeout, max_bytes, event_id=None):
    # type: (str, str, float, int, Optional[str]) -> Dict[str, Any]
    """One request to IMDS; the result document (never raises for what the network or IMDS does)."""
    out = {
        "schema": SCHEMA,
        "op": "acknowledge" if event_id is not None else "get",
        "endpoint": endpoint,
        "api_version": api_version,
        "ok": False,
        "status": None,
        "body": None,
        "error_class": None,
        "error": None,
    }  # type: Dict[str, Any]
    url = endpoint + "?" + urllib.parse.urlencode({"api-version": api_version})
    data = None  # type: Optional[bytes]
    headers = {"Metadata": "true"}
    if event_id is not None:
        data = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode("utf-8")
        headers["Content-Type"] = "application/json"
    method = "POST" if data is not None else "GET"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 - http only
    t0 = time.monotonic()
    try:
        try:
            response = _opener().open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:  # IMDS's 400/404/405/410/429/500, or a refused redirect
            response = exc
        with response:
            status = int(response.getcode() or 0)
            body, truncated = _read_bounded(response, max_bytes)
        out["status"] = status
        if truncated:
            out["error_class"] = "too_large"
            out["error"] = "answer over %d bytes (HTTP %d)" % (max_bytes, status)
        else:
            parsed, problem = _parse(body) if body else (None, None)
            out["body"] = parsed
            if status != 200:
                out["error_class"] = "http"
                detail = parsed.get("error") if isinstance(parsed, dict) else None
                out["error"] = _short("HTTP %d%s" % (status, ": %s" % detail if detail else ""))
            elif problem is not None and event_id is None:
                out["error_class"] = "not_json"
                out["error"] = problem
            else:
                out["ok"] = True
    except (socket.timeout, TimeoutError) as exc:
        out["error_class"] = "timeout"
        out["error"] = _short("no answer within %g s (%s)" % (timeout, exc))
    except urllib.error.URLError as exc:
        reason = exc.reason
        timed_out = isinstance(reason, (socket.timeout, TimeoutError))
        out["error_class"] = "timeout" if timed_out else "unreachable"
        out["error"] = _short("%s: %s" % (endpoint, reason))
    except (OSError, ValueError, http.client.HTTPException) as exc:  # a reset connection, a bad status line
        out["error_class"] = "unreachable"
        out["error"] = _short("%s: %s" % (endpoint, exc))
    out["elapsed_ms"] = int((time.monotonic() - t0) * 1000)
    return out


def _args(argv):
    # type: (List[str]) -> argparse.Namespace
    parser = argparse.ArgumentParser(prog="scheduled_events", add_help=False)
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    parser.add_argument("--api-version", default=DEFAULT_API_VERSION)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument("--acknowledge", default=None)
    return parser.parse_args(argv)


def main(argv):
    # type: (List[str]) -> int
    try:
        args = _args(argv)
    except SystemExit:
        print(json.dumps({"schema": SCHEMA, "ok": False, "error_class": "usage", "error": "bad arguments"}))
        return 2
    problem = endpoint_problem(args.endpoint)
    if problem is None and not 0 < args.timeout <= 60:
        problem = "--timeout %g must be between 0 and 60 seconds" % args.timeout
    if problem is None and not 1024 <= args.max_bytes <= 16 * 1024 * 1024:
        problem = "--max-bytes %d must be between 1 KiB and 16 MiB" % args.max_bytes
    if problem is not None:
        print(json.dumps({"schema": SCHEMA, "ok": False, "error_class": "usage", "error": problem}))
        return 2
    print(json.dumps(call(args.endpoint, args.api_version, args.timeout, args.max_bytes, args.acknowledge)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
