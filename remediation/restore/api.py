"""What ``invoke driver-restore`` calls: the driver restore's one entry (an adapter on the rollout engine)."""

from __future__ import annotations

from typing import Any

from remediation.core.lazy import LazyExports

_API = LazyExports(__name__, {
    "Prefer": "remediation.restore.rules",
    "RestoreError": "remediation.restore.errors",
    "RestoreOptions": "remediation.restore.flow",
    "driver_restore": "remediation.restore.flow",
})
__all__ = _API.names


def __getattr__(name: str) -> Any:
    return _API.load(name)
