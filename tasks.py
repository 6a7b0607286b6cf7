"""Invoke entry points: thin tasks over the ``remediation`` library and the ``lab``.

Each task parses its flags, calls one library function, renders the result and exits with a documented code.
Errors of the library (``remediation.errors.RemediationError``) become one line on stderr and exit 2 here,
at the edge, and nowhere else. Heavy imports happen inside the tasks, so ``invoke --list`` stays instant.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke import Collection, Exit, task

ROOT = Path(__file__).resolve().parent
F = TypeVar("F", bound=Callable[..., Any])
# Help for the flags every fleet task takes.
FLEET_HELP = {
    "fleet": "fleet name from invoke.yaml (fleets:), default gpu",
    "inventory": "Ansible inventory to use instead of the fleet's",
    "limit": "comma-separated host names or glob patterns",
}


def edge(func: F) -> F:
    """Turn the library's errors into one line and an exit code (2 unless the error says otherwise)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from remediation.errors import RemediationError

        try:
            return func(*args, **kwargs)
        except RemediationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def _lab(c: Any) -> Any:
    from lab.config import LabConfig
    from lab.control import Lab

    return Lab(LabConfig.from_mapping(c.config.get("lab", {}), root=ROOT))


# -- lab ------------------------------------------------------------------------------------------------------
@task(help={"hosts": "number of hosts, gpu-1 .. gpu-N (1-200)"})
@edge
def up(c, hosts=3):  # type: ignore[no-untyped-def]
    """Start the simulated GPU fleet (builds and caches the base image on first use)."""
    from remediation.report.console import print_lab_up

    result = _lab(c).up(int(hosts))
    print_lab_up(result)


@task(help={"purge": "also delete the hosts' disks, keys and the lab inventory (the base cache stays)"})
@edge
def down(c, purge=False):  # type: ignore[no-untyped-def]
    """Stop every lab host and the supervisor; no process or mount is left behind."""
    stopped = _lab(c).down(purge=purge)
    print(f"stopped {len(stopped)} host(s)" + (": " + ", ".join(stopped) if stopped else ""))


@task(name="status")
@edge
def lab_status(c):  # type: ignore[no-untyped-def]
    """Show each lab host: state, SSH, booted kernel, boot id, faults."""
    from remediation.report.console import print_lab_status

    print_lab_status(_lab(c).status())


@task(help={"host": "lab host to reboot, e.g. gpu-2", "no_wait": "return without waiting for SSH to come back"})
@edge
def reboot(c, host, no_wait=False):  # type: ignore[no-untyped-def]
    """Reboot one lab host (only that host: it is a namespace, never the machine)."""
    boot_id = _lab(c).reboot(host, wait=not no_wait)
    print(f"{host} rebooted" + (f" (boot id {boot_id})" if boot_id else ""))


@task(
    help={
        "host": "lab host, e.g. gpu-2",
        "fault": "one of: "
        + ", ".join(
            [
                "kernel-upgrade",
                "driver-mismatch",
                "thermal",
                "ecc",
                "xid-79",
                "gpu-missing",
                "memory-full",
                "unreachable",
                "apt-lock",
                "hang",
            ]
        ),
    }
)
@edge
def fault(c, host, fault):  # type: ignore[no-untyped-def]
    """Give a lab host a fault with the symptoms a real GPU VM shows."""
    from lab.faults import inject

    result = inject(_lab(c), host, fault)
    print(f"{result.host}: {result.fault}: {result.detail}")


@task(help={"host": "lab host to return to its freshly built state"})
@edge
def clear(c, host):  # type: ignore[no-untyped-def]
    """Undo every fault on a lab host (the host is rebuilt from the base; its address and keys stay)."""
    _lab(c).clear(host)
    print(f"{host}: cleared")


lab_ns = Collection("lab", up, down, lab_status, reboot, fault, clear)


# -- audit and diagnose ----------------------------------------------------------------------------------------
def _fleet_hosts(c: Any, fleet: str, inventory: str | None, limit: str | None) -> tuple[list[Any], str, str]:
    from remediation.errors import InventoryError
    from remediation.inventory import load

    fleets = c.config.get("fleets", {})
    if fleet not in fleets and inventory is None:
        raise InventoryError(
            f"fleet {fleet!r} is not configured (fleets: {', '.join(fleets) or 'none'}); "
            "add it under fleets: in invoke.yaml or pass --inventory"
        )
    spec = fleets.get(fleet, {})
    path = inventory or str(ROOT / spec.get("inventory", "inventories/lab/hosts.yml"))
    group = spec.get("group", fleet)
    return load(path, group, limit), path, group


