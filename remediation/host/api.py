"""What the host tasks call (``audit``, ``diagnose``, ``harden``, the audit history): the host area's one entry."""

from __future__ import annotations

from typing import Any

from remediation.core.lazy import LazyExports

_API = LazyExports(__name__, {
    "AuditOptions": "remediation.host.audit",
    "DiagnoseResult": "remediation.host.diagnose",
    "compare": "remediation.host.history",
    "diagnose": "remediation.host.diagnose",
    "harden": "remediation.host.harden",
    "load_previous": "remediation.host.history",
    "render_comparison": "remediation.host.history",
    "render_text": "remediation.host.diagnose",
    "run_audit": "remediation.host.audit",
    "save": "remediation.host.history",
})
__all__ = _API.names


def __getattr__(name: str) -> Any:
    return _API.load(name)
