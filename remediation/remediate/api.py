"""What ``invoke remediate`` calls: the closed loop's one entry (policy, guards, state, plan)."""

from __future__ import annotations

from typing import Any

from remediation.core.lazy import LazyExports

_API = LazyExports(__name__, {
    "ActResult": "remediation.remediate.act",
    "RemediateError": "remediation.remediate.errors",
    "ResetResult": "remediation.remediate.flow",
    "act": "remediation.remediate.act",
    "check": "remediation.remediate.flow",
    "guards_from": "remediation.remediate.flow",
    "policy_from": "remediation.remediate.flow",
    "reset": "remediation.remediate.flow",
})
__all__ = _API.names


def __getattr__(name: str) -> Any:
    return _API.load(name)
