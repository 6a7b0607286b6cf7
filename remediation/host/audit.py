"""The fleet audit: probe every host in one SSH round trip, parse the facts once, run the pure checks.

``run_audit`` is what ``invoke audit`` and every mutating flow (harden, driver restore) call before and
after they change anything. A host that cannot be probed is kept in the result with its status
(``unreachable``, ``timed_out``, ``failed``) and never counted as healthy.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from remediation.core.checks import Policy, run_fleet_checks
from remediation.core.errors import ProbeError
from remediation.core.exitcodes import ExitCode
from remediation.core.facts import HostFacts, facts_from_dict
from remediation.core.findings import Finding, Severity
from remediation.hostside import bundle
from remediation.transport.fanout import FanoutResult, HostRun, Status, fan_out
from remediation.transport.inventory import Host


@dataclass(frozen=True)
class AuditOptions:
    concurrency: int | None = None  # None: chosen from the machine and the fleet (fanout.auto_concurrency)
    connect_timeout: float = 10.0
    timeout: float = 60.0  # whole probe command on one host
    nvml_timeout: float = 10.0  # NVML calls inside the probe
    temp_alert_c: int = 78
    memory_full_pct: float = 95.0
    expected_driver_version: str | None = None


@dataclass(frozen=True)
class HostAudit:
    host: str
    status: Status
    facts: HostFacts | None
    findings: tuple[Finding, ...]
    error: str | None
    seconds: float
    vars: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def probed(self) -> bool:
        return self.facts is not None

    @property
    def worst(self) -> Severity | None:
        return Severity.worst(f.severity for f in self.findings) if self.findings else None

    @property
    def healthy(self) -> bool:
        """Probed, NVML answered, and no warning or critical finding."""
        return (
            self.facts is not None
            and not self.facts.nvml.failed
            and all(f.severity is Severity.INFO for f in self.findings)
        )


@dataclass(frozen=True)
class AuditResult:
    fleet: str
    inventory: str
    started_at: _dt.datetime
    seconds: float
    hosts: tuple[HostAudit, ...]

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for h in self.hosts for f in h.findings)

    def host(self, name: str) -> HostAudit:
        """The audit of host ``name`` (KeyError when it was not audited): a dict look-up, so the views and flows
        that ask for every host of a fleet stay linear in its size."""
        return self._by_name[name]

    @functools.cached_property
    def _by_name(self) -> dict[str, HostAudit]:
        by_name: dict[str, HostAudit] = {}
        for h in self.hosts:
            by_name.setdefault(h.host, h)  # the first of a name, as the scan before it returned
        return by_name

    @property
    def not_probed(self) -> list[str]:
        return [h.host for h in self.hosts if not h.probed]

    def exit_code(self, fail_on: Severity = Severity.CRITICAL, unreachable_exit: int = ExitCode.UNREACHABLE) -> int:
        """1 when a finding is at or above ``fail_on``; else 3 (configurable) when a host could not be probed;
        else 0. Findings win: a broken GPU is the page, an unreachable host is in the report either way."""
        if any(f.severity.rank >= fail_on.rank for f in self.findings):
            return ExitCode.FINDINGS
        if self.not_probed:
            return unreachable_exit
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "gpufleet.audit/1",
            "fleet": self.fleet,
            "inventory": self.inventory,
            "started_at": self.started_at.isoformat(),
            "seconds": round(self.seconds, 3),
            "hosts": [
                {
                    "host": h.host,
                    "status": h.status.value,
                    "error": h.error,
                    "seconds": round(h.seconds, 3),
                    "healthy": h.healthy,
                    "findings": [f.to_dict() for f in h.findings],
                    "facts": dict(h.facts.raw) if h.facts is not None else None,
                }
                for h in self.hosts
            ],
        }


def probe_command(options: AuditOptions) -> str:
    # The bundle comes on stdin; -I keeps the host's user site and environment out of the probe.
    return f"python3 -I - --nvml-timeout {options.nvml_timeout:g}"


def policy_for(hosts: Sequence[Host], options: AuditOptions) -> Policy:
    expected = options.expected_driver_version
    if expected is None:
        versions = {h.expected_driver_version for h in hosts if h.expected_driver_version}
        expected = versions.pop() if len(versions) == 1 else None
    counts = {h.name: c for h in hosts if (c := h.expected_gpu_count) is not None}
    return Policy(
        expected_driver_version=expected,
        host_gpu_count=counts,
        temp_alert_c=options.temp_alert_c,
        memory_full_pct=options.memory_full_pct,
    )


#: What a corrupt probe document can raise on its way to facts: the loader's own ProbeError, json's ValueError (bad
#: JSON, an int too long), RecursionError (nesting too deep), and, as a last guard, the errors of a wrong type the
#: loader did not foresee. Any of them makes that one host's output unusable, never the run's crash.
_UNUSABLE = (ProbeError, ValueError, RecursionError, TypeError, KeyError, AttributeError, IndexError, OverflowError)
_REASON_CHARS = 300


def parse_run(run: HostRun) -> tuple[HostFacts | None, str | None]:
    """One host's probe run -> (facts, None), or (None, why not): never raises for what the host sent."""
    if run.status is not Status.OK:
        detail = run.error or (run.stderr.strip().splitlines() or [f"exit {run.exit_code}"])[-1]
        return None, detail
    try:
        return facts_from_dict(json.loads(run.stdout), host=run.host), None
    except _UNUSABLE as exc:
        reason = str(exc) if isinstance(exc, ProbeError | ValueError) else f"{type(exc).__name__}: {exc}"
        reason = " ".join(reason.split())
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 3] + "..."
        return None, f"probe output unusable: {reason}"


def run_audit(
    hosts: Sequence[Host],
    options: AuditOptions,
    *,
    fleet: str = "gpu",
    inventory: str = "",
    progress: Callable[[HostRun], None] | None = None,
) -> AuditResult:
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.monotonic()
    result: FanoutResult = fan_out(
        hosts,
        probe_command(options),
        stdin=bundle(),
        concurrency=options.concurrency,
        connect_timeout=options.connect_timeout,
        timeout=options.timeout,
        progress=progress,
    )
    return AuditResult(fleet, inventory, started, time.monotonic() - t0, audit_runs(hosts, result, options))


def audit_runs(hosts: Sequence[Host], result: FanoutResult, options: AuditOptions) -> tuple[HostAudit, ...]:
    """The probe runs of ``hosts`` -> one :class:`HostAudit` each: facts, the fleet checks' findings, or the error.

    A host whose output cannot be read is ``failed`` with its reason; the other hosts are audited as if it were
    not there.
    """
    facts: dict[str, HostFacts] = {}
    errors: dict[str, str | None] = {}
    statuses: dict[str, Status] = {}
    for name, run in result.runs.items():
        parsed, error = parse_run(run)
        statuses[name] = run.status if parsed is not None or run.status is not Status.OK else Status.FAILED
        errors[name] = error
        if parsed is not None:
            facts[name] = parsed
    findings = run_fleet_checks(facts, policy_for(hosts, options))
    return tuple(
        HostAudit(
            host=h.name,
            status=statuses[h.name],
            facts=facts.get(h.name),
            findings=findings.get(h.name, ()),
            error=errors[h.name],
            seconds=result.runs[h.name].seconds,
            vars=dict(h.vars),
        )
        for h in hosts
    )
