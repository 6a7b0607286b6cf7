"""The kernel update's exceptions (one base, raised with the offending input named, before any change)."""

from __future__ import annotations

from remediation.restore.errors import RestoreError


class KernelUpdateError(RestoreError):
    """``invoke kernel-update`` cannot run as asked (nothing has been changed when this is raised)."""
