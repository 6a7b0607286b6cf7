"""One exception family per subsystem.

Library code raises these with the offending input named; only the task edge (``tasks.py``) turns them into a
one-line message and an exit code.
"""

from __future__ import annotations

from remediation.core.exitcodes import ExitCode


class RemediationError(Exception):
    """Base of every error this project raises on purpose."""

    exit_code: ExitCode = ExitCode.BAD_INPUT


class UsageError(RemediationError):
    """A flag or setting given to a task is unusable."""


class InventoryError(RemediationError):
    """The inventory or a host selection is unusable."""


class FanoutError(RemediationError):
    """The fleet fan-out could not run at all (not: one host failed)."""


class ProbeError(RemediationError):
    """A probe's output could not be parsed."""


class RunnerError(RemediationError):
    """ansible-runner could not run a playbook."""


class AzureApiError(RemediationError):
    """An Azure Resource Manager call failed."""


class TemplateError(RemediationError):
    """A template could not be rendered from the given data."""


class ParseError(RemediationError):
    """Field text could not be classified."""


class AoaiError(RemediationError):
    """An Azure OpenAI input (request log, metrics export, deployment list) is unusable."""
