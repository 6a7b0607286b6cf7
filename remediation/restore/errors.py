"""The restore subsystem's exceptions (one base, raised with the offending input named)."""

from __future__ import annotations

from remediation.rollout.errors import RolloutError


class RestoreError(RolloutError):
    """``invoke driver-restore`` cannot run as asked (nothing has been changed when this is raised)."""


class MethodUnavailableError(RestoreError):
    """A restore method was chosen that does not exist yet (raised before any change)."""
