"""What the ``k8s.*`` tasks call: the Kubernetes area's one entry.

The tasks import from here only; each name is loaded from its module on first use (PEP 562), so a task imports only
what it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

#: name -> the module that defines it
_EXPORTS = {
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
}
_MODULES: dict[str, str] = {}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
