"""``invoke audit`` (read-only fleet audit) and ``invoke diagnose`` (triage pasted field text)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from invoke import Collection, Exit, task

from commands import (
    FLEET_HELP,
    audit_options,
    edge,
    fleet_hosts,
    format_help,
    formats,
    read_input,
    settings,
    under_project,
)
from remediation.core.exitcodes import ExitCode


@task(
    name="run",
    default=True,
    help={
        **FLEET_HELP,
        "format": format_help(
            "table", "json", "junit", "prom", "md", junit="CI", prom="node_exporter textfile", md="a ticket"
        ),
        "out": "write the report to this file instead of stdout",
        "fail_on": "warning | critical: exit 1 when a finding is at or above it (default from config: critical)",
        "concurrency": "hosts probed at once",
        "timeout": "seconds for the whole probe on one host",
        "history": "compare with the previous run and keep this one (directory from audit.history_dir); with a "
        "machine format on stdout the comparison goes to stderr, so stdout stays one document",
    },
)
@edge
@formats("table", "json", "junit", "prom", "md")
def audit(  # type: ignore[no-untyped-def]
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    format="table",
    out=None,
    fail_on=None,
    concurrency=None,
    timeout=None,
    history=False,
):
    """Audit a GPU fleet with NVML on every host: findings, root causes, reports. Read-only.

    Exit codes: 0 clean; 1 a finding at or above --fail-on; 2 bad input; 3 a host could not be probed
    (audit.unreachable_exit) and no finding reached --fail-on.
    """
    from rich.console import Console

    from remediation.config import AuditSettings
    from remediation.core.errors import UsageError
    from remediation.core.findings import Severity
    from remediation.host.api import run_audit
    from remediation.report.console import console, progress_bar
    from remediation.report.formats import FORMATS, render

    if format not in FORMATS:
        raise UsageError(f"--format {format!r} is not one of {', '.join(FORMATS)}")
    cfg = settings(c, AuditSettings, "audit")
    level = fail_on or cfg.fail_on
    if level not in ("warning", "critical"):
        raise UsageError(f"--fail-on {level!r} must be warning or critical")
    options = audit_options(c, concurrency, timeout)  # every number checked before the inventory is read
    hosts, path, _group = fleet_hosts(c, fleet, inventory, limit)
    with progress_bar(len(hosts), enabled=format == "table" and out is None) as tick:
        result = run_audit(hosts, options, fleet=fleet, inventory=path, progress=tick)
    text = render(
        result, format, console=None if out else console, fail_on=Severity(level), unreachable_exit=cfg.unreachable_exit
    )
    if text is not None:
        if out:
            Path(out).write_text(text)
            print(f"wrote {format} report to {out}", file=sys.stderr)
        else:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if history:
        from remediation.host.api import compare, load_previous, render_comparison
        from remediation.host.api import save as save_history

        directory = under_project(c, cfg.history_dir)
        comparison = compare(load_previous(directory, fleet), result)
        # stdout holds a document that must parse as a whole: the comparison goes beside it, on stderr
        document_on_stdout = out is None and format != "table"
        render_comparison(comparison, Console(stderr=True, highlight=False) if document_on_stdout else console)
        save_history(result, directory)
    raise Exit(code=result.exit_code(Severity(level), cfg.unreachable_exit))


@task(
    positional=["file"],
    help={
        "file": "file with the text to triage (nvidia-smi output, kernel log, apt history or unattended-upgrades log, "
        "dkms output, ...); - for stdin",
        "format": format_help("text", "json"),
        "kind": "read the whole text as this one kind (no split of a paste into its parts)",
        "explain": "text: each finding with its full runbook (default: brief, the finding, its evidence and the "
        "one command to run)",
    },
)
@edge
@formats("text", "json")
def diagnose(c, file=None, format="text", kind=None, explain=False):  # type: ignore[no-untyped-def]
    """Paste error text from the field; get the findings, critical first, and the command to run (--explain: the
    runbook). Exit 1 when something is found."""
    import json

    from remediation.core.errors import ParseError
    from remediation.host.api import diagnose as run
    from remediation.host.api import render_text

    if format not in ("text", "json"):
        raise ParseError(f"--format {format!r} must be text or json")
    text, source = read_input(file)
    result = run(text, kind=kind, source=source)
    if format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_text(result, explain=bool(explain)), end="")
    raise Exit(code=ExitCode.FINDINGS if result.findings else ExitCode.OK)


ns: Any = Collection("audit", audit)
