"""What the tasks of rolling changes share (``driver-restore``, ``kernel-update``): their options from the settings
and the flags, and one run (plan, confirmation, the engine, the result, the incident report)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from invoke import Exit

from commands import ask, audit_options, fleet_hosts, require_confirmation, settings, under_project

#: Help for the flags every rolling change takes (each task adds its own and may say more).
ROLLOUT_HELP = {
    "yes": "apply without asking",
    "dry_run": "alias of --check",
    "max_failures": "stop after this many failed hosts (default 1); later hosts are not touched",
    "reboot_timeout": "seconds a rebooting host has to come back (default 600)",
}


def rollout_options(c: Any, change: str, options_type: type[Any], settings_type: type[Any], error: type[Exception],
                    hint: str, own: Callable[[Callable[[str], Any]], dict[str, Any]], **flags: Any) -> Any:
    """``options_type`` (a :class:`~remediation.rollout.engine.RolloutOptions`) from the ``change`` section of the
    settings and the flags (a flag given wins); ``own(pick)``: the change's own options. A value of the wrong type is
    ``error`` naming the setting and ``hint``."""
    from remediation.config import AuditSettings

    section = change.replace("-", "_")
    cfg = settings(c, settings_type, section)
    history_dir = settings(c, AuditSettings, "audit").history_dir

    def pick(name: str) -> Any:
        value = flags.get(name)
        return getattr(cfg, name) if value is None else value

    try:
        return options_type(
            allow_reboot=bool(flags.get("allow_reboot")),
            dry_run=bool(flags.get("dry_run")),
            batch=int(pick("batch")),
            max_failures=int(pick("max_failures")),
            force=bool(flags.get("force")),
            reboot_timeout=int(pick("reboot_timeout")),
            apt_lock_timeout=cfg.apt_lock_timeout,
            state_dir=under_project(c, cfg.state_dir or history_dir),
            lock_ttl_s=cfg.lock_ttl_s,
            playbook_timeout=cfg.playbook_timeout,
            module_source=str(pick("module_source")),
            **own(pick),
        ).validate()
    except ValueError as exc:
        raise error(f"bad {change} setting: {exc}; {hint}") from None


def run_rollout_task(c: Any, change: str, run: Callable[..., Any], options: Any, *, fleet: str,
                     inventory: str | None, limit: str | None, check: bool, yes: bool, question: str,
                     show_plan: Callable[[Any, Any], None], show_result: Callable[[Any, Any], None],
                     render_report: Callable[[Any], str], report: str | None) -> NoReturn:
    """Run ``change`` on the fleet through its entry ``run``: the plan is shown, the operator confirms (``question``
    with the hosts that change, unless ``--yes``), the whole fleet carries the run's lease whatever ``--limit`` says,
    and a run that changed anything leaves an incident report. Exits with the run's exit code."""
    from remediation.report.console import console
    from remediation.transport.inventory import load

    hosts, path, group = fleet_hosts(c, fleet, inventory, limit)
    require_confirmation(f"{change} changes hosts", check=check, yes=yes, preview="to see the plan")

    def confirm(plan: Any) -> bool:
        if yes:
            return True
        names = [p.host for p in plan if p.changes_host]
        return ask(f"{question} on {len(names)} host(s): {', '.join(names)}")

    result = run(hosts, path, audit_options(c), options, fleet=fleet, confirm=confirm,
                 show_plan=lambda plan: show_plan(console, plan), lease_hosts=load(path, group))
    show_result(console, result)
    if result.stopped is None or not result.stopped.changed_nothing:
        out = Path(report) if report else options.state_dir / f"{change}-{fleet}-{result.run_id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_report(result))
        console.print(f"incident report: {out}", markup=False)
    raise Exit(code=result.exit_code)
