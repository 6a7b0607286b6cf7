"""The audit as JSON: schema ``gpufleet.audit/1``.

This is the document ``invoke audit --format json`` prints and :func:`remediation.host.history.save` keeps for the next
run's comparison (:mod:`remediation.host.history`). It is :meth:`AuditResult.to_dict` serialised; this docstring is its
schema.

Top level (an object, keys in this order)::

    schema       "gpufleet.audit/1"; a reader checks the part before "/" and the major version after it
    fleet        the fleet (inventory group) audited, e.g. "gpu"
    inventory    the inventory source the hosts came from (path or plugin name; "" when not known)
    started_at   ISO 8601 timestamp with offset, when the audit started (UTC), e.g. "2026-12-02T08:00:00+00:00"
    seconds      wall time of the whole audit, rounded to milliseconds
    hosts        list of host objects, in inventory order; every selected host is present, probed or not

Host object::

    host         inventory name (the key everything else uses)
    status       "ok" | "failed" | "unreachable" | "timed_out": the SSH/probe run, not GPU health
                 ("ok" = the probe ran and its output parsed; "failed" = it ran but exited non-zero or its
                 output was unusable)
    error        why the host was not probed (connection error, timeout, probe stderr), or null
    seconds      the host's probe round trip, rounded to milliseconds
    healthy      true only when probed, NVML answered and no warning/critical finding; an unprobed host is
                 never healthy
    findings     list of finding objects (below), in check order; [] for an unprobed host
    facts        the probe's facts document (schema "gpufleet.facts/1", see docs/facts-schema.md) as the
                 probe wrote it, or null when the host was not probed

Finding object (``Finding.to_dict``; ``Finding.from_dict`` reads it back)::

    id           catalog ID, e.g. "GPU-DRV-001" (remediation.core.catalog: title, remedy, runbook)
    scenario     "S1".."S5" (the runbook's scenario)
    severity     "info" | "warning" | "critical"
    summary      one line
    evidence     list of strings: the fact lines, kernel log lines, apt history entries the finding rests on
    remedy       what fixes it: an Invoke task with the host filled in, a role, or a command
    host         inventory name of the host (same as the enclosing host object's "host")

Compatibility: new keys may be added in a minor version ("gpufleet.audit/1.1"); readers ignore keys they do not
know. Removing or renaming a key, or changing a value's type, bumps the major version.

Serialisation: UTF-8, 2-space indent, keys of the audit/host/finding objects in the order above, keys inside
``facts`` sorted (the probe's document order is not part of the contract), non-ASCII kept as is (``°C``), a
trailing newline. The same result always serialises to the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from remediation.host.audit import AuditResult

__all__ = ["SCHEMA", "render_json"]

SCHEMA = "gpufleet.audit/1"


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value


def render_json(result: AuditResult) -> str:
    """``result`` as a ``gpufleet.audit/1`` document (see the module docstring), ending in a newline."""
    doc = result.to_dict()
    for host in doc["hosts"]:
        if host.get("facts") is not None:
            host["facts"] = _sorted(host["facts"])
    return json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n"