def _audit_options(c: Any, concurrency: Any, timeout: Any) -> Any:
    from remediation.audit import AuditOptions
    from remediation.errors import InventoryError

    cfg = c.config.get("audit", {})
    try:
        return AuditOptions(
            concurrency=int(concurrency or cfg.get("concurrency", 32)),
            connect_timeout=float(cfg.get("connect_timeout", 10)),
            timeout=float(timeout or cfg.get("timeout", 60)),
            nvml_timeout=float(cfg.get("nvml_timeout", 10)),
            temp_alert_c=int(cfg.get("temp_alert_c", 78)),
            memory_full_pct=float(cfg.get("memory_full_pct", 95)),
            expected_driver_version=cfg.get("expected_driver_version"),
        )
    except (TypeError, ValueError) as exc:
        raise InventoryError(f"bad audit setting: {exc}; --concurrency and --timeout take numbers") from None


@task(
    name="run",
    default=True,
    help={
        **FLEET_HELP,
        "format": "table | json | junit | prom | md",
        "out": "write the report to this file instead of stdout",
        "fail_on": "warning | critical: exit 1 when a finding is at or above it (default from config: critical)",
        "concurrency": "hosts probed at once",
        "timeout": "seconds for the whole probe on one host",
        "history": "compare with the previous run and keep this one (directory from audit.history_dir)",
    },
)
@edge
def audit(
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    format="table",
    out=None,
    fail_on=None,  # type: ignore[no-untyped-def]
    concurrency=None,
    timeout=None,
    history=False,
):
    """Audit a GPU fleet with NVML on every host: findings, root causes, reports. Read-only.

    Exit codes: 0 clean; 1 a finding at or above --fail-on; 2 bad input; 3 a host could not be probed
    (audit.unreachable_exit) and no finding reached --fail-on.
    """
    from remediation.audit import run_audit, save
    from remediation.errors import InventoryError
    from remediation.findings import Severity
    from remediation.report.console import console, progress_bar
    from remediation.report.formats import FORMATS, render

    if format not in FORMATS:
        raise InventoryError(f"--format {format!r} is not one of {', '.join(FORMATS)}")
    cfg = c.config.get("audit", {})
    level = fail_on or cfg.get("fail_on", "critical")
    if level not in ("warning", "critical"):
        raise InventoryError(f"--fail-on {level!r} must be warning or critical")
    hosts, path, _group = _fleet_hosts(c, fleet, inventory, limit)
    options = _audit_options(c, concurrency, timeout)
    with progress_bar(len(hosts), enabled=format == "table" and out is None) as tick:
        result = run_audit(hosts, options, fleet=fleet, inventory=path, progress=tick)
    unreachable_exit = int(cfg.get("unreachable_exit", 3))
    text = render(
        result, format, console=None if out else console, fail_on=Severity(level), unreachable_exit=unreachable_exit
    )
    if text is not None:
        if out:
            Path(out).write_text(text)
            print(f"wrote {format} report to {out}", file=sys.stderr)
        else:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if history:
        from remediation.history import compare, load_previous, render_comparison

        directory = ROOT / cfg.get("history_dir", ".audit")
        comparison = compare(load_previous(directory, fleet), result)
        render_comparison(comparison, console)
        save(result, directory)
    raise Exit(code=result.exit_code(Severity(level), unreachable_exit))


@task(
    help={
        "file": "file with the text to triage (nvidia-smi output, kernel log, apt history, dkms output); - for stdin",
        "format": "text | json",
        "kind": "force the kind instead of detecting it",
    },
)
@edge
def diagnose(c, file="-", format="text", kind=None):  # type: ignore[no-untyped-def]
    """Paste error text from the field; get the finding and its runbook. Exit 1 when something is found."""
    import json

    from remediation.diagnose import diagnose as run
    from remediation.diagnose import render_text
    from remediation.errors import ParseError

    if format not in ("text", "json"):
        raise ParseError(f"--format {format!r} must be text or json")
    if file == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        try:
            text, source = Path(file).read_text(errors="replace"), file
        except OSError as exc:
            raise ParseError(f"cannot read {file}: {exc.strerror}; pass a readable file or - for stdin") from None
    result = run(text, kind=kind, source=source)
    if format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_text(result))
    raise Exit(code=1 if result.findings else 0)


