"""What the ``aoai.*`` tasks call: the Azure OpenAI area's one entry."""

from __future__ import annotations

from typing import Any

from remediation.core.lazy import LazyExports

_API = LazyExports(__name__, {
    "ALERTS_FILE": "remediation.aoai.templates",
    "APIM_FILE": "remediation.aoai.templates",
    "AoaiSettings": "remediation.aoai.settings",
    "TEMPLATES": "remediation.aoai.templates",
    "alert_parameters": "remediation.aoai.templates",
    "analyse": "remediation.aoai.analysis",
    "apim_parameters": "remediation.aoai.templates",
    "render_analysis": "remediation.aoai.report",
    "render_json": "remediation.aoai.templates",
})
__all__ = _API.names


def __getattr__(name: str) -> Any:
    return _API.load(name)
