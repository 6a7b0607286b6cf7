"""The loop's runs as the tasks call them: ``--check`` (audit, then plan; nothing changes, the state is only read)
and the breaker's reset. Acting on the plan is not built yet."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remediation.remediate.guards import Breaker, Budget, Guards, InFlightCap
from remediation.remediate.plan import Plan, inputs_from_audit, make_plan
from remediation.remediate.policy import FleetPolicy, parse_policy
from remediation.remediate.state import RemediateState, load, locked, save, state_path

if TYPE_CHECKING:
    from remediation.config import RemediateSettings
    from remediation.host.audit import AuditOptions, AuditResult
    from remediation.transport.inventory import Host

__all__ = ["ResetResult", "check", "guards_from", "policy_from", "reset"]


def guards_from(cfg: RemediateSettings) -> Guards:
    """The fleet guards the ``remediate:`` settings describe."""
    return Guards(
        in_flight=InFlightCap(cfg.max_in_flight, cfg.max_in_flight_pct),
        breaker=Breaker(cfg.breaker_pct, cfg.breaker_window_s, cfg.breaker_min_hosts),
        budget=Budget(cfg.attempts, cfg.attempts_window_h * 3600.0),
        finding_ttl_s=cfg.finding_ttl_s,
    )


def policy_from(cfg: RemediateSettings, fleet: str, source: str = "invoke.yaml") -> FleetPolicy:
    """``remediate.policy`` for ``fleet`` (``source``: the config file that set it, for messages)."""
    return parse_policy(cfg.policy, fleet, source)


def check(
    hosts: Sequence[Host],
    inventory: str,
    options: AuditOptions,
    cfg: RemediateSettings,
    *,
    fleet: str,
    state_dir: Path,
    allow_reboot: bool = False,
    source: str = "invoke.yaml",
    now: _dt.datetime | None = None,
    audit: Callable[..., AuditResult] | None = None,
    fleet_size: int | None = None,
) -> tuple[Plan, AuditResult]:
    """Audit ``hosts`` and plan: policy and state are read first (a bad one stops before any host is probed); the
    state file is read, never written. ``fleet_size``: the whole fleet's, when ``hosts`` are a part (``--limit``)."""
    policy = policy_from(cfg, fleet, source)
    guards = guards_from(cfg)
    state = load(state_path(state_dir, fleet), fleet)
    if audit is None:
        from remediation.host.audit import run_audit

        audit = run_audit
    result = audit(hosts, options, fleet=fleet, inventory=inventory)
    when = now or _dt.datetime.now(_dt.UTC)
    plan = make_plan(inputs_from_audit(result), policy, state, when, guards, allow_reboot, fleet_size)
    return plan, result


@dataclass(frozen=True)
class ResetResult:
    path: Path
    before: RemediateState
    after: RemediateState
    existed: bool

    def to_dict(self) -> dict[str, Any]:
        trip = self.before.breaker
        return {
            "state": str(self.path),
            "breaker_was": None if trip is None else {"at": trip.at.isoformat(), "why": trip.why},
            "findings_discarded": len(self.before.seen),
            "observations_discarded": len(self.before.observations),
            "attempts_kept": len(self.after.attempts),
        }


def reset(state_dir: Path, fleet: str, *, apply: bool = True) -> ResetResult:
    """Clear the breaker of ``fleet`` and discard the findings and observations recorded before it (the attempts
    stay); ``apply`` False only says what would go. Under the state's lock."""
    path = state_path(state_dir, fleet)
    with locked(path):
        existed = path.exists()
        before = load(path, fleet)
        after = before.reset()
        if apply and existed:
            save(path, after)
    return ResetResult(path, before, after, existed)