# -- harden -----------------------------------------------------------------------------------------------------
@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        "check": "show the per-host diff and stop: nothing changes on any host",
        "diff": "show diffs while applying",
        "yes": "apply without asking",
        "batch": "hosts per batch (number or percentage, playbook serial)",
        "max_fail_percentage": "stop the run when more than this share of a batch fails",
    },
)
@edge
def harden(
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    check=False,
    diff=False,
    yes=False,
    batch="25%",  # type: ignore[no-untyped-def]
    max_fail_percentage=10,
):
    """Stop kernel updates from breaking GPU hosts: blacklist, kernel hold; converge with audit before and after.

    Exit codes: 0 converged (or --check / not confirmed); 1 a host is not hardened; 2 bad input.
    """
    from remediation.errors import UsageError
    from remediation.harden import harden as run
    from remediation.report.console import console
    from remediation.report.converge import print_harden_plan, print_harden_result

    if not (check or yes or sys.stdin.isatty()):
        raise UsageError(
            "harden changes hosts and there is no terminal to confirm on: pass --yes, or --check to preview"
        )
    hosts, path, _group = _fleet_hosts(c, fleet, inventory, limit)
    options = _audit_options(c, None, None)

    def confirm(plan, preview):  # type: ignore[no-untyped-def]
        if yes:
            return True
        answer = input(f"apply to {len(plan.to_change)} host(s): {', '.join(plan.to_change)}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    result = run(
        hosts,
        path,
        options,
        check=check,
        diff=diff,
        batch=batch,
        max_fail_percentage=int(max_fail_percentage),
        confirm=None if (check or yes) else confirm,  # --yes: no preview run, straight to apply
        show_plan=lambda plan, preview: print_harden_plan(console, plan, preview),
    )
    print_harden_result(console, result)
    raise Exit(code=result.exit_code)


# -- driver restore -------------------------------------------------------------------------------------------
@task(
    default=True,
    name="run",
    help={
        **FLEET_HELP,
        "method": "auto | apt | azure-extension (auto: inventory var driver_restore_method)",
        "allow_reboot": "reboot hosts whose restore needs it (never without this flag)",
        "dry_run": "print the plan and stop: nothing changes",
        "yes": "apply without asking",
        "batch": "hosts per batch (default 1); each batch must pass the NVML gate before the next",
        "max_failures": "stop after this many failed hosts (default 1); later hosts are not touched",
        "force": "restore even on hosts with running GPU compute processes",
        "prefer": "rebuild | previous-kernel: for a booted kernel without module",
        "reboot_timeout": "seconds a rebooting host has to come back (default 600)",
        "report": "write the incident report here (default .audit/driver-restore-<fleet>-<run>.md)",
    },
)
@edge
def driver_restore(  # type: ignore[no-untyped-def]
    c,
    fleet="gpu",
    inventory=None,
    limit=None,
    method=None,
    allow_reboot=False,
    dry_run=False,
    yes=False,
    batch=None,
    max_failures=None,
    force=False,
    prefer=None,
    reboot_timeout=None,
    report=None,
):
    """Restore the NVIDIA driver after a kernel update: rolling, NVML-gated, undo on failure.

    Exit codes: 0 every host restored or healthy (or --dry-run); 1 a host not restored; 2 bad input; 4 lock held.
    """
    from remediation.restore.cli import driver_restore_task

    code = driver_restore_task(
        c,
        root=ROOT,
        fleet=fleet,
        inventory=inventory,
        limit=limit,
        method=method,
        allow_reboot=allow_reboot,
        dry_run=dry_run,
        yes=yes,
        batch=batch,
        max_failures=max_failures,
        force=force,
        prefer=prefer,
        reboot_timeout=reboot_timeout,
        report=report,
    )
    raise Exit(code=code)


# -- demo -----------------------------------------------------------------------------------------------------
@task(help={"hosts": "lab size for the demo"})
@edge
def demo(c, hosts=3):  # type: ignore[no-untyped-def]
    """Game day on the lab: bring the fleet up, break gpu-2 the S1 way, and show what on-call sees."""
    from lab.demo import run_demo

    raise Exit(code=run_demo(_lab(c), int(hosts), ROOT))


audit_ns = Collection("audit", audit)
harden_ns = Collection("harden", harden)
driver_restore_ns = Collection("driver-restore", driver_restore)

ns = Collection(demo, diagnose)
ns.add_collection(audit_ns)
ns.add_collection(harden_ns)
ns.add_collection(driver_restore_ns)
ns.add_collection(lab_ns)
