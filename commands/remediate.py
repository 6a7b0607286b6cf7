"""``invoke remediate``: the closed loop's plan (``--check``) and the circuit breaker's reset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from invoke import Collection, Exit, task

from commands import (
    FLEET_HELP,
    ask,
    audit_options,
    config_source,
    edge,
    fleet_hosts,
    format_help,
    formats,
    require_confirmation,
    settings,
    under_project,
    with_collections,
)
from remediation.core.exitcodes import ExitCode


def _settings(c: Any) -> tuple[Any, Path]:
    """The ``remediate:`` settings and the state directory (``remediate.state_dir``, else ``audit.history_dir``)."""
    from remediation.config import AuditSettings, RemediateSettings

    cfg = settings(c, RemediateSettings, "remediate")
    return cfg, under_project(c, cfg.state_dir or settings(c, AuditSettings, "audit").history_dir)


@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        "check": "audit, then print the plan (decision, why, action, budget per host and finding); nothing changes",
        "dry_run": "alias of --check",
        "format": format_help("table", "json"),
        "allow_reboot": "plan (and, acting, run) reboots outside the policy's maintenance windows",
        "yes": "act without asking",
    },
)
@edge
@formats("table", "json")
@with_collections
def remediate(  # type: ignore[no-untyped-def]
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    check=False,
    dry_run=False,
    format="table",
    allow_reboot=False,
    yes=False,
):
    """The closed loop: per finding observe, propose, escalate or fix within the guards (--check: the plan only).

    Exit codes: 0 the plan was shown (--check), or everything fixed / nothing to do; 1 something escalated, failed
    or blocked; 2 bad input (a policy, a setting, the state file); 4 another remediate run holds the state file.
    """
    from remediation.core.errors import UsageError
    from remediation.remediate.api import check as plan_run
    from remediation.remediate.api import policy_from
    from remediation.transport.inventory import load

    if format not in ("table", "json"):
        raise UsageError(f"--format {format!r} must be table or json")
    cfg, state_dir = _settings(c)
    policy_from(cfg, fleet, config_source(c, "remediate"))  # a bad policy is refused even without --check
    check = bool(check or dry_run)
    require_confirmation("remediate changes hosts", check=check, yes=yes, preview="to see the plan")
    options = audit_options(c)
    hosts, path, group = fleet_hosts(c, fleet, inventory, limit)
    whole = len(load(path, group)) if limit else len(hosts)  # the cap and the breaker's share are of the fleet
    if not check:
        _act(c, hosts, path, options, cfg, fleet=fleet, state_dir=state_dir, allow_reboot=bool(allow_reboot),
             whole=whole, yes=bool(yes), format=format)
    plan, _audit = plan_run(hosts, path, options, cfg, fleet=fleet, state_dir=state_dir,
                            allow_reboot=bool(allow_reboot), source=config_source(c, "remediate"), fleet_size=whole)
    if format == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        from remediation.report.console import console
        from remediation.report.remediate_view import print_plan

        print_plan(console, plan)
    raise Exit(code=ExitCode.OK)


def _act(c: Any, hosts: Any, path: Any, options: Any, cfg: Any, *, fleet: str, state_dir: Path, allow_reboot: bool,
         whole: int, yes: bool, format: str) -> None:
    """Act on the plan (confirmation unless --yes), print the outcomes, exit with the run's code."""
    from commands.driver import restore_options
    from remediation.remediate.api import act
    from remediation.report.console import console
    from remediation.report.remediate_view import print_plan, print_result

    def confirm(plan: Any) -> bool:
        print_plan(console, plan, acting=True)
        auto = sorted(h.host for h in plan.hosts if h.auto)
        return ask(f"act on {len(auto)} host(s): {', '.join(auto)}")

    result = act(hosts, path, options, cfg, fleet=fleet, state_dir=state_dir,
                 restore_options=restore_options(c, allow_reboot=allow_reboot), allow_reboot=allow_reboot,
                 source=config_source(c, "remediate"), fleet_size=whole, confirm=None if yes else confirm)
    if format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_result(console, result)
    raise Exit(code=result.exit_code)


@task(
    help={
        "fleet": FLEET_HELP["fleet"],
        "yes": "reset without asking",
        "check": "say what the reset would clear; change nothing",
    },
)
@edge
def reset(c, fleet="gpu", yes=False, check=False):  # type: ignore[no-untyped-def]
    """Reset the circuit breaker of a fleet and discard the findings recorded before it (the attempt budget stays).

    Exit codes: 0 reset (or nothing to reset, --check, not confirmed); 2 bad input (the state file); 4 another
    remediate run holds the state file.
    """
    from remediation.config import fleets_from_mapping
    from remediation.core.errors import UsageError
    from remediation.remediate.api import reset as run_reset
    from remediation.report.console import console
    from remediation.report.remediate_view import print_reset

    fleets = fleets_from_mapping(c.config.get("fleets", {}), config_source(c, "fleets"))
    if fleet not in fleets:
        raise UsageError(f"fleet {fleet!r} is not configured (fleets: {', '.join(fleets) or 'none'}); "
                         "name a fleet of invoke.yaml's fleets:")
    require_confirmation("remediate.reset clears the circuit breaker", check=check, yes=yes,
                         preview="to see what it clears")
    _cfg, state_dir = _settings(c)
    preview = run_reset(state_dir, fleet, apply=False)
    if check or not preview.existed:
        print_reset(console, preview, applied=False)
        raise Exit(code=ExitCode.OK)
    if not yes:
        print_reset(console, preview, applied=False)
        if not ask(f"reset the circuit breaker of fleet {fleet}"):
            console.print("not confirmed; nothing was changed")
            raise Exit(code=ExitCode.OK)
    print_reset(console, run_reset(state_dir, fleet), applied=True)
    raise Exit(code=ExitCode.OK)


ns: Any = Collection("remediate", remediate, reset)
