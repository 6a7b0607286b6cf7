"""The rollout engine's exceptions: raised before any host is changed, with the offending input named."""

from __future__ import annotations

from remediation.core.errors import RemediationError
from remediation.core.exitcodes import ExitCode


class RolloutError(RemediationError):
    """A rolling change cannot run as asked (nothing has been changed when this is raised)."""


class LockHeldError(RolloutError):
    """Another rolling change holds the fleet's lock or a host's lease."""

    exit_code = ExitCode.LOCK_HELD
