"""The restore subsystem's exceptions (one base, raised with the offending input named)."""

from __future__ import annotations

from remediation.errors import RemediationError
from remediation.exitcodes import ExitCode


class RestoreError(RemediationError):
    """``invoke driver-restore`` cannot run as asked (nothing has been changed when this is raised)."""


class LockHeldError(RestoreError):
    """Another driver restore holds the fleet's lock."""

    exit_code = ExitCode.LOCK_HELD


class MethodUnavailableError(RestoreError):
    """A restore method was chosen that does not exist yet (raised before any change)."""
