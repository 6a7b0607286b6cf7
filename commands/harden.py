"""``invoke harden``: S1 prevention (blacklist, kernel hold) as a converge flow."""

from __future__ import annotations

from typing import Any

from invoke import Collection, Exit, task

from commands import (
    CHECK_HELP,
    FLEET_HELP,
    ask,
    audit_options,
    edge,
    fleet_hosts,
    require_confirmation,
    with_collections,
)


@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        "check": CHECK_HELP,
        "dry_run": "alias of --check",
        "diff": "show diffs while applying",
        "yes": "apply without asking",
        "batch": "hosts per batch (number or percentage, playbook serial)",
        "max_fail_percentage": "stop the run when more than this share of a batch fails",
    },
)
@edge
@with_collections
def harden(  # type: ignore[no-untyped-def]
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    check=False,
    dry_run=False,
    diff=False,
    yes=False,
    batch="25%",
    max_fail_percentage=10,
):
    """Stop kernel updates from breaking GPU hosts: blacklist, kernel hold; converge with audit before and after.

    Exit codes: 0 converged (or --check / not confirmed); 1 a host is not hardened; 2 bad input.
    """
    from remediation.core.errors import UsageError
    from remediation.host.api import harden as run
    from remediation.report.console import console
    from remediation.report.converge import print_harden_plan, print_harden_result

    check = bool(check or dry_run)
    require_confirmation("harden changes hosts", check=check, yes=yes, preview="to preview")
    hosts, path, _group = fleet_hosts(c, fleet, inventory, limit)
    options = audit_options(c)

    def confirm(plan, preview):  # type: ignore[no-untyped-def]
        return ask(f"apply to {len(plan.to_change)} host(s): {', '.join(plan.to_change)}")

    try:
        max_fail = int(max_fail_percentage)
    except ValueError:
        raise UsageError(f"--max-fail-percentage {max_fail_percentage!r} must be a number from 0 to 100") from None
    result = run(
        hosts,
        path,
        options,
        check=check,
        diff=diff,
        batch=batch,
        max_fail_percentage=max_fail,
        confirm=None if (check or yes) else confirm,  # --yes: no preview run, straight to apply
        show_plan=lambda plan, preview: print_harden_plan(console, plan, preview),
    )
    print_harden_result(console, result)
    raise Exit(code=result.exit_code)


ns: Any = Collection("harden", harden)
