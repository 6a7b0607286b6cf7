"""`invoke driver-restore`'s flow on the lab: a real S1 repair, the guards, and faults during a restore.

One 5-host lab for the module. gpu-3 is broken the S1 way once and stays broken: in every failure case it is the
host *after* the failing one, and it must come out untouched (same dpkg state, same boot).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.core.findings import Severity
from remediation.host.audit import AuditOptions, run_audit
from remediation.report.restore_view import render_restore_report
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore, undo_run
from remediation.restore.rules import Action
from remediation.rollout.errors import LockHeldError
from remediation.rollout.lock import fleet_lock
from remediation.transport.inventory import load
from tests.conftest import make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("restore"), "127.0.49", 5)
    try:
        inject(lab, "gpu-3", "kernel-upgrade")
        yield lab
    finally:
        lab.down(purge=True)


def _hosts(lab: Any, limit: str) -> list[Any]:
    return load(lab.cfg.inventory_path, "gpu", limit)


def _restore(lab: Any, limit: str, tmp: Path, **kw: Any) -> Any:
    confirm = kw.pop("confirm", None)
    hooks = kw.pop("hooks", None)
    opts = {"allow_reboot": True, "reboot_timeout": 12, "apt_lock_timeout": 3, "state_dir": tmp, **kw}
    return driver_restore(
        _hosts(lab, limit), lab.cfg.inventory_path, AUDIT, RestoreOptions(**opts), confirm=confirm, hooks=hooks
    )


def _state(lab: Any, host: str) -> dict[str, Any]:
    """dpkg's view (package -> selection/status, version) and /etc/default/grub."""
    status = lab.host_path(host, "/var/lib/dpkg/status").read_text()
    pkgs = {}
    for para in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line.startswith(" "))
        if "Package" in fields and "installed" in fields.get("Status", ""):
            pkgs[fields["Package"]] = (fields["Status"], fields.get("Version"))
    grub = lab.host_path(host, "/etc/default/grub")
    return {"packages": pkgs, "grub": grub.read_text() if grub.exists() else None}


def _critical(lab: Any, host: str) -> set[str]:
    audit = run_audit(_hosts(lab, host), AUDIT).host(host)
    assert audit.probed, audit.error
    return {f.id for f in audit.findings if f.severity is Severity.CRITICAL}


@pytest.fixture
def s1_host(fleet: Any) -> Iterator[str]:
    """gpu-2 broken the S1 way, returned to fresh afterwards."""
    inject(fleet, "gpu-2", "kernel-upgrade")
    yield "gpu-2"
    fleet.clear("gpu-2")


def test_s1_host_is_restored_held_and_reported(fleet: Any, s1_host: str, tmp_path: Path) -> None:
    result = _restore(fleet, "gpu-1,gpu-2", tmp_path)
    assert result.exit_code == 0, result.outcomes
    o = result.outcome(s1_host)
    assert o.status is HostStatus.RESTORED and o.decision.action is Action.REBUILD
    assert result.outcome("gpu-1").status is HostStatus.HEALTHY
    after = run_audit(_hosts(fleet, s1_host), AUDIT).host(s1_host)
    assert after.facts is not None and after.facts.nvml.ok
    assert after.facts.nvml.driver_version == "535.183.01"
    assert "GPU-DRV-001" not in {f.id for f in after.findings}
    held = after.facts.packages.held
    assert {"linux-image-6.5.0-45-generic", "linux-headers-6.5.0-45-generic", "nvidia-driver-535"} <= held
    report = render_restore_report(result)
    cause = report.split("### Root cause", 1)[1].split("### Resolution", 1)[0]
    assert "linux-image-6.5.0-45-generic" in cause and "unattended-upgrade" in cause
    fix = report.split("### Resolution", 1)[1].split("### Prevention", 1)[0]
    assert "installed linux-headers-6.5.0-45-generic" in fix and "restored" in fix


def test_gpu_lost_is_not_a_driver_problem_and_nothing_changes(fleet: Any, tmp_path: Path) -> None:
    inject(fleet, "gpu-4", "xid-79")
    try:
        before = _state(fleet, "gpu-4")
        result = _restore(fleet, "gpu-4", tmp_path)
        o = result.outcome("gpu-4")
        assert o.decision.action is Action.NOT_DRIVER and "not a driver problem" in o.detail
        assert o.status is HostStatus.LEFT_ALONE and result.exit_code == 1
        assert _state(fleet, "gpu-4") == before
    finally:
        fleet.clear("gpu-4")


