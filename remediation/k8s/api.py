"""What the ``k8s.*`` tasks call: the Kubernetes area's one entry."""

from __future__ import annotations

from typing import Any

from remediation.core.lazy import LazyExports

_API = LazyExports(__name__, {
    "K8sSettings": "remediation.k8s.settings",
    "apply_sets": "remediation.k8s.render",
    "diagnose_latency": "remediation.k8s.latency",
    "diagnose_pending": "remediation.k8s.pending",
    "fetch_snapshot": "remediation.k8s.live",
    "latency_json": "remediation.k8s.report",
    "load_json": "remediation.k8s.snapshot",
    "load_snapshot": "remediation.k8s.snapshot",
    "load_values": "remediation.k8s.render",
    "pending_json": "remediation.k8s.report",
    "pools_from_dict": "remediation.k8s.capacity",
    "print_latency": "remediation.k8s.report",
    "print_pending": "remediation.k8s.report",
    "read_text": "remediation.k8s.snapshot",
    "render": "remediation.k8s.render",
    "render_rules": "remediation.k8s.alerts",
    "templates_dir": "remediation.k8s.render",
    "usages_from_dict": "remediation.k8s.capacity",
})
__all__ = _API.names


def __getattr__(name: str) -> Any:
    return _API.load(name)
