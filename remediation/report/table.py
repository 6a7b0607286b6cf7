"""The fleet table for a terminal (rich): one row per host, the findings in detail, a summary and the exit code.

Two columns say what on-call reads first, each meaning one thing: ``probe`` whether the host answered the probe
(``probed``, ``unreachable``, ``timed out``, ``probe failed``) and ``health`` what the answer says (``critical``,
``warning``, ``healthy``; ``unknown`` for a host that could not be probed, never healthy). A host with a critical
finding reads ``probed`` / ``critical``, never ``ok``.

Everything from the field (host names, evidence lines, error text) is passed to rich as :class:`~rich.text.Text`,
never as markup, so a ``[bold]`` or ``[/]`` in a kernel log line prints as itself. Without a TTY (CI logs,
``Console(record=True)``) rich drops the colours and the table keeps its shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from remediation.core.findings import Finding, Severity
from remediation.report import hostview

if TYPE_CHECKING:
    from remediation.host.audit import AuditResult, HostAudit

__all__ = [
    "SEVERITY_STYLE",
    "details",
    "exit_code_meaning",
    "fleet_table",
    "health_word",
    "probe_word",
    "render_table",
    "summary_line",
]

SEVERITY_STYLE: dict[Severity, str] = {
    Severity.CRITICAL: "bold red",
    Severity.WARNING: "yellow",
    Severity.INFO: "cyan",
}
_PROBE_WORD = {"ok": "probed", "failed": "probe failed", "unreachable": "unreachable", "timed_out": "timed out"}
_PROBE_STYLE = {"ok": "", "failed": "red", "unreachable": "magenta", "timed_out": "magenta"}
_HEALTH_STYLE = {"critical": "bold red", "warning": "yellow", "healthy": "green", "unknown": "magenta"}
_DASH = Text("-", style="dim")


def _yes_no(value: bool | None, *, good: bool) -> Text:
    if value is None:
        return _DASH
    return Text("yes" if value else "no", style="green" if value is good else "red")


def probe_word(h: HostAudit) -> str:
    """Whether the host answered the probe: ``probed``, ``unreachable``, ``timed out`` or ``probe failed``."""
    return _PROBE_WORD.get(h.status.value, h.status.value.replace("_", " "))


def health_word(h: HostAudit) -> str:
    """What the probe's answer says: ``critical``, ``warning``, ``healthy``; ``unknown`` when not probed."""
    if not h.probed:
        return "unknown"
    if h.healthy:
        return "healthy"
    worst = h.worst
    if worst is Severity.WARNING:
        return "warning"
    return "critical"  # a critical finding, or NVML failed (never healthy)


def _probe_cell(h: HostAudit) -> Text:
    return Text(probe_word(h), style=_PROBE_STYLE.get(h.status.value, ""))


def _health_cell(h: HostAudit) -> Text:
    word = health_word(h)
    return Text(word, style=_HEALTH_STYLE[word])


def _driver_cell(h: HostAudit) -> Text:
    if h.facts is None:
        return _DASH
    version = hostview.driver_version(h.facts)
    if version is None:
        return Text("none", style="red")
    if version.from_nvml:
        return Text(version.version)
    # NVML did not answer: this is the installed package's version, not proof of a loaded driver.
    why = "not loaded" if h.facts.nvml.error_class == "driver_not_loaded" else "NVML down"
    return Text.assemble(version.version, (f" (pkg; {why})", "red"))


def _nvml_cell(h: HostAudit) -> Text:
    if h.facts is None:
        return _DASH
    if h.facts.nvml.ok:
        return Text("ok", style="green")
    return Text(h.facts.nvml.error_class, style="bold red")


def _gpus_cell(h: HostAudit) -> Text:
    expected = hostview.expected_gpus(h)
    if h.facts is None:
        return Text(f"-/{expected}" if expected is not None else "-", style="dim")
    ok = hostview.gpus_ok(h.facts)
    text = f"{ok}/{expected}" if expected is not None else str(ok)
    short = (expected is not None and ok < expected) or h.facts.nvml.failed
    return Text(text, style="red" if short else "")


def _temp_cell(h: HostAudit) -> Text:
    if h.facts is None:
        return _DASH
    temp = hostview.max_temperature(h.facts)
    if temp is None:
        return _DASH
    hot = any(f.id.startswith("GPU-THM-") for f in h.findings)
    return Text(f"{temp} °C", style="red" if hot else "")


def _findings_cell(h: HostAudit) -> Text:
    if not h.findings:
        return Text("-" if h.probed else "not probed", style="dim" if h.probed else "magenta")
    counts = hostview.by_severity(h.findings)
    text = Text()
    parts = [(f"{n} {sev.value}", SEVERITY_STYLE[sev]) for sev, n in counts.items() if n]
    for i, (label, style) in enumerate(parts):
        if i:
            text.append(", ")
        text.append(label, style=style)
    text.append(": ")
    worst = h.worst
    seen: list[str] = []
    for f in hostview.severity_order(h.findings):
        if f.id not in seen:
            seen.append(f.id)
    for i, fid in enumerate(seen):
        if i:
            text.append(" ")
        sev = Severity.worst(f.severity for f in h.findings if f.id == fid)
        text.append(fid, style=SEVERITY_STYLE[sev] if sev is worst and sev is not None else "")
    return text


