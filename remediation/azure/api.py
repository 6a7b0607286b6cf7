"""What the ``quota.*`` and ``aks.*`` tasks call: the Azure area's one entry."""

from __future__ import annotations

from typing import Any

from remediation.core.lazy import LazyExports

_API = LazyExports(__name__, {
    "AzureSettings": "remediation.azure.settings",
    "check_format": "remediation.azure.run",
    "pools": "remediation.azure.run",
    "quota_plan": "remediation.azure.run",
    "quota_request": "remediation.azure.run",
    "quota_show": "remediation.azure.run",
}, modules={"report": "remediation.azure.report"})
__all__ = _API.names


def __getattr__(name: str) -> Any:
    return _API.load(name)
