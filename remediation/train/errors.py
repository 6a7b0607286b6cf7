"""The training-memory subsystem's one exception family."""

from __future__ import annotations

from remediation.core.errors import RemediationError

__all__ = ["TrainError"]


class TrainError(RemediationError):
    """A model, GPU, plan input or monitor request that the training tools cannot use (exit 2)."""
