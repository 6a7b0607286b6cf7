"""`invoke harden`'s per-host extra vars built from the audit's facts (remediation.host.harden.audit_answers): each
probed host's booted kernel, so the playbook gathers no facts; a host that was not probed is left to the playbook."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from remediation.core.facts import facts_from_dict
from remediation.host.audit import AuditResult, HostAudit
from remediation.host.harden import audit_answers
from remediation.transport.fanout import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def host_audit(name: str, doc: dict[str, Any] | None, status: Status = Status.OK) -> HostAudit:
    facts = facts_from_dict(doc, host=name) if doc is not None else None
    return HostAudit(name, status, facts, (), None if doc is not None else "connection refused", 0.1)


def test_the_booted_kernels_of_the_probed_hosts_only() -> None:
    healthy = json.loads((FIXTURES / "healthy.json").read_text())
    other = json.loads((FIXTURES / "healthy.json").read_text())
    other["system"]["kernel"] = "6.8.0-1017-azure"
    audit = AuditResult("gpu", "inv.yml", _dt.datetime.now(_dt.UTC), 1.0, (
        host_audit("gpu-1", healthy),
        host_audit("gpu-2", None, Status.UNREACHABLE),
        host_audit("gpu-3", other),
    ))

    answers = audit_answers(audit)

    # gpu-2 was not probed: the playbook gathers its facts itself.
    assert answers == {"harden_booted_kernels": {"gpu-1": healthy["system"]["kernel"], "gpu-3": "6.8.0-1017-azure"}}
    assert healthy["system"]["kernel"] != "6.8.0-1017-azure"
    # Data, handed to the playbook as JSON: the round trip keeps it.
    assert json.loads(json.dumps(answers)) == answers
