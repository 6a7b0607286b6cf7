"""The rollout engine's final audit reuses the gate audit of each host done and probes only the other touched hosts."""

from __future__ import annotations

import socket

from remediation.host.audit import AuditOptions, HostAudit
from remediation.rollout.engine import _final_audit
from remediation.transport.fanout import Status
from remediation.transport.inventory import Host

OPTIONS = AuditOptions(concurrency=2, connect_timeout=2, timeout=5)


def _gated(name: str) -> HostAudit:
    return HostAudit(name, Status.OK, None, (), None, 0.5)


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on once the socket is closed: connection refused at once
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_host_done_reuses_its_gate_audit_in_the_order_of_the_hosts() -> None:
    hosts = [Host(n, "127.0.0.1", _closed_port()) for n in ("gpu-3", "gpu-1", "gpu-2")]
    reuse = {n: _gated(n) for n in ("gpu-1", "gpu-2", "gpu-3")}
    after = _final_audit(hosts, reuse, OPTIONS, "gpu", "inv.yml")
    assert [h.host for h in after.hosts] == ["gpu-3", "gpu-1", "gpu-2"]
    assert all(after.host(n) is reuse[n] for n in reuse)  # nothing probed again
    assert after.fleet == "gpu" and after.inventory == "inv.yml"


def test_a_host_not_done_is_probed_again_the_others_are_reused() -> None:
    hosts = [Host(n, "127.0.0.1", _closed_port()) for n in ("gpu-1", "gpu-2")]
    reuse = {"gpu-1": _gated("gpu-1")}
    after = _final_audit(hosts, reuse, OPTIONS, "gpu", "inv.yml")
    assert [h.host for h in after.hosts] == ["gpu-1", "gpu-2"]
    assert after.host("gpu-1") is reuse["gpu-1"]
    fresh = after.host("gpu-2")
    assert fresh is not reuse.get("gpu-2") and not fresh.probed  # probed now: nothing answers on its port
