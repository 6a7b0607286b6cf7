"""The probe and the host leases through a non-root SSH user with sudo, as Azure images log in (``azureuser``).

One 2-host lab for the module (127.0.93.N); lab hosts log in as ``azureuser`` (passwordless sudo, cloud-init's rule),
and the fixture adds ``pwuser`` (the same key, sudo wants a password). The inventories here log in as those users:
gpu-1 as azureuser, gpu-2 as pwuser, both with ``ansible_become: true``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.faults import inject
from remediation.host.audit import AuditOptions, run_audit
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore
from remediation.restore.rules import Action
from remediation.rollout.errors import RolloutError
from remediation.rollout.lock import host_leases
from remediation.transport.fanout import Status
from remediation.transport.inventory import load
from tests.conftest import make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
LEASE = "/var/lib/gpufleet/rollout.lease"
PW_LINE = (
    "gpu-2: sudo asks for a password for pwuser (sudo -n); give pwuser passwordless sudo (NOPASSWD) for python3,"
    " or log in as root"
)

USERS = r"""
set -eu
id pwuser >/dev/null 2>&1 || useradd -m -s /bin/bash pwuser
install -d -m 700 -o pwuser -g pwuser /home/pwuser/.ssh
install -m 600 -o pwuser -g pwuser /home/azureuser/.ssh/authorized_keys /home/pwuser/.ssh/authorized_keys
echo 'pwuser:not-the-key-0' | chpasswd
echo 'pwuser ALL=(ALL) ALL' > /etc/sudoers.d/91-pwuser
chmod 440 /etc/sudoers.d/91-pwuser
"""


def _add_users(lab: Any, host: str) -> None:
    r = ssh(lab, host, USERS)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("become"), "127.0.93", 2)
    try:
        for host in ("gpu-1", "gpu-2"):
            assert lab.host_path(host, "/usr/bin/sudo").exists(), "the lab base has no sudo (lab/base.py)"
            _add_users(lab, host)
        yield lab
    finally:
        lab.down(purge=True)


def _inventory(lab: Any, tmp: Path, gpu1_become: bool = True, **extra: Any) -> Path:
    doc = yaml.safe_load(lab.cfg.inventory_path.read_text())
    hosts = doc["all"]["children"]["gpu"]["hosts"]
    hosts["gpu-1"].update(ansible_user="azureuser", ansible_become=gpu1_become, **extra)
    hosts["gpu-2"].update(ansible_user="pwuser", ansible_become=True)
    path = tmp / "hosts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_probe_runs_as_root_through_sudo_and_sees_roots_job(fleet: Any, tmp_path: Path) -> None:
    job = inject(fleet, "gpu-1", "gpu-job").detail
    pid = int(job.split()[2])
    try:
        hosts = load(_inventory(fleet, tmp_path), "gpu", "gpu-1")
        assert hosts[0].user == "azureuser" and hosts[0].become.enabled
        audit = run_audit(hosts, AUDIT).host("gpu-1")
        assert audit.status is Status.OK and audit.facts is not None, audit.error
        assert audit.facts.euid == 0 and not audit.facts.unprivileged
        assert audit.facts.device_users.available
        assert pid in [u.pid for u in audit.facts.device_users.workloads]
    finally:
        ssh(fleet, "gpu-1", f"kill {pid}")


def test_sudo_wanting_a_password_is_that_hosts_one_line(fleet: Any, tmp_path: Path) -> None:
    result = run_audit(load(_inventory(fleet, tmp_path), "gpu"), AUDIT)
    two = result.host("gpu-2")
    assert two.status is Status.FAILED and two.facts is None
    assert two.error == PW_LINE
    assert result.host("gpu-1").status is Status.OK  # the other host's run goes on


def test_without_become_the_probe_says_so_and_the_guard_refuses(fleet: Any, tmp_path: Path) -> None:
    inv = _inventory(fleet, tmp_path, gpu1_become=False, nvidia_driver_expected_version="535.216.01")
    inject(fleet, "gpu-1", "driver-mismatch")
    try:
        inject(fleet, "gpu-1", "gpu-job")
        facts = run_audit(load(inv, "gpu", "gpu-1"), AUDIT).host("gpu-1").facts
        assert facts is not None and facts.nvml.failed
        assert facts.euid not in (None, 0) and facts.unprivileged
        assert not facts.device_users.available  # root's job is invisible to azureuser: unknown, not "none"
        boot = fleet.boot_id("gpu-1")
        result = driver_restore(load(inv, "gpu", "gpu-1"), inv, AUDIT, RestoreOptions(
            allow_reboot=True, reboot_timeout=15, apt_lock_timeout=3, state_dir=tmp_path))
        o = result.outcome("gpu-1")
        assert o.decision.action is Action.REBOOT and o.status is HostStatus.LEFT_ALONE, o
        assert o.decision.blocked is not None and "cannot tell whether GPU jobs run" in o.decision.blocked
        assert "ansible_become: true" in o.decision.blocked
        assert fleet.boot_id("gpu-1") == boot
    finally:
        fleet.clear("gpu-1")
        _add_users(fleet, "gpu-1")


def test_leases_are_taken_as_root_through_sudo(fleet: Any, tmp_path: Path) -> None:
    hosts = load(_inventory(fleet, tmp_path), "gpu", "gpu-1")
    lease = fleet.host_path("gpu-1", LEASE)
    with host_leases(hosts, run_id="become-run", fleet="gpu", ttl_s=600) as leases:
        assert leases.held == ["gpu-1"] and leases.unreachable == []
        assert lease.exists() and os.stat(lease).st_uid == 0
        assert os.stat(lease.parent).st_uid == 0
    assert not lease.exists()


def test_a_lease_refused_by_sudo_or_permissions_is_named_not_unreachable(fleet: Any, tmp_path: Path) -> None:
    inv = _inventory(fleet, tmp_path, gpu1_become=False)
    fleet.host_path("gpu-1", LEASE).parent.mkdir(parents=True, exist_ok=True)
    with pytest.raises(RolloutError) as pw, host_leases(load(inv, "gpu", "gpu-2"), run_id="r", fleet="gpu"):
        pass
    assert str(pw.value) == f"could not take the rollout lease on host gpu-2: {PW_LINE}"
    with pytest.raises(RolloutError) as plain, host_leases(load(inv, "gpu", "gpu-1"), run_id="r", fleet="gpu"):
        pass
    assert "gpu-1" in str(plain.value) and "Permission denied" in str(plain.value)
    assert "set ansible_become: true" in str(plain.value)
    assert not fleet.host_path("gpu-1", LEASE).exists()
