"""The VM cordon marker: a host an operator has taken out of service is left alone by every rolling change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remediation.host.audit import AuditOptions
    from remediation.transport.inventory import Host

__all__ = ["CORDON_MARKER", "cordon_markers"]

#: Present on a host: it is cordoned; its first line says who and why (shown in the plan).
CORDON_MARKER = "/etc/gpufleet/cordoned"
_SEEN = "GPUFLEET-CORDONED"


def cordon_markers(hosts: Sequence[Host], options: AuditOptions) -> dict[str, str | None]:
    """host -> the marker's first 400 bytes when the host is cordoned, None when it is not (or did not answer)."""
    from remediation.transport.fanout import Status, fan_out

    cmd = f"if [ -e {CORDON_MARKER} ]; then echo {_SEEN}; head -c 400 {CORDON_MARKER}; fi"
    runs = fan_out(hosts, cmd, concurrency=options.concurrency, connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, str | None] = {}
    for name, run in runs.runs.items():
        if run.status is Status.OK and run.stdout.startswith(_SEEN):
            out[name] = run.stdout.split("\n", 1)[1] if "\n" in run.stdout else ""
        else:
            out[name] = None
    return out
