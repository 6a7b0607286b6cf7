"""The lab's exception: the simulated GPU fleet cannot do what was asked.

The lab is not the library: :mod:`remediation` never imports :mod:`lab`. ``LabError`` is still one of the project's
deliberate errors (a :class:`~remediation.core.errors.RemediationError`), so the task edge (:func:`commands.edge`)
turns it into one line naming the input and exit 2 (``ExitCode.BAD_INPUT``), as for ``invoke lab.*``.
"""

from __future__ import annotations

from remediation.core.errors import RemediationError

__all__ = ["LabError"]


class LabError(RemediationError):
    """The simulated lab fleet cannot do what was asked (raised with the offending input named)."""
