"""AKS nodes for the loop: the node's cordon and AKS node auto-repair, through the Kubernetes API.

Connects as :mod:`remediation.k8s.live` does (the official ``kubernetes`` client, the kubeconfig of the setting
``remediate.kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``; ``remediate.kube_context``), each request
with ``remediate.kube_timeout_s``. Reads the node (``GET /api/v1/nodes/{name}``) and its events
(``GET /api/v1/events?fieldSelector=involvedObject.kind=Node,involvedObject.name={name}``); cordons and uncordons
with a JSON merge patch of the node (:mod:`remediation.remediate.cordon`).

**AKS node auto-repair** (Microsoft's "AKS node auto-repair" page): a node NotReady for some minutes is rebooted,
then reimaged, then redeployed, by the user ``aks-remediator``; the sequence is retried and can take up to an hour.
Each step is a Kubernetes event on the node object from the source ``aks-auto-repair``, reasons
``NodeRebootStart`` / ``NodeRebootEnd`` / ``NodeRebootError`` and the same for ``Reimage`` and ``Redeploy``.
:func:`auto_repair` blocks the node when such an event is recent (within ``window_s``, default an hour, the
sequence's length) or when its latest step started and has not ended: the loop never acts on top of the platform,
and never reboots or restores a driver on a node AKS is about to reimage.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["AUTO_REPAIR_SOURCE", "NodeApi", "auto_repair"]

AUTO_REPAIR_SOURCE = "aks-auto-repair"
_STEPS = ("Reboot", "Reimage", "Redeploy")
_REASONS = {f"Node{s}{p}" for s in _STEPS for p in ("Start", "End", "Error")}


def _when(event: Mapping[str, Any]) -> _dt.datetime | None:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        value = event.get(key) or ((event.get("series") or {}).get("lastObservedTime") if key == "eventTime" else None)
        if isinstance(value, str) and value:
            try:
                return _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
    return None


def _is_repair(event: Mapping[str, Any]) -> bool:
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    return event.get("reason") in _REASONS or source == AUTO_REPAIR_SOURCE


def auto_repair(events: Iterable[Mapping[str, Any]], now: _dt.datetime, window_s: float = 3600.0) -> str | None:
    """Why AKS node auto-repair keeps the loop off this node, or None. ``events``: the node's events."""
    seen = [(w, e) for e in events if _is_repair(e) and (w := _when(e)) is not None]
    if not seen:
        return None
    at, last = max(seen, key=lambda pair: pair[0])
    reason = str(last.get("reason") or "?")
    age = (now - at).total_seconds()
    if reason.endswith("Start"):
        return (f"AKS node auto-repair in progress ({reason} at {at.isoformat(timespec='seconds')}): "
                "never act on top of the platform")
    if age <= window_s:
        return (f"AKS node auto-repair active {int(age // 60)} min ago ({reason}): the sequence may go on for up to "
                "an hour; the next run looks again")
    return None


class NodeApi:
    """The few node calls the loop makes; errors are one line (:class:`NodeApiError`)."""

    def __init__(self, kubeconfig: str = "", context: str = "", timeout: float = 10.0) -> None:
        from kubernetes import client

        from remediation.k8s.errors import K8sApiError
        from remediation.k8s.live import _client, kubeconfig_path

        self.timeout = timeout
        self.path = kubeconfig_path(kubeconfig)
        self.error = K8sApiError
        self.api = client.CoreV1Api(_client(self.path, context))

    def close(self) -> None:
        self.api.api_client.close()

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response = call(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            return json.loads(response.data)
        except ApiException as exc:
            reason = exc.reason or ""
            with contextlib.suppress(ValueError, AttributeError):
                reason = json.loads(exc.body or "{}").get("message") or reason
            raise self.error(f"Kubernetes API: {what}: HTTP {exc.status} {reason}".rstrip()) from None
        except HTTPError as exc:
            raise self.error(f"Kubernetes API: {what}: cannot connect ({type(exc).__name__}: {exc})") from None
        except ValueError as exc:
            raise self.error(f"Kubernetes API: {what}: the answer is not JSON ({exc})") from None

    def node(self, name: str) -> dict[str, Any]:
        return dict(self._call(f"node {name}", self.api.read_node, name))

    def events(self, name: str) -> list[dict[str, Any]]:
        doc = self._call(f"events of node {name}", self.api.list_event_for_all_namespaces,
                         field_selector=f"involvedObject.kind=Node,involvedObject.name={name}")
        return [e for e in doc.get("items") or () if isinstance(e, dict)]

    def patch(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self._call(f"patch node {name}", self.api.patch_node, name, dict(body),
                               _content_type="application/merge-patch+json"))
