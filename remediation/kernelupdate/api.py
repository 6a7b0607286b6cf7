"""What ``invoke kernel-update`` calls: the kernel update's one entry (an adapter on the rollout engine)."""

from __future__ import annotations

from typing import Any

from remediation.core.lazy import LazyExports

_API = LazyExports(__name__, {
    "KernelUpdateError": "remediation.kernelupdate.errors",
    "KernelUpdateOptions": "remediation.kernelupdate.flow",
    "kernel_update": "remediation.kernelupdate.flow",
})
__all__ = _API.names


def __getattr__(name: str) -> Any:
    return _API.load(name)
