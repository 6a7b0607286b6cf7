"""One entry point for every audit output format: ``render(result, fmt)``.

=========  ====================================================  ==============================================
format     module                                                 output
=========  ====================================================  ==============================================
``table``  :mod:`remediation.report.table`                        printed on ``console`` (returns None); without a
                                                                  console: the plain text of the table
``json``   :mod:`remediation.report.json_report`                  ``gpufleet.audit/1`` document
``junit``  :mod:`remediation.report.junit`                        JUnit XML, one suite per host
``prom``   :mod:`remediation.report.prometheus`                   node_exporter textfile
``md``     :mod:`remediation.report.incident`                     incident report(s), Markdown
=========  ====================================================  ==============================================
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console

from remediation.core.errors import RemediationError
from remediation.core.findings import Severity

if TYPE_CHECKING:
    from remediation.host.audit import AuditResult

__all__ = ["FORMATS", "render"]

FORMATS: tuple[str, ...] = ("table", "json", "junit", "prom", "md")


def render(
    result: AuditResult,
    fmt: str,
    console: Console | None = None,
    *,
    fail_on: Severity = Severity.CRITICAL,
    unreachable_exit: int | None = None,
    host: str | None = None,
) -> str | None:
    """Render ``result`` as ``fmt`` (one of :data:`FORMATS`).

    ``table`` prints on ``console`` and returns None; with no console it renders without colour at 160 columns
    and returns the text (for ``--out FILE``). ``fail_on``/``unreachable_exit`` only change the table's exit code
    line; ``host`` limits the ``md`` incident report to one host. Raises :class:`RemediationError` for an unknown
    format.
    """
    if fmt == "table":
        from remediation.report.table import render_table

        target = (
            console if console is not None else Console(file=io.StringIO(), record=True, width=160, color_system=None)
        )
        render_table(result, target, fail_on=fail_on, unreachable_exit=unreachable_exit)
        return None if console is not None else target.export_text()
    if fmt == "json":
        from remediation.report.json_report import render_json

        return render_json(result)
    if fmt == "junit":
        from remediation.report.junit import render_junit

        return render_junit(result)
    if fmt == "prom":
        from remediation.report.prometheus import render_prometheus

        return render_prometheus(result)
    if fmt == "md":
        from remediation.report.incident import render_incident

        return render_incident(result, host)
    raise RemediationError(f"unknown report format {fmt!r}; one of {', '.join(FORMATS)}")
