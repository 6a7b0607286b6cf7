"""The VM cordon marker: a host an operator has taken out of service is left alone by every rolling change.

A person writes any text to the marker; ``invoke remediate`` writes one line of JSON naming itself as the owner
(:data:`REMEDIATE_OWNER`) and its run (:func:`marker_record`). A rolling change run *by* that remediate run (the
driver restore on a host the loop cordoned for it) passes its run id as ``own_run`` and does not take the loop's own
cordon for someone else's; any other marker keeps the host out of every change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from remediation.host.audit import AuditOptions
    from remediation.transport.inventory import Host

__all__ = ["CORDON_MARKER", "REMEDIATE_OWNER", "cordon_markers", "foreign_marker", "marker_record"]

#: Present on a host: it is cordoned; its first line says who and why (shown in the plan).
CORDON_MARKER = "/etc/gpufleet/cordoned"
#: The ``owner`` of a marker ``invoke remediate`` wrote (and alone may remove).
REMEDIATE_OWNER = "gpufleet-remediate"
_SEEN = "GPUFLEET-CORDONED"


def marker_record(text: str | None) -> dict[str, Any] | None:
    """The marker's JSON record (a JSON object with a string ``owner`` on its first line), None for free text."""
    if not text or not text.strip():
        return None
    try:
        doc = json.loads(text.strip().splitlines()[0])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("owner"), str) else None


def foreign_marker(text: str | None, own_run: str | None) -> str | None:
    """The marker's text when it cordons the host for this change, None when it is the marker of remediate run
    ``own_run`` (the run this change runs for). The controller and the roles' re-check use this one rule."""
    record = marker_record(text)
    if own_run and record is not None and record.get("owner") == REMEDIATE_OWNER and record.get("run_id") == own_run:
        return None
    return text


def cordon_markers(hosts: Sequence[Host], options: AuditOptions, *, own_run: str | None = None
                   ) -> dict[str, str | None]:
    """host -> the marker's first 400 bytes when the host is cordoned, None when it is not (or did not answer).
    ``own_run``: the id of the remediate run this change runs for: that run's own marker counts as no cordon."""
    from remediation.transport.fanout import Status, fan_out

    cmd = f"if [ -e {CORDON_MARKER} ]; then echo {_SEEN}; head -c 400 {CORDON_MARKER}; fi"
    runs = fan_out(hosts, cmd, concurrency=options.concurrency, connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, str | None] = {}
    for name, run in runs.runs.items():
        if run.status is Status.OK and run.stdout.startswith(_SEEN):
            out[name] = run.stdout.split("\n", 1)[1] if "\n" in run.stdout else ""
            out[name] = foreign_marker(out[name], own_run)
        else:
            out[name] = None
    return out
