"""What the ``quota.*`` and ``aks.*`` tasks call: the Azure area's one entry.

The tasks import from here only; each name is loaded from its module on first use (PEP 562), so a task imports only
what it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

#: name -> the module that defines it; _MODULES: name -> a module exported whole
_EXPORTS = {
    "AzureSettings": "remediation.azure.settings",
    "check_format": "remediation.azure.run",
    "pools": "remediation.azure.run",
    "quota_plan": "remediation.azure.run",
    "quota_request": "remediation.azure.run",
    "quota_show": "remediation.azure.run",
}
_MODULES: dict[str, str] = {"report": "remediation.azure.report"}

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
