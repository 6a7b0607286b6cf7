"""The Azure subsystem's exceptions: one base (:class:`AzureApiError`), each raised with the offending input named.

Exit codes at the task edge: 2 bad input or no usable login (nothing was sent), 3 an ARM call failed (ARM's code and
message), 1 a quota request ended ``Failed``/``Invalid``, 5 a quota request Azure will only grant through a support
request (``ContactSupport``). No message ever carries a token.
"""

from __future__ import annotations

from remediation.core.errors import AzureApiError
from remediation.core.exitcodes import ExitCode

__all__ = [
    "ArmError",
    "AzureApiError",
    "AzureInputError",
    "AzureLoginError",
    "ContactSupportError",
    "QuotaRequestFailed",
]


class AzureInputError(AzureApiError):
    """A flag, setting or inventory variable is unusable; nothing was sent."""


class AzureLoginError(AzureApiError):
    """No usable Azure login (not logged in, no subscription selected, no token): nothing was sent."""


class ArmError(AzureApiError):
    """An ARM call failed (after the retries it is allowed); carries ARM's ``code`` and ``message``."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, message: str, *, status: int | None = None, code: str = "", arm_message: str = "",
                 request_id: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.arm_message = arm_message
        self.request_id = request_id


class QuotaRequestFailed(AzureApiError):
    """A quota request ended ``Failed`` or ``Invalid`` (other than ``ContactSupport``)."""

    exit_code = ExitCode.FINDINGS


class ContactSupportError(AzureApiError):
    """Azure will not raise this quota automatically: a support request is the way (never retried)."""

    exit_code = ExitCode.CONTACT_SUPPORT
