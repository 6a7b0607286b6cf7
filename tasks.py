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


@task(help={"host": "lab host, e.g. gpu-2", "fault": "one of: " + ", ".join(
    ["kernel-upgrade", "driver-mismatch", "thermal", "ecc", "xid-79", "gpu-missing", "memory-full", "unreachable",
     "apt-lock", "hang"])})
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


# -- demo -----------------------------------------------------------------------------------------------------
@task(help={"hosts": "lab size for the demo"})
@edge
def demo(c, hosts=3):  # type: ignore[no-untyped-def]
    """Game day on the lab: bring the fleet up, break gpu-2 the S1 way, and show what on-call sees."""
    from remediation.demo import run_demo

    raise Exit(code=run_demo(_lab(c), int(hosts), ROOT))


ns = Collection(demo)
ns.add_collection(lab_ns)
