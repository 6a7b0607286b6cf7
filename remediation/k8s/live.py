"""A snapshot from a live cluster, through the official ``kubernetes`` client and the user's kubeconfig.

Read-only: four GETs (the pod, the nodes, the cluster's non-terminated pods, the pod's events), each with the
configured timeout. The API's JSON is read as is (``_preload_content=False``) and parsed by the same
``*_from_dict`` functions as a snapshot directory, so the live path and ``--snapshot`` decide alike.
Errors become :class:`~remediation.k8s.errors.K8sApiError` (exit 3) naming the kubeconfig, the request and the
API's own reason; a pod that does not exist is a usage error (exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from remediation.k8s.errors import K8sApiError, SnapshotError
from remediation.k8s.objects import event_from_dict, items_from_dict, node_from_dict, pod_from_dict
from remediation.k8s.snapshot import Snapshot

__all__ = ["fetch_snapshot", "kubeconfig_path"]


def kubeconfig_path(configured: str = "") -> str:
    """The kubeconfig to use: the setting/flag, else ``$KUBECONFIG`` (its first file), else ``~/.kube/config``."""
    if configured:
        return configured
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return env.split(os.pathsep)[0]
    return str(Path.home() / ".kube" / "config")


def _client(kubeconfig: str, context: str) -> Any:
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    if not Path(kubeconfig).is_file():
        raise K8sApiError(
            f"kubeconfig {kubeconfig} not found: pass --kubeconfig, set KUBECONFIG, or "
            "az aks get-credentials --name CLUSTER --resource-group RG"
        )
    try:
        return config.new_client_from_config(  # type: ignore[no-untyped-call]  # the client ships no annotations
            config_file=kubeconfig, context=context or None
        )
    except ConfigException as exc:
        raise K8sApiError(f"kubeconfig {kubeconfig}: {exc}") from None


def _get(what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = call(*args, _preload_content=False, **kwargs)
        return json.loads(response.data)
    except ApiException as exc:
        reason = exc.reason or ""
        with contextlib.suppress(ValueError, AttributeError):
            reason = json.loads(exc.body or "{}").get("message") or reason
        if exc.status == 404 and what.startswith("pod "):
            raise SnapshotError(f"{what}: not found ({reason}); check the name and -n NAMESPACE") from None
        raise K8sApiError(f"Kubernetes API: {what}: HTTP {exc.status} {reason}".rstrip()) from None
    except HTTPError as exc:
        raise K8sApiError(f"Kubernetes API: {what}: cannot connect ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:
        raise K8sApiError(f"Kubernetes API: {what}: the answer is not JSON ({exc})") from None


def fetch_snapshot(
    pod: str, namespace: str, kubeconfig: str = "", context: str = "", timeout: float = 10.0
) -> Snapshot:
    """The pod, the nodes, the pods and the pod's events from the cluster of ``kubeconfig``'s context."""
    from kubernetes import client

    path = kubeconfig_path(kubeconfig)
    api = client.CoreV1Api(_client(path, context))
    try:
        raw_pod = _get(f"pod {namespace}/{pod}", api.read_namespaced_pod, pod, namespace, _request_timeout=timeout)
        nodes = _get("list nodes", api.list_node, _request_timeout=timeout)
        pods = _get(
            "list pods",
            api.list_pod_for_all_namespaces,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
            _request_timeout=timeout,
        )
        events = _get(
            f"events of pod {namespace}/{pod}",
            api.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.name={pod}",
            _request_timeout=timeout,
        )
    finally:
        api.api_client.close()
    source = f"kubeconfig {path}"
    return Snapshot(
        pod=pod_from_dict(raw_pod, f"{source}: pod {namespace}/{pod}"),
        nodes=tuple(node_from_dict(n, source) for n in items_from_dict(nodes, "Node", f"{source}: nodes")),
        pods=tuple(pod_from_dict(p, source) for p in items_from_dict(pods, "Pod", f"{source}: pods")),
        events=tuple(event_from_dict(e) for e in items_from_dict(events, "Event", f"{source}: events")),
        source=source,
    )
