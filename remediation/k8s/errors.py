"""The Kubernetes area's exception family."""

from __future__ import annotations

from remediation.core.errors import RemediationError, TemplateError
from remediation.core.exitcodes import ExitCode

__all__ = ["K8sApiError", "K8sError", "SnapshotError", "ValuesError"]


class K8sError(RemediationError):
    """Base of the Kubernetes area's errors."""


class SnapshotError(K8sError):
    """A snapshot directory or object file is missing or malformed."""


class ValuesError(TemplateError, K8sError):
    """Template values do not match the template's schema."""


class K8sApiError(K8sError):
    """The Kubernetes API could not be asked (kubeconfig, connection, an API error)."""

    exit_code = ExitCode.UNREACHABLE
