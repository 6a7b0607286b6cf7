"""What the rollout engine guarantees to every change when a batch of three does not finish, on lab hosts.

For the kernel update and the driver restore alike: a batch whose playbook runs past its timeout, and a batch
interrupted by SIGINT (Ctrl-C) while Ansible is working on it, are failed batches. Every host of the batch is
failed, gated and undone (its journal says ``undone``), nothing of the run is left on any host (no kernel or header
package it installed, no one-shot boot entry armed, the boot default unchanged), the run stops with the matching
``StopReason`` and the incident report says where and why; the exit code is 1, never an exception.

The hang: DKMS on every host of the batch announces itself (a marker file), sleeps past the batch's timeout and then
fails, so the whole batch is mid-apply when it is stopped. As on a real host, stopping the controller's playbook does
not stop the apt/DKMS step running on the host: the undo waits for the dpkg lock (``apt_lock_timeout``, longer than
the hang here) and then removes what the run installed (a host whose own work finished before the batch stopped is
judged by the gate instead, as any host: its journal says so). SIGINT is sent to this process only once that marker
exists, that is while ``run_playbook`` holds the signal (it cancels the playbook and kills its process group).

One 3-host lab (generic flavour, Secure Boot off) on 127.0.95.N: the kernel-update tests run on the healthy hosts,
then the restore tests break them (``kernel-upgrade``); every test clears its hosts afterwards.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.host.audit import AuditOptions
from remediation.kernelupdate.flow import KernelStatus, KernelUpdateOptions, kernel_update
from remediation.report.kernel_update_view import render_kernel_report
from remediation.report.restore_view import render_restore_report
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore
from remediation.rollout.engine import StopReason
from remediation.transport.inventory import load
from tests.conftest import make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
HOSTS = ("gpu-1", "gpu-2", "gpu-3")
HANG_MARKER = "/var/tmp/dkms-hanging"
NEW_KERNEL = "6.5.0-45-generic"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("interrupts"), "127.0.95", 3, flavour="generic", secure_boot=False)
    try:
        yield lab
    finally:
        lab.down(purge=True)


@pytest.fixture
def clean(fleet: Any) -> Iterator[None]:
    yield
    for h in HOSTS:
        fleet.clear(h)


def _out(lab: Any, host: str, command: str) -> str:
    proc = ssh(lab, host, command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _state(lab: Any, host: str) -> dict[str, Any]:
    """What a rolling change may touch on a host: packages with files, holds, the boot default and any one-shot."""
    packages = _out(lab, host, "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n'")
    return {
        "packages": sorted(line.split()[0] for line in packages.splitlines() if line.split()[-1].startswith("i")),
        "held": sorted(_out(lab, host, "apt-mark showhold").split()),
        "grub_default": _out(lab, host, "grep ^GRUB_DEFAULT= /etc/default/grub"),
        "grubenv": _out(lab, host, "grep -E '^(saved_entry|next_entry)=' /boot/grub/grubenv || true"),
    }


def _dkms_hangs(lab: Any, host: str, seconds: int) -> None:
    """DKMS on ``host`` fails; the first call touches the marker and sleeps ``seconds`` first (apt's hooks call DKMS
    more than once: only one call hangs, so the step ends a known time after the hang began)."""
    assert ssh(lab, host, "mv /usr/sbin/dkms /usr/sbin/dkms.real").returncode == 0
    wrapper = lab.host_path(host, "/usr/sbin/dkms")
    wrapper.write_text(
        '#!/bin/sh\ncase "$1" in install|build|autoinstall)\n'
        f"    if [ ! -e {HANG_MARKER} ]; then touch {HANG_MARKER}; sleep {seconds}; fi\n"
        "    echo 'Error! Bad return status for module build'; exit 10 ;;\nesac\n"
        'exec /usr/sbin/dkms.real "$@"\n'
    )
    wrapper.chmod(0o755)


def _interrupt_when_hanging(lab: Any, host: str) -> threading.Thread:
    """SIGINT to this process once DKMS hangs on ``host`` (at most 10 minutes of polling)."""
    marker = lab.host_path(host, HANG_MARKER)

    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if marker.exists():
                time.sleep(2)  # well inside the playbook: the other hosts are mid-task too
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _journal_status(lab: Any, host: str, path: str) -> str:
    return _out(lab, host, f"python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"status\"])' {path}"
                           f" 2>/dev/null || echo none")


def _kernel_update(lab: Any, tmp: Path, **kw: Any) -> Any:
    opts = {"allow_reboot": True, "reboot_timeout": 30, "apt_lock_timeout": 10, "state_dir": tmp, "batch": 3,
            "max_failures": 3, **kw}
    inventory = lab.cfg.inventory_path
    return kernel_update(load(inventory, "gpu"), inventory, AUDIT, KernelUpdateOptions(**opts))


def _restore(lab: Any, tmp: Path, **kw: Any) -> Any:
    opts = {"allow_reboot": True, "reboot_timeout": 15, "apt_lock_timeout": 10, "state_dir": tmp, "batch": 3,
            "max_failures": 3, **kw}
    inventory = lab.cfg.inventory_path
    return driver_restore(load(inventory, "gpu"), inventory, AUDIT, RestoreOptions(**opts))


def _assert_kernel_batch_undone(lab: Any, result: Any, before: dict[str, Any], where: str) -> None:
    from remediation.kernelupdate.flow import JOURNAL_PATH

    for host in HOSTS:
        o = result.outcome(host)
        assert o.status is KernelStatus.FAILED and o.where == "apply: did not finish", o
        assert where in o.detail and o.undo_error is None, o
        assert _journal_status(lab, host, JOURNAL_PATH) in ("undone", "none"), host
        after = _state(lab, host)
        assert after == before[host], (host, after, before[host])
        assert not any(p.endswith(NEW_KERNEL) for p in after["packages"]), after
    assert result.exit_code == 1


def test_kernel_update_batch_of_three_that_times_out_is_undone_everywhere(
    fleet: Any, tmp_path: Path, clean: None
) -> None:
    for h in HOSTS:
        _dkms_hangs(fleet, h, 120)
    before = {h: _state(fleet, h) for h in HOSTS}
    result = _kernel_update(fleet, tmp_path, playbook_timeout=90, apt_lock_timeout=150)
    assert result.stopped is StopReason.MAX_FAILURES, result.stop_detail
    _assert_kernel_batch_undone(fleet, result, before, "timed out")
    report = render_kernel_report(result)
    assert "did not finish" in report and "timed out" in report


def test_kernel_update_batch_of_three_interrupted_by_sigint_is_undone_everywhere(
    fleet: Any, tmp_path: Path, clean: None
) -> None:
    for h in HOSTS:
        _dkms_hangs(fleet, h, 45)
    before = {h: _state(fleet, h) for h in HOSTS}
    watcher = _interrupt_when_hanging(fleet, "gpu-2")
    result = _kernel_update(fleet, tmp_path, apt_lock_timeout=120)
    watcher.join(timeout=5)
    assert result.stopped is StopReason.INTERRUPTED, (result.stopped, result.stop_detail)
    assert "interrupted (Ctrl-C)" in result.stop_detail
    _assert_kernel_batch_undone(fleet, result, before, "interrupted (Ctrl-C)")
    assert "interrupted (Ctrl-C)" in render_kernel_report(result)


def _assert_restore_batch_undone(lab: Any, result: Any, before: dict[str, Any], where: str) -> None:
    from remediation.rollout.journal import JOURNAL_PATH

    for host in HOSTS:
        o = result.outcome(host)
        assert o.status is HostStatus.FAILED and o.where == "apply: did not finish", o
        assert where in o.detail and o.undo_error is None, o
        assert _journal_status(lab, host, JOURNAL_PATH) in ("undone", "none"), host
        assert _state(lab, host) == before[host], host
    assert result.exit_code == 1


@pytest.fixture
def broken(fleet: Any, clean: None) -> None:
    for h in HOSTS:
        inject(fleet, h, "kernel-upgrade")


def test_restore_batch_of_three_that_times_out_is_undone_everywhere(
    fleet: Any, tmp_path: Path, broken: None
) -> None:
    for h in HOSTS:
        _dkms_hangs(fleet, h, 90)
    before = {h: _state(fleet, h) for h in HOSTS}
    result = _restore(fleet, tmp_path, playbook_timeout=60, apt_lock_timeout=120)
    assert result.stopped is StopReason.MAX_FAILURES, result.stop_detail
    _assert_restore_batch_undone(fleet, result, before, "timed out")
    assert "did not finish" in render_restore_report(result)


def test_restore_batch_of_three_interrupted_by_sigint_is_undone_everywhere(
    fleet: Any, tmp_path: Path, broken: None
) -> None:
    for h in HOSTS:
        _dkms_hangs(fleet, h, 45)
    before = {h: _state(fleet, h) for h in HOSTS}
    watcher = _interrupt_when_hanging(fleet, "gpu-2")
    result = _restore(fleet, tmp_path, apt_lock_timeout=120)
    watcher.join(timeout=5)
    assert result.stopped is StopReason.INTERRUPTED, (result.stopped, result.stop_detail)
    _assert_restore_batch_undone(fleet, result, before, "interrupted (Ctrl-C)")


def test_a_lease_taken_by_another_run_mid_run_stops_the_run_before_the_next_batch(
    fleet: Any, tmp_path: Path, broken: None
) -> None:
    """After the first batch, another controller holds gpu-2's lease (as one that took over an expired lease would):
    the renewal before the second batch finds it, and the run stops there; gpu-2 and gpu-3 are not touched."""
    import json

    from remediation.restore.flow import RestoreHooks

    before = {h: _state(fleet, h) for h in ("gpu-2", "gpu-3")}
    thief = {"run_id": "ctl-b-run", "change": "kernel-update", "fleet": "gpu", "controller": "ctl-b", "user": "bob",
             "pid": 7, "hosts": ["gpu-2"], "acquired_at": time.time(), "expires_at": time.time() + 3600}

    def steal(names: list[str], _outcomes: list[Any]) -> None:
        if names == ["gpu-1"]:
            fleet.host_path("gpu-2", "/var/lib/gpufleet/rollout.lease").write_text(json.dumps(thief))

    inventory = fleet.cfg.inventory_path
    options = RestoreOptions(allow_reboot=True, reboot_timeout=15, apt_lock_timeout=10, state_dir=tmp_path)
    result = driver_restore(load(inventory, "gpu"), inventory, AUDIT, options, hooks=RestoreHooks(after_batch=steal))
    assert result.outcome("gpu-1").status is HostStatus.RESTORED, result.outcome("gpu-1")
    assert result.stopped is StopReason.LEASE_LOST, (result.stopped, result.stop_detail)
    assert "gpu-2" in result.stop_detail and "ctl-b-run" in result.stop_detail
    for host in ("gpu-2", "gpu-3"):
        assert result.outcome(host).status is HostStatus.NOT_STARTED, result.outcome(host)
        assert _state(fleet, host) == before[host], host
    assert result.exit_code == 1
    assert json.loads(fleet.host_path("gpu-2", "/var/lib/gpufleet/rollout.lease").read_text())["run_id"] == "ctl-b-run"