def test_running_gpu_processes_block_without_force(fleet: Any, tmp_path: Path) -> None:
    # Predictive S1 (a newer kernel without module, NVML still up) on a host running GPU jobs.
    assert ssh(fleet, "gpu-5", "apt-get install -y -q linux-image-6.5.0-45-generic", timeout=300).returncode == 0
    inject(fleet, "gpu-5", "memory-full")
    try:
        before = _state(fleet, "gpu-5")
        result = _restore(fleet, "gpu-5", tmp_path)
        o = result.outcome("gpu-5")
        assert o.decision.action is Action.REBUILD and o.status is HostStatus.LEFT_ALONE
        assert "GPU compute processes running" in o.detail and "48211" in o.detail and "--force" in o.detail
        assert result.exit_code == 1 and _state(fleet, "gpu-5") == before
    finally:
        fleet.clear("gpu-5")


def test_second_restore_is_refused(fleet: Any, tmp_path: Path) -> None:
    before = _state(fleet, "gpu-3")
    with (
        fleet_lock(tmp_path, "gpu", ["gpu-9"]),
        pytest.raises(LockHeldError, match="another rolling change holds fleet 'gpu': pid"),
    ):
        _restore(fleet, "gpu-3", tmp_path)
    assert _state(fleet, "gpu-3") == before


def _untouched(lab: Any, state: dict[str, Any], boot_id: str | None, result: Any) -> None:
    assert result.outcome("gpu-3").status is HostStatus.NOT_STARTED
    assert _state(lab, "gpu-3") == state and lab.boot_id("gpu-3") == boot_id


def _failing_run(lab: Any, host: str, tmp: Path, **kw: Any) -> tuple[Any, dict[str, Any], set[str]]:
    g3, g3_boot = _state(lab, "gpu-3"), lab.boot_id("gpu-3")
    before, crit = _state(lab, host), _critical(lab, host)
    result = _restore(lab, f"{host},gpu-3", tmp, **kw)
    assert result.exit_code == 1
    o = result.outcome(host)
    assert o.status is HostStatus.FAILED
    assert result.stop_detail and host in result.stop_detail and o.where in result.stop_detail
    _untouched(lab, g3, g3_boot, result)
    return result, before, crit


def test_dkms_build_failure_stops_at_the_gate_and_undoes(fleet: Any, s1_host: str, tmp_path: Path) -> None:
    # The module does not build (a driver that does not compile against the new kernel, GPU-DKMS-001).
    assert ssh(fleet, s1_host, "mv /usr/sbin/dkms /usr/sbin/dkms.real").returncode == 0
    wrapper = fleet.host_path(s1_host, "/usr/sbin/dkms")
    wrapper.write_text(
        '#!/bin/sh\ncase "$1" in install|build|autoinstall)\n'
        "    echo 'Error! Bad return status for module build'; exit 10 ;;\nesac\nexec /usr/sbin/dkms.real \"$@\"\n"
    )
    wrapper.chmod(0o755)
    result, before, crit = _failing_run(fleet, s1_host, tmp_path)
    o = result.outcome(s1_host)
    assert "DKMS did not build" in o.detail and "GPU-DKMS-001" in (o.where or "")
    assert any("linux-headers-6.5.0-45-generic" in u for u in o.undone)
    after = _state(fleet, s1_host)
    assert after["packages"] == {**before["packages"], "dkms": after["packages"]["dkms"]}
    assert _critical(fleet, s1_host) <= crit


def test_dpkg_lock_taken_during_the_run(fleet: Any, s1_host: str, tmp_path: Path) -> None:
    def confirm(plan: Any) -> bool:  # someone starts apt right after the plan was printed
        inject(fleet, s1_host, "apt-lock")
        return True

    result, before, _crit = _failing_run(fleet, s1_host, tmp_path, confirm=confirm)
    o = result.outcome(s1_host)
    # Seen by the playbook's own decision (GPU-APT-001) before any change, or by apt after its lock timeout.
    assert "dpkg lock held" in o.detail or "Could not get lock" in o.detail, o.detail
    assert _state(fleet, s1_host) == before


def test_host_that_does_not_come_back_after_reboot(fleet: Any, s1_host: str, tmp_path: Path) -> None:
    old_boot = fleet.boot_id(s1_host)
    stop = threading.Event()

    def never_back() -> None:  # the VM boots but never answers SSH again (sshd stopped as soon as it is up)
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            new = fleet.boot_id(s1_host)
            if new and new != old_boot:
                fleet.wait_rebooted(s1_host, old_boot, 30)
                fleet.run_in_host(s1_host, ["/etc/init.d/ssh", "stop"])
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=never_back, daemon=True)
    watcher.start()
    try:
        result, before, crit = _failing_run(fleet, s1_host, tmp_path)
    finally:
        stop.set()
        watcher.join(40)
    o = result.outcome(s1_host)
    # Where it stops depends on when sshd goes: in Ansible's reboot wait, or at the gate's NVML probe right after.
    assert "Reboot to load the restored driver" in o.detail or o.detail.startswith("unreachable"), o
    assert o.undo_error and "unreachable" in o.undo_error
    fleet.run_in_host(s1_host, ["/etc/init.d/ssh", "start"])
    fleet.wait_ready([s1_host], 30)
    # Once the host answers again, the run's journal on it undoes exactly what the run changed.
    undo = undo_run(_hosts(fleet, s1_host), fleet.cfg.inventory_path, result.run_id)
    assert not undo.failed_hosts and not undo.unreachable_hosts
    assert _critical(fleet, s1_host) <= crit
    assert _state(fleet, s1_host)["packages"] == before["packages"]


