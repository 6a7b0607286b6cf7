"""Cordon ownership: the loop cordons a host before it acts and uncordons it after a passed gate, and never undoes a
cordon it did not set.

Two kinds of cordon, one rule:

- **VM hosts**: the marker file :data:`~remediation.rollout.cordon.CORDON_MARKER` on the host. The loop writes one
  line of JSON (:func:`marker`: ``owner`` ``gpufleet-remediate``, ``run_id``, ``reason``, ``findings``, ``at``,
  ``controller``) through the host program :mod:`remediation.hostside.hostcordon` (sent as data on its stdin,
  never as shell text), which creates the marker only when none is there and removes it only when it names this
  owner and run. The inventory's ``gpufleet_cordoned: true`` is a cordon too (a person's).
- **AKS nodes** (a host whose inventory names its node, ``k8s_node_name``): ``spec.unschedulable`` with the label
  and annotations :data:`BY` / :data:`REASON` / :data:`AT` / :data:`RUN` (who, why, when: what NVSentinel records),
  set and removed by a JSON merge patch (:func:`cordon_patch`, :func:`uncordon_patch`) that carries the node's
  ``resourceVersion``: the API server refuses it (409) when the node changed since it was read.

What a cordon found before acting means (:func:`vm_cordon`, :func:`node_cordon` -> :class:`Cordon`):

- none -> the loop sets its own, acts, and removes it after the gate passed (or when the action did not start);
  after a failed gate or a broken action the host stays cordoned: a person looks at it;
- someone else's (free text in the marker, another owner, a node unschedulable without our annotation) ->
  **foreign**: never removed; the host is blocked: ``cordoned by <owner>: <why>``;
- the loop's own from an earlier run -> left there by a failed gate or an interrupted run: blocked as well, until a
  person removes it (the loop removes only what this run set).
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from remediation.rollout.cordon import CORDON_MARKER, REMEDIATE_OWNER, marker_record

if TYPE_CHECKING:
    from remediation.host.audit import AuditOptions
    from remediation.transport.inventory import Host

__all__ = ["AT", "BY", "NODE_VAR", "OWNER", "REASON", "RUN", "Cordon", "Kind", "cordon_patch", "cordon_vms",
           "is_aks", "marker", "node_cordon", "uncordon_patch", "uncordon_vms", "vm_cordon"]

OWNER = REMEDIATE_OWNER
#: The host variable naming an AKS host's Kubernetes node.
NODE_VAR = "k8s_node_name"
BY = "gpufleet.io/cordoned-by"  # label and annotation: who
REASON = "gpufleet.io/cordon-reason"  # annotation: why
AT = "gpufleet.io/cordoned-at"  # annotation: when (UTC, ISO 8601)
RUN = "gpufleet.io/cordon-run"  # annotation: which remediate run
_REASON_MAX = 120  # the marker stays within the 400 bytes the rollout's marker read shows


class Kind(StrEnum):
    NONE = "none"
    OURS = "ours"  # set by this run
    EARLIER = "ours-earlier"  # set by an earlier remediate run (a failed gate, an interrupted run)
    FOREIGN = "foreign"  # set by someone else


@dataclass(frozen=True)
class Cordon:
    kind: Kind
    by: str = ""
    why: str = ""
    at: str = ""
    run_id: str = ""

    @property
    def blocks(self) -> str | None:
        """Why the host must be left alone, or None (no cordon, or this run's own)."""
        if self.kind is Kind.FOREIGN:
            return f"cordoned by {self.by}: {self.why or 'no reason given'} (never undone by the loop)"
        if self.kind is Kind.EARLIER:
            when = f" at {self.at}" if self.at else ""
            return (f"cordoned by {OWNER} run {self.run_id or '?'}{when} ({self.why or 'no reason'}): left after a "
                    "failed gate or an interrupted run; a person checks the host and removes the cordon")
        return None


def _one_line(text: str, limit: int = _REASON_MAX) -> str:
    return " ".join(text.split())[:limit]


def is_aks(host_vars: Mapping[str, Any]) -> bool:
    return bool(str(host_vars.get(NODE_VAR) or "").strip())


def _classify(by: str, run_id: str, mine: str) -> Kind:
    if by != OWNER:
        return Kind.FOREIGN
    return Kind.OURS if run_id == mine else Kind.EARLIER


def vm_cordon(host_vars: Mapping[str, Any], marker_text: str | None, run_id: str) -> Cordon:
    """The VM host's cordon: the inventory flag, then the marker (``marker_text``: its text, None when absent)."""
    flag = host_vars.get("gpufleet_cordoned")
    if flag is True or str(flag).lower() in ("true", "yes", "1"):
        return Cordon(Kind.FOREIGN, "the inventory", "gpufleet_cordoned: true")
    if marker_text is None:
        return Cordon(Kind.NONE)
    record = marker_record(marker_text)
    if record is None:
        return Cordon(Kind.FOREIGN, f"someone else ({CORDON_MARKER})", _one_line(marker_text))
    by = _one_line(str(record.get("owner")), 80)
    return Cordon(_classify(by, str(record.get("run_id") or ""), run_id), by,
                  _one_line(str(record.get("reason") or "")), str(record.get("at") or ""),
                  str(record.get("run_id") or ""))


def node_cordon(node: Mapping[str, Any], run_id: str) -> Cordon:
    """The AKS node's cordon, from the Node object as the API returns it."""
    spec = node.get("spec") or {}
    meta = node.get("metadata") or {}
    notes = meta.get("annotations") or {}
    if not spec.get("unschedulable"):
        return Cordon(Kind.NONE)
    by = str(notes.get(BY) or "")
    if not by:
        taints = [str(t.get("key")) for t in spec.get("taints") or () if isinstance(t, Mapping)]
        why = "spec.unschedulable" + (f", taints {', '.join(taints)}" if taints else "")
        return Cordon(Kind.FOREIGN, "someone else (no gpufleet.io/cordoned-by annotation)", why)
    return Cordon(_classify(by, str(notes.get(RUN) or ""), run_id), by, str(notes.get(REASON) or ""),
                  str(notes.get(AT) or ""), str(notes.get(RUN) or ""))


def marker(run_id: str, reason: str, findings: Sequence[str], at: _dt.datetime) -> dict[str, Any]:
    """The record the loop writes into the VM marker (and the node's annotations carry)."""
    return {"owner": OWNER, "run_id": run_id, "reason": _one_line(reason), "findings": list(findings)[:4],
            "at": at.astimezone(_dt.UTC).isoformat(timespec="seconds"), "controller": socket.gethostname()[:40]}


def cordon_patch(run_id: str, reason: str, at: _dt.datetime, resource_version: str | None) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that cordons a node as ours (``kubectl cordon`` plus who/why/when)."""
    meta: dict[str, Any] = {
        "labels": {BY: OWNER},
        "annotations": {BY: OWNER, REASON: _one_line(reason), AT: at.astimezone(_dt.UTC).isoformat(timespec="seconds"),
                        RUN: run_id},
    }
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta, "spec": {"unschedulable": True}}


def uncordon_patch(resource_version: str | None) -> dict[str, Any]:
    """The merge patch that removes our cordon (``null`` deletes a field; what ``kubectl uncordon`` sends for
    ``spec.unschedulable``)."""
    meta: dict[str, Any] = {"labels": {BY: None}, "annotations": {BY: None, REASON: None, AT: None, RUN: None}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta, "spec": {"unschedulable": None}}


# --- VM hosts: the marker through the fan-out -----------------------------------------------------------------------


def _request(op: str, **fields: Any) -> str:
    payload = base64.b64encode(json.dumps({"op": op, "path": CORDON_MARKER, **fields}).encode()).decode()
    return "python3 - " + shlex.quote(payload)


def _answers(hosts: Sequence[Host], command: str, options: AuditOptions) -> dict[str, dict[str, Any]]:
    from remediation.hostside import HOSTCORDON_PATH
    from remediation.transport.fanout import Status, fan_out

    runs = fan_out(hosts, command, stdin=HOSTCORDON_PATH.read_bytes(), concurrency=options.concurrency,
                   connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, dict[str, Any]] = {}
    for name, run in runs.runs.items():
        if run.status is not Status.OK:
            last = (run.stderr.strip().splitlines() or [f"exit {run.exit_code}"])[-1][-300:]
            out[name] = {"result": "error", "error": run.error or f"{run.status.value}: {last}"}
            continue
        try:
            doc = json.loads(run.stdout.strip().splitlines()[-1])
            out[name] = doc if isinstance(doc, dict) else {"result": "error", "error": "not a JSON object"}
        except (ValueError, IndexError):
            out[name] = {"result": "error", "error": (run.stderr or run.stdout).strip()[-300:] or "no answer"}
    return out


def cordon_vms(hosts: Sequence[Host], records: Mapping[str, Mapping[str, Any]], options: AuditOptions
               ) -> dict[str, str | None]:
    """Set the loop's marker on each host (``records``: host -> :func:`marker`); host -> None when it is set (now
    ours), else why the host is left alone (a marker appeared: someone else's cordon; the host did not answer)."""
    out: dict[str, str | None] = {}
    for h in hosts:  # one request per host: each marker names its own findings
        answer = _answers([h], _request("cordon", record=dict(records[h.name])), options).get(h.name, {})
        if answer.get("result") == "set":
            out[h.name] = None
        elif answer.get("result") == "held":
            found = vm_cordon({}, str(answer.get("text") or ""), str(records[h.name].get("run_id")))
            out[h.name] = found.blocks or "cordon marker already there"
        else:
            out[h.name] = f"could not cordon ({CORDON_MARKER}): {answer.get('error') or 'no answer'}"
    return out


def uncordon_vms(hosts: Sequence[Host], run_id: str, options: AuditOptions) -> dict[str, str]:
    """Remove the loop's marker where this run set it; host -> what happened (one line)."""
    answers = _answers(hosts, _request("uncordon", owner=OWNER, run_id=run_id), options) if hosts else {}
    out: dict[str, str] = {}
    for h in hosts:
        a = answers.get(h.name, {})
        result = a.get("result")
        if result == "removed":
            out[h.name] = f"uncordoned (our marker {CORDON_MARKER} removed)"
        elif result == "absent":
            out[h.name] = f"no cordon left to remove ({CORDON_MARKER} absent)"
        elif result == "not-ours":
            out[h.name] = f"cordon kept: {CORDON_MARKER} is no longer ours ({_one_line(str(a.get('text') or ''), 120)})"
        else:
            out[h.name] = f"still cordoned: could not remove {CORDON_MARKER} ({a.get('error') or 'no answer'})"
    return out
