"""On the lab: the Scheduled Events program runs on real lab hosts over SSH (the fan-out, host keys checked, as
``azureuser`` with sudo) against the IMDS stand-in, and the controller decides per host.

The stand-in listens on ``<prefix>.250``, an address of the lab's own 127.X.78 range: lab hosts share the
controller's network stack (mount/UTS/PID namespaces only), so a host's ``python3`` reaches it as an Azure VM
reaches 169.254.169.254, which nothing here ever addresses. Two hosts, two VMs of one availability set: the
events name gpu-vm-1 or gpu-vm-2, and each host judges only those that name it.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from typing import Any

import pytest

from lab.config import test_prefix as lab_prefix
from lab.services.imds import FakeImds
from remediation.azure import scheduled_events as se
from remediation.transport.inventory import load
from tests.conftest import make_lab, require_lab

pytestmark = pytest.mark.lab
PREFIX = "127.0.78"
VMS = {"gpu-1": "gpu-vm-1", "gpu-2": "gpu-vm-2"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("imds")
    lab = make_lab(tmp, PREFIX, 2, flavour="azure",
                   host_overrides={h: {"azure_vm_name": vm} for h, vm in VMS.items()})
    imds = None
    try:
        imds = FakeImds(host=f"{lab_prefix(PREFIX)}.250").start()
        yield {"lab": lab, "imds": imds, "hosts": load(lab.cfg.inventory_path, "gpu")}
    finally:
        if imds is not None:
            imds.stop()
        lab.down(purge=True)


def test_hosts_read_the_stand_in_and_each_judges_its_own_events(fleet: dict[str, Any]) -> None:
    imds: FakeImds = fleet["imds"]
    hosts = fleet["hosts"]
    assert {h.name for h in hosts} == set(VMS) and all(se.vm_name_of(h) == VMS[h.name] for h in hosts)
    imds.clear()

    read = se.read_events(hosts, endpoint=imds.endpoint, request_timeout=5)
    assert all(r.document is not None for r in read.values()), {h: r.error for h, r in read.items()}
    now = _dt.datetime.now(_dt.UTC)
    names = {h.name: se.vm_name_of(h) for h in hosts}
    assert {d.verdict for d in se.decide_all(read, now=now, vm_names=names).values()} == {se.Verdict.CLEAR}
    assert all(r.metadata_header for r in imds.requests)

    far = imds.schedule("Redeploy", ["gpu-vm-1"], in_seconds=6 * 3600, description="Host hardware degraded")
    soon = imds.schedule("Reboot", ["gpu-vm-2"], in_seconds=600, source="User")
    read = se.read_events(hosts, endpoint=imds.endpoint, request_timeout=5)
    decisions = se.decide_all(read, now=_dt.datetime.now(_dt.UTC), vm_names=names)
    assert decisions["gpu-1"].verdict is se.Verdict.WAIT and far in decisions["gpu-1"].reason
    assert decisions["gpu-2"].verdict is se.Verdict.ESCALATE and soon in decisions["gpu-2"].reason
    assert decisions["gpu-1"].incarnation == decisions["gpu-2"].incarnation == imds.incarnation

    # approving is a separate call, made only when asked; the event then shows as started
    gpu2 = next(h for h in hosts if h.name == "gpu-2")
    assert imds.approvals() == []
    ack = se.acknowledge(gpu2, soon, endpoint=imds.endpoint)
    assert ack.ok and ack.status == 200 and imds.approvals() == [soon]
    after = se.read_events([gpu2], endpoint=imds.endpoint)["gpu-2"]
    assert after.document is not None and after.document.events[-1].started


def test_an_unreachable_imds_is_never_clear(fleet: dict[str, Any]) -> None:
    dead = f"http://{lab_prefix(PREFIX)}.251:9/metadata/scheduledevents"
    read = se.read_events(fleet["hosts"], endpoint=dead, request_timeout=2)
    for events in read.values():
        assert events.document is None and events.transient and "unreachable" in (events.error or "")
        assert se.decide(events, now=_dt.datetime.now(_dt.UTC)).verdict is se.Verdict.WAIT
