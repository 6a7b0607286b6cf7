"""What the host tasks call (``audit``, ``diagnose``, ``harden``, the audit history): the host area's one entry.

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