def test_ssh_drops_mid_run(fleet: Any, s1_host: str, tmp_path: Path) -> None:
    journal = None
    stop = threading.Event()

    def drop_ssh() -> None:  # once the run records its holds, sshd dies on the host (sessions included)
        nonlocal journal
        while not stop.is_set():
            try:
                text = fleet.host_path(s1_host, "/var/lib/gpufleet/driver-restore/journal.json").read_text()
            except OSError:
                text = ""
            if "holds_added" in text:
                journal = text
                fleet.run_in_host(
                    s1_host,
                    [
                        "sh",
                        "-c",
                        'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)"'
                        " = sshd ] && kill -9 ${p#/proc/}; done; true",
                    ],
                )
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=drop_ssh, daemon=True)
    watcher.start()
    try:
        result, before, crit = _failing_run(fleet, s1_host, tmp_path)
    finally:
        stop.set()
        watcher.join(5)
    assert journal is not None
    o = result.outcome(s1_host)
    assert "unreachable" in (o.where or "") + (o.undo_error or "")
    fleet.run_in_host(s1_host, ["/etc/init.d/ssh", "start"])
    fleet.wait_ready([s1_host], 30)
    # Once the host answers again, the run's journal on it undoes exactly what the run changed.
    undo = undo_run(_hosts(fleet, s1_host), fleet.cfg.inventory_path, result.run_id)
    assert not undo.failed_hosts and not undo.unreachable_hosts
    assert _critical(fleet, s1_host) <= crit
    assert _state(fleet, s1_host) == before


def test_previous_kernel_boots_back_to_the_kernel_with_a_module(fleet: Any, s1_host: str, tmp_path: Path) -> None:
    from remediation.restore.rules import Prefer

    result = _restore(fleet, s1_host, tmp_path, prefer=Prefer.PREVIOUS_KERNEL)
    o = result.outcome(s1_host)
    assert o.decision.action is Action.PREVIOUS_KERNEL, o
    assert result.exit_code == 0 and o.status is HostStatus.RESTORED, o
    assert ssh(fleet, s1_host, "uname -r").stdout.strip() == "6.5.0-44-generic"
    grub = fleet.host_path(s1_host, "/etc/default/grub").read_text()
    assert 'with Linux 6.5.0-44-generic"' in grub
    # No headers or packages were added for the broken kernel: this path only chose what to boot.
    assert "linux-headers-6.5.0-45-generic" not in _state(fleet, s1_host)["packages"]


def test_no_reboot_without_the_flag(fleet: Any, s1_host: str, tmp_path: Path) -> None:
    boot = fleet.boot_id(s1_host)
    result = _restore(fleet, s1_host, tmp_path, allow_reboot=False)
    o = result.outcome(s1_host)
    assert o.decision.action is Action.REBUILD
    assert o.status is HostStatus.REBOOT_REQUIRED and result.exit_code == 1, o
    assert fleet.boot_id(s1_host) == boot  # the module is built, but the host was not rebooted
    assert fleet.host_path(s1_host, "/lib/modules/6.5.0-45-generic/updates/dkms/nvidia.ko").exists()


def test_mismatch_with_a_driver_the_fleet_does_not_expect_is_left_to_a_person(fleet: Any, tmp_path: Path) -> None:
    """Userspace upgraded to 535.216.01 while the fleet expects 535.183.01: a reboot would load 216, fail the gate
    and be undone, so the plan changes nothing and says what to decide."""
    inject(fleet, "gpu-4", "driver-mismatch")
    try:
        before, boot = _state(fleet, "gpu-4"), fleet.boot_id("gpu-4")
        result = _restore(fleet, "gpu-4", tmp_path)
        o = result.outcome("gpu-4")
        assert o.decision.action is Action.MANUAL, o
        assert "535.216.01" in o.decision.reason and "535.183.01" in o.decision.reason
        assert o.status is HostStatus.LEFT_ALONE and result.exit_code == 1
        assert _state(fleet, "gpu-4") == before and fleet.boot_id("gpu-4") == boot
    finally:
        fleet.clear("gpu-4")
