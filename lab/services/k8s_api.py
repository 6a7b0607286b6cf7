"""A Kubernetes API server stand-in on loopback: pods, nodes and events, read-only, for the live diagnosis.

It answers the requests the official ``kubernetes`` Python client sends for ``invoke k8s.diagnose-pending --pod``:

- ``GET /api/v1/namespaces/{ns}/pods/{name}`` (404 ``Status`` when missing)
- ``GET /api/v1/nodes``, ``GET /api/v1/pods`` and ``GET /api/v1/namespaces/{ns}/pods`` with ``fieldSelector``
  (``=``, ``==``, ``!=`` on ``spec.nodeName``, ``status.phase``, ``metadata.name``, ``metadata.namespace``)
- ``GET /api/v1/namespaces/{ns}/events`` and ``GET /api/v1/events`` (all namespaces) with ``fieldSelector`` on
  ``involvedObject.name`` / ``.kind``
- ``GET /api/v1/nodes/{name}``, and ``PATCH /api/v1/nodes/{name}`` (cordon, labels, annotations) as a JSON merge
  patch (``application/merge-patch+json``, RFC 7386: objects merge, ``null`` deletes, anything else replaces) or a
  strategic merge patch (``application/strategic-merge-patch+json``: the same for the maps and scalars of a node's
  ``metadata`` and ``spec``; a list, such as ``spec.taints``, is replaced whole here); a ``metadata.resourceVersion``
  in the patch is a precondition (409 ``Conflict`` when the node has changed since); every change bumps it.
  Another content type (a JSON patch, server-side apply) is 415
- ``GET /version`` (``version=``, default v1.30.6)

as the real API server does: ``v1`` List objects with ``apiVersion``/``kind``/``metadata.resourceVersion``,
``application/json``, ``Status`` objects for errors (401 without the bearer token, 404, 405 for a method a path does
not take, 400 for a field selector it cannot read or a patch that is not a JSON object). Only loopback addresses are
served; each connection handles one request.

:func:`kubeconfig` writes a kubeconfig that points the client at it (``http://127.0.0.1:PORT``, a bearer token).
:mod:`lab.services.k8s_scenarios` builds the clusters the tests and the demo load into it, their
FailedScheduling events written as kube-scheduler's ``FitError.Error()`` writes them (1.34+ DRA clause, 1.35 hidden
taint key: :func:`~lab.services.k8s_scenarios.scheduler_message`).
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
from lab.services.jsonhttp import json_handler

__all__ = ["FakeKubeApi", "kubeconfig", "merge_patch"]

_POD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
_PODS_NS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
_EVENTS_NS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")
_NODE = re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")
_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to ``target`` (a new object; neither argument is changed)."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


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
        version: str = "v1.30.6",
    ) -> None:
        require_loopback(host, "Kubernetes API stand-in")
        self.pods = [dict(p) for p in pods]
        self.nodes = [dict(n) for n in nodes]
        self.events = [dict(e) for e in events]
        self.token = token or secrets.token_hex(16)
        self.version = version
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler())

    def _list(self, kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": "1000"}, "items": items}

    def answer(
        self, method: str, target: str, authorization: str, body: bytes = b"", content_type: str = ""
    ) -> tuple[int, dict[str, Any]]:
        """(status, body) for one request; pure apart from the request log and a node's patch."""
        with self._lock:
            self.requests.append(f"{method} {target}")
        if authorization != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        node_path = _NODE.match(urlsplit(target).path.rstrip("/"))
        if node_path is not None and method in ("GET", "PATCH"):
            return self._node(method, node_path["name"], body, content_type)
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
            major, _, rest = self.version.lstrip("v").partition(".")
            return 200, {
                "major": major,
                "minor": rest.partition(".")[0],
                "gitVersion": self.version,
                "platform": "linux/amd64",
            }
        if path == "/api/v1/nodes":
            return 200, self._list("Node", [n for n in self.nodes if _matches(n, terms)])
        if path == "/api/v1/events":
            return 200, self._list("Event", [e for e in self.events if _matches(e, terms)])
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

    def _node(self, method: str, name: str, body: bytes, content_type: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            index = next((i for i, n in enumerate(self.nodes) if _field(n, "metadata.name") == name), None)
            if index is None:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
            current = self.nodes[index]
            if method == "GET":
                return 200, current
            kind = content_type.split(";")[0].strip().lower()
            if kind not in _PATCH_TYPES:
                return 415, _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format"
                                    f" - accepted media types include: {', '.join(_PATCH_TYPES)}")
            try:
                patch = json.loads(body or b"null")
            except ValueError as exc:
                return 400, _status(400, "BadRequest", f"error decoding patch: {exc}")
            if not isinstance(patch, dict):
                return 400, _status(400, "BadRequest", "the patch is not a JSON object")
            have = str((current.get("metadata") or {}).get("resourceVersion") or "1")
            want = (patch.get("metadata") or {}).get("resourceVersion")
            if want is not None and str(want) != have:
                return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object '
                                    "has been modified; please apply your changes to the latest version and try again",
                                    {"name": name, "kind": "nodes"})
            patched = merge_patch(current, patch)
            patched.setdefault("metadata", {})["resourceVersion"] = str(int(have) + 1 if have.isdigit() else 2)
            patched["metadata"]["name"] = name
            self.nodes[index] = patched
            return 200, patched

    def node(self, name: str) -> dict[str, Any]:
        """The node ``name`` as the stand-in holds it now."""
        with self._lock:
            return next(n for n in self.nodes if _field(n, "metadata.name") == name)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return json_handler(lambda method, path, headers, body: self.answer(
            method, path, headers.get("authorization", ""), body, headers.get("content-type", "")))


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
