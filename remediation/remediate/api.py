"""What ``invoke remediate`` calls: the closed loop's one entry (policy, guards, state, plan).

The tasks import from here only; each name is loaded from its module on first use (PEP 562), so a task imports only
what it runs.
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> the module that defines it
_EXPORTS = {
    "ActResult": "remediation.remediate.act",
    "RemediateError": "remediation.remediate.errors",
    "ResetResult": "remediation.remediate.flow",
    "act": "remediation.remediate.act",
    "check": "remediation.remediate.flow",
    "guards_from": "remediation.remediate.flow",
    "policy_from": "remediation.remediate.flow",
    "reset": "remediation.remediate.flow",
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
