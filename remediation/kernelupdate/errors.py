"""The kernel update's exceptions (one base, raised with the offending input named, before any change)."""

from __future__ import annotations

from remediation.rollout.errors import RolloutError


class KernelUpdateError(RolloutError):
    """``invoke kernel-update`` cannot run as asked (nothing has been changed when this is raised)."""
