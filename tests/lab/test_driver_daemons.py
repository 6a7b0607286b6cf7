"""Driver daemons on lab hosts are what a real GPU host runs, and the fleet tooling does not take them for GPU work.

A host with its NVIDIA module loaded runs ``nvidia-persistenced`` (every size) and, on sizes with NVSwitch,
``nv-fabricmanager``: real executables of those names holding the device files, whose ``/proc/<pid>/comm`` the
kernel cuts to 15 characters (``nvidia-persiste``, ``nv-fabricmanage``). The audit lists them as driver services,
and a driver restore with the daemon running proceeds (before, every such host was refused without --force).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from lab import hardware
from lab.faults import inject
from remediation.host.audit import AuditOptions, run_audit
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
PERSISTENCED = "nvidia-persistenced"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    # gpu-1's fleet moves to the newer driver, so its mismatch is repaired by a reboot (not by a downgrade).
    expected = {"gpu-1": {"nvidia_driver_expected_version": "535.216.01"}}
    lab = make_lab(tmp_path_factory.mktemp("daemons"), "127.0.92", 3, host_overrides=expected)
    try:
        yield lab
    finally:
        lab.down(purge=True)


def _daemon(lab: Any, host: str, name: str = PERSISTENCED) -> dict[str, Any]:
    """What /proc inside the host says about the daemon: pid, comm, exe link, open files (read over SSH)."""
    script = (
        f"pid=$(cat /run/{name}/{name}.pid) && echo $pid && cat /proc/$pid/comm && readlink /proc/$pid/exe"
        " && for f in /proc/$pid/fd/*; do readlink $f; done"
    )
    run = ssh(lab, host, script)
    assert run.returncode == 0, run.stderr
    pid, comm, exe, *fds = run.stdout.splitlines()
    return {"pid": int(pid), "comm": comm, "exe": exe, "fds": set(fds)}


def _users(lab: Any, host: str) -> Any:
    audit = run_audit(load(lab.cfg.inventory_path, "gpu", host), AUDIT).host(host)
    assert audit.probed and audit.facts is not None, audit.error
    return audit.facts


def _restore_cli(lab: Any, host: str, tmp: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INVOKE_DRIVER_RESTORE_STATE_DIR": str(tmp / "state-restore")}
    args = ["driver-restore", "--inventory", str(lab.cfg.inventory_path), "--limit", host, "--yes",
            "--allow-reboot", "--reboot-timeout", "60"]
    return subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600, check=False)


def test_persistenced_holds_the_devices_under_its_own_name(fleet: Any) -> None:
    d = _daemon(fleet, "gpu-1")
    assert d["comm"] == "nvidia-persiste"  # what the kernel keeps of "nvidia-persistenced"
    assert d["exe"] == "/usr/bin/nvidia-persistenced"
    assert {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"} <= d["fds"]  # the default size has 2 GPUs
    ps = ssh(fleet, "gpu-1", f"ps -p {d['pid']} -o comm=")
    assert ps.stdout.strip() == "nvidia-persiste"
    # Not an NVSwitch size: no fabric manager.
    assert ssh(fleet, "gpu-1", "test -e /run/nv-fabricmanager/nv-fabricmanager.pid").returncode != 0


def test_the_audit_lists_the_daemon_as_a_driver_service(fleet: Any) -> None:
    facts = _users(fleet, "gpu-1")
    pid = _daemon(fleet, "gpu-1")["pid"]
    users = {u.pid: u for u in facts.device_users.users}
    assert users[pid].comm == "nvidia-persiste" and users[pid].exe == PERSISTENCED and users[pid].service
    assert facts.device_users.workloads == () and facts.device_users.unreadable == 0
    assert pid not in {p.pid for g in facts.nvml.gpus for p in g.processes}  # no compute context: NVML omits it


def test_an_nvswitch_size_also_runs_the_fabric_manager(fleet: Any) -> None:
    hw = fleet.paths.host("gpu-3") / "hw/gpus"
    hardware.write_state(hw, hardware.healthy_state("gpu-3", "Standard_ND96asr_v4"))
    try:
        fleet.reboot("gpu-3", wait=True)
        fm = _daemon(fleet, "gpu-3", "nv-fabricmanager")
        assert fm["comm"] == "nv-fabricmanage" and fm["exe"] == "/usr/bin/nv-fabricmanager"
        assert "/dev/nvidiactl" in fm["fds"]
        assert "/dev/nvidia7" in _daemon(fleet, "gpu-3")["fds"]  # 8 GPUs, each held by persistenced
        facts = _users(fleet, "gpu-3")
        assert facts.device_users.workloads == ()
        assert {u.exe for u in facts.device_users.users} == {PERSISTENCED, "nv-fabricmanager"}
    finally:
        fleet.clear("gpu-3")


def test_mismatch_restore_with_the_daemon_running_proceeds_and_it_runs_again(fleet: Any, tmp_path: Any) -> None:
    # Userspace upgraded under the loaded module: NVML fails, the old daemon still holds the GPUs (its binary
    # replaced by the upgrade: exe "... (deleted)"). Only the /proc scan sees it; it is not GPU work.
    inject(fleet, "gpu-1", "driver-mismatch")
    before = _daemon(fleet, "gpu-1")
    assert before["exe"] == "/usr/bin/nvidia-persistenced (deleted)"
    facts = _users(fleet, "gpu-1")
    assert facts.nvml.failed and facts.device_users.workloads == ()
    boot = fleet.boot_id("gpu-1")
    proc = _restore_cli(fleet, "gpu-1", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GPU compute processes running" not in proc.stdout + proc.stderr
    assert fleet.boot_id("gpu-1") != boot
    after = _daemon(fleet, "gpu-1")
    assert after["exe"] == "/usr/bin/nvidia-persistenced" and "/dev/nvidia0" in after["fds"]
    assert _users(fleet, "gpu-1").nvml.ok


def test_s1_restore_proceeds_and_the_host_comes_back_with_the_daemon(fleet: Any, tmp_path: Any) -> None:
    # S1: the new kernel boots without a module, so no device files and no daemon (as on a real host, where
    # nvidia-persistenced.service fails); the restore builds the module, reboots, and the daemon is back.
    inject(fleet, "gpu-2", "kernel-upgrade")
    assert ssh(fleet, "gpu-2", "test -e /dev/nvidiactl").returncode != 0
    proc = _restore_cli(fleet, "gpu-2", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = _daemon(fleet, "gpu-2")
    assert d["comm"] == "nvidia-persiste" and "/dev/nvidia0" in d["fds"]
    facts = _users(fleet, "gpu-2")
    assert facts.nvml.ok and facts.device_users.workloads == ()
