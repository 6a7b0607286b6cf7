"""What ``invoke driver-restore`` calls: the driver restore's one entry (an adapter on the rollout engine).

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
    "Prefer": "remediation.restore.rules",
    "RestoreError": "remediation.restore.errors",
    "RestoreOptions": "remediation.restore.flow",
    "driver_restore": "remediation.restore.flow",
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
