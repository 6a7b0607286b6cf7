"""A Kubernetes API server stand-in on loopback: pods, nodes and events, read-only, for the live diagnosis.

It answers the requests the official ``kubernetes`` Python client sends for ``invoke k8s.diagnose-pending --pod``:

- ``GET /api/v1/namespaces/{ns}/pods/{name}`` (404 ``Status`` when missing)
- ``GET /api/v1/nodes``, ``GET /api/v1/pods`` and ``GET /api/v1/namespaces/{ns}/pods`` with ``fieldSelector``
  (``=``, ``==``, ``!=`` on ``spec.nodeName``, ``status.phase``, ``metadata.name``, ``metadata.namespace``)
- ``GET /api/v1/namespaces/{ns}/events`` with ``fieldSelector`` on ``involvedObject.name`` / ``.kind``
- ``GET /version``

as the real API server does: ``v1`` List objects with ``apiVersion``/``kind``/``metadata.resourceVersion``,
``application/json``, ``Status`` objects for errors (401 without the bearer token, 404, 405 for anything but GET,
400 for a field selector it cannot read). Only loopback addresses are served; each connection handles one request.

:func:`kubeconfig` writes a kubeconfig that points the client at it (``http://127.0.0.1:PORT``, a bearer token).
:mod:`lab.services.k8s_scenarios` builds the clusters the tests and the demo load into it.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from lab.services import LoopbackService, require_loopback

__all__ = ["FakeKubeApi", "kubeconfig"]

_POD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
_PODS_NS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
_EVENTS_NS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def _selector(text: str) -> list[tuple[str, str, str]]:
    out = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = re.fullmatch(r"([A-Za-z.]+)\s*(!=|==|=)\s*(.*)", term)
        if match is None:
            raise ValueError(term)
        out.append((match.group(1), match.group(2), match.group(3)))
    return out


def _matches(obj: Mapping[str, Any], terms: Iterable[tuple[str, str, str]]) -> bool:
    for path, op, value in terms:
        have = _field(obj, path)
        if (op == "!=") == (have == value):
            return False
    return True


class FakeKubeApi(LoopbackService):
    """The stand-in: ``with FakeKubeApi(pods=..., nodes=..., events=...) as api: api.url``."""

    thread_name = "fake-kube-api"

    def __init__(
        self,
        pods: Iterable[Mapping[str, Any]] = (),
        nodes: Iterable[Mapping[str, Any]] = (),
        events: Iterable[Mapping[str, Any]] = (),
        host: str = "127.0.0.1",
        token: str | None = None,
    ) -> None:
        require_loopback(host, "Kubernetes API stand-in")
        self.pods = [dict(p) for p in pods]
        self.nodes = [dict(n) for n in nodes]
        self.events = [dict(e) for e in events]
        self.token = token or secrets.token_hex(16)
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler())

    def _list(self, kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": "1000"}, "items": items}

    def answer(self, method: str, target: str, authorization: str) -> tuple[int, dict[str, Any]]:
        """(status, body) for one request; pure apart from the request log."""
        with self._lock:
            self.requests.append(f"{method} {target}")
        if authorization != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        if method != "GET":
            return 405, _status(405, "MethodNotAllowed", f"the server does not allow this method: {method}")
        url = urlsplit(target)
        query = parse_qs(url.query)
        try:
            terms = _selector(query.get("fieldSelector", [""])[0])
        except ValueError as exc:
            return 400, _status(400, "BadRequest", f"invalid field selector: {exc}")
        path = url.path.rstrip("/")
        if path == "/version":
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.6", "platform": "linux/amd64"}
        if path == "/api/v1/nodes":
            return 200, self._list("Node", [n for n in self.nodes if _matches(n, terms)])
        if path == "/api/v1/pods":
            return 200, self._list("Pod", [p for p in self.pods if _matches(p, terms)])
        if m := _POD.match(path):
            found = next(
                (
                    p
                    for p in self.pods
                    if _field(p, "metadata.namespace") == m["ns"] and _field(p, "metadata.name") == m["name"]
                ),
                None,
            )
            if found is None:
                return 404, _status(
                    404, "NotFound", f'pods "{m["name"]}" not found', {"name": m["name"], "kind": "pods"}
                )
            return 200, found
        if m := _PODS_NS.match(path):
            items = [p for p in self.pods if _field(p, "metadata.namespace") == m["ns"] and _matches(p, terms)]
            return 200, self._list("Pod", items)
        if m := _EVENTS_NS.match(path):
            items = [e for e in self.events if _field(e, "metadata.namespace") == m["ns"] and _matches(e, terms)]
            return 200, self._list("Event", items)
        return 404, _status(404, "NotFound", "the server could not find the requested resource")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self) -> None:
                status, body = api.answer(self.command, self.path, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _reply

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the request log is api.requests

        return Handler


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def kubeconfig(api: FakeKubeApi, path: Path, context: str = "lab", namespace: str = "default") -> Path:
    """A kubeconfig for ``api`` at ``path`` (mode 0600; it holds the token)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": api.url}}],
        "users": [{"name": f"{context}-user", "user": {"token": api.token}}],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": f"{context}-user", "namespace": namespace}}
        ],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