def _kernel_cell(h: HostAudit) -> Text:
    if h.facts is None or not h.facts.system.kernel:
        return _DASH
    return Text(h.facts.system.kernel)


def fleet_table(result: AuditResult) -> Table:
    """The per-host table (also used on its own by callers that compose their own output)."""
    table = Table(title=Text(f"GPU fleet audit: {result.fleet}"), title_justify="left", expand=False)
    table.add_column("host", no_wrap=True)
    table.add_column("probe", no_wrap=True)
    table.add_column("health", no_wrap=True)
    table.add_column("kernel (booted)", no_wrap=True)
    table.add_column("held", no_wrap=True)
    table.add_column("driver")
    table.add_column("NVML", no_wrap=True)
    table.add_column("GPUs ok", justify="right", no_wrap=True)
    table.add_column("max temp", justify="right", no_wrap=True)
    table.add_column("findings")
    for h in result.hosts:
        table.add_row(
            Text(h.host),
            _probe_cell(h),
            _health_cell(h),
            _kernel_cell(h),
            _yes_no(hostview.booted_kernel_held(h.facts), good=True) if h.facts is not None else _DASH,
            _driver_cell(h),
            _nvml_cell(h),
            _gpus_cell(h),
            _temp_cell(h),
            _findings_cell(h),
        )
    return table


def _finding_block(f: Finding) -> Text:
    text = Text("  ")
    text.append(f.id, style=SEVERITY_STYLE[f.severity])
    text.append(f" [{f.severity.value}, {f.scenario.value}] ")
    text.append(f.summary)
    for line in f.evidence:
        for part in line.splitlines() or [""]:
            text.append("\n      ")
            text.append(part, style="dim")
    text.append("\n    remedy: ", style="bold")
    text.append(f.remedy)
    return text


def details(result: AuditResult) -> Group:
    """Per host: each finding (worst first) with its evidence lines and remedy; unprobed hosts with the reason."""
    blocks: list[Text] = []
    for h in result.hosts:
        if not h.probed:
            line = Text()
            line.append(h.host, style="bold")
            line.append(f": not probed ({h.status.value})", style="magenta")
            if h.error:
                line.append(f": {h.error}")
            blocks.append(line)
            continue
        if not h.findings:
            continue
        blocks.append(Text(h.host, style="bold"))
        blocks.extend(_finding_block(f) for f in hostview.severity_order(h.findings))
    if not blocks:
        blocks.append(Text("no findings", style="green"))
    return Group(Text("details", style="bold underline"), *blocks)


def exit_code_meaning(
    result: AuditResult, fail_on: Severity = Severity.CRITICAL, unreachable_exit: int | None = None
) -> str:
    """One line: the exit code ``AuditResult.exit_code`` gives for these options, and why."""
    from remediation.core.exitcodes import ExitCode

    unreachable = ExitCode.UNREACHABLE if unreachable_exit is None else unreachable_exit
    code = result.exit_code(fail_on, unreachable)
    failing = sum(1 for f in result.findings if f.severity.rank >= fail_on.rank)
    if failing:
        return f"exit {code}: {failing} finding(s) at or above {fail_on.value}"
    if result.not_probed:
        return (
            f"exit {code}: no finding at or above {fail_on.value}, but {len(result.not_probed)} host(s) could not "
            "be probed (never counted as healthy)"
        )
    return f"exit {code}: every host probed, no finding at or above {fail_on.value}"


def summary_line(result: AuditResult) -> Text:
    probed = sum(1 for h in result.hosts if h.probed)
    not_probed = len(result.hosts) - probed
    counts = hostview.by_severity(result.findings)
    text = Text(f"{len(result.hosts)} host(s): {probed} probed, {not_probed} not probed")
    if not_probed:
        text.append(f" ({', '.join(result.not_probed)})", style="magenta")
    healthy = sum(1 for h in result.hosts if h.healthy)
    text.append(f", {healthy} healthy; findings: ")
    for i, (sev, n) in enumerate(counts.items()):
        if i:
            text.append(", ")
        text.append(f"{n} {sev.value}", style=SEVERITY_STYLE[sev] if n else "")
    text.append(f"; {result.seconds:.1f} s")
    return text


def render_table(
    result: AuditResult,
    console: Console,
    *,
    fail_on: Severity = Severity.CRITICAL,
    unreachable_exit: int | None = None,
) -> None:
    """Print the fleet table, the details per finding, the summary line and what the exit code will be."""
    line = exit_code_meaning(result, fail_on, unreachable_exit)
    console.print(fleet_table(result))
    console.print(details(result))
    console.print(summary_line(result))
    console.print(Text(line, style="green" if line.startswith("exit 0:") else "bold"))
