"""What the ``aoai.*`` tasks call: the Azure OpenAI area's one entry.

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
    "ALERTS_FILE": "remediation.aoai.templates",
    "APIM_FILE": "remediation.aoai.templates",
    "AoaiSettings": "remediation.aoai.settings",
    "TEMPLATES": "remediation.aoai.templates",
    "alert_parameters": "remediation.aoai.templates",
    "analyse": "remediation.aoai.analysis",
    "apim_parameters": "remediation.aoai.templates",
    "render_analysis": "remediation.aoai.report",
    "render_json": "remediation.aoai.templates",
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
