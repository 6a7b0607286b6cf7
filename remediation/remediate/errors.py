"""The closed loop's errors: one line each, naming the input and the fix; the task edge makes them exit codes."""

from __future__ import annotations

from remediation.core.errors import RemediationError
from remediation.core.exitcodes import ExitCode

__all__ = ["RemediateError", "StateError", "StateLockedError"]


class RemediateError(RemediationError):
    """``invoke remediate`` cannot go on: a policy, a flag or its state is unusable (exit 2)."""


class StateError(RemediateError):
    """The state file (attempt budget, findings seen, circuit breaker) cannot be read or written. Never reset
    silently: a budget forgotten is a reboot loop allowed."""


class StateLockedError(RemediateError):
    """Another remediate run holds the state file's lock (exit 4, as a rollout's lock)."""

    exit_code = ExitCode.LOCK_HELD
