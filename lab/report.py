"""The lab's console output (``invoke lab.up``, ``invoke lab.status``), on the project's shared console."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from remediation.report.console import console

from .control import HostStatus, UpResult

__all__ = ["print_lab_status", "print_lab_up"]


def print_lab_up(result: UpResult) -> None:
    built = " (base image built and cached)" if result.base_built else ""
    console.print(
        f"lab up: {len(result.hosts)} host(s) answering SSH in {result.seconds:.1f} s{built}; "
        f"started {len(result.started)}, removed {len(result.removed)}"
    )
    console.print(f"inventory: {result.inventory}")
    console.print(f"ssh:       ssh -F {result.inventory.parent / 'ssh_config'} {result.hosts[0]}")


def print_lab_status(hosts: Sequence[HostStatus]) -> None:
    if not hosts:
        console.print("no lab hosts (run `invoke lab.up`)")
        return
    table = Table(title="lab hosts")
    for col in ("host", "address", "state", "ssh", "release", "pynvml", "kernel", "boots", "boot id", "faults"):
        table.add_column(col)
    for h in hosts:
        table.add_row(
            h.name,
            h.address,
            h.state,
            "yes" if h.ssh else "no",
            h.release,
            "yes" if h.pynvml else "none",
            h.kernel or "-",
            str(h.boots),
            (h.boot_id or "-")[:8],
            ", ".join(h.faults) or "-",
        )
    console.print(table)
