"""The driver restore's guards on lab hosts: GPU jobs seen without NVML, cordon markers, restore methods, the
leases on the hosts that two controllers respect, and the CLI's edges (exit codes 2 and 4, no terminal, --check).

One 5-host lab for the module (127.0.62.N). gpu-1 stays healthy (a fleet member that carries leases); the tests
break gpu-2 / gpu-4 / gpu-5 and clear them afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.faults import inject
from remediation.host.audit import AuditOptions
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore
from remediation.restore.rules import Action
from remediation.rollout.errors import LockHeldError
from remediation.rollout.lock import host_leases
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
LEASE = "/var/lib/gpufleet/rollout.lease"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("guards"), "127.0.62", 5)
    try:
        yield lab
    finally:
        lab.down(purge=True)


def _inventory(lab: Any, tmp: Path, **host_vars: dict[str, Any]) -> Path:
    """A copy of the lab inventory with extra variables for some hosts."""
    doc = yaml.safe_load(lab.cfg.inventory_path.read_text())
    for host, extra in host_vars.items():
        doc["all"]["children"]["gpu"]["hosts"][host.replace("_", "-")].update(extra)
    path = tmp / "hosts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _restore(inventory: Path, limit: str, tmp: Path, *, fleet_wide: bool = False, **kw: Any) -> Any:
    opts = {"allow_reboot": True, "reboot_timeout": 15, "apt_lock_timeout": 3, "state_dir": tmp, **kw}
    hosts = load(inventory, "gpu", limit)
    return driver_restore(
        hosts, inventory, AUDIT, RestoreOptions(**opts), lease_hosts=load(inventory, "gpu") if fleet_wide else None
    )


def _dpkg(lab: Any, host: str) -> str:
    return str(lab.host_path(host, "/var/lib/dpkg/status").read_text())


def _lease(lab: Any, host: str) -> dict[str, Any] | None:
    path = lab.host_path(host, LEASE)
    return json.loads(path.read_text()) if path.exists() else None


def _lease_op(lab: Any, host: str, op: str, **fields: Any) -> dict[str, Any]:
    """Run the host lease program on a host as another controller would (over SSH)."""
    payload = base64.b64encode(json.dumps({"op": op, **fields}).encode()).decode()
    script = (ROOT / "remediation/hostside/hostlease.py").read_text()
    r = subprocess.run(
        ["ssh", "-F", str(lab.paths.ssh_config), host, "sudo -n python3 - " + shlex.quote(payload)],
        input=script, capture_output=True, text=True, timeout=60, check=False,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --- GPU work that NVML cannot see ---------------------------------------------------------------------------


def test_a_mismatch_host_running_a_job_is_refused_without_force_then_rebooted(fleet: Any, tmp_path: Path) -> None:
    inject(fleet, "gpu-4", "driver-mismatch")
    try:
        job = inject(fleet, "gpu-4", "gpu-job").detail
        pid = job.split()[2]
        inv = _inventory(fleet, tmp_path, gpu_4={"nvidia_driver_expected_version": "535.216.01"})
        boot = fleet.boot_id("gpu-4")
        refused = _restore(inv, "gpu-4", tmp_path)
        o = refused.outcome("gpu-4")
        assert o.decision.action is Action.REBOOT and o.status is HostStatus.LEFT_ALONE, o
        assert f"pid {pid} (python3) holds GPU 0" in o.detail and "--force" in o.detail
        assert refused.exit_code == 1 and fleet.boot_id("gpu-4") == boot
        assert ssh(fleet, "gpu-4", f"test -d /proc/{pid}").returncode == 0  # the job still runs

        forced = _restore(inv, "gpu-4", tmp_path, force=True)
        o = forced.outcome("gpu-4")
        assert forced.exit_code == 0 and o.status is HostStatus.RESTORED, o
        assert fleet.boot_id("gpu-4") != boot
        after = forced.after.host("gpu-4").facts
        assert after.nvml.ok and after.nvml.driver_version == "535.216.01"
    finally:
        fleet.clear("gpu-4")


def test_a_job_on_a_healthy_host_is_listed_by_nvml_and_by_the_device_files(fleet: Any) -> None:
    inject(fleet, "gpu-5", "gpu-job")
    try:
        from remediation.host.audit import run_audit

        facts = run_audit(load(fleet.cfg.inventory_path, "gpu", "gpu-5"), AUDIT).host("gpu-5").facts
        assert facts is not None and facts.nvml.ok
        nvml_pids = {p.pid for g in facts.nvml.gpus for p in g.processes}
        users = {u.pid: u for u in facts.device_users.workloads}
        assert nvml_pids and nvml_pids == set(users)
        assert next(iter(users.values())).gpus == (0,)
    finally:
        fleet.clear("gpu-5")


# --- cordon, methods -----------------------------------------------------------------------------------------


def test_a_cordon_marker_on_the_host_is_read_over_ssh_and_honoured(fleet: Any, tmp_path: Path) -> None:
    inject(fleet, "gpu-2", "kernel-upgrade")
    try:
        assert ssh(fleet, "gpu-2", "mkdir -p /etc/gpufleet && echo 'kernel bisect by alice, ticket 4411' "
                   "> /etc/gpufleet/cordoned").returncode == 0
        before = _dpkg(fleet, "gpu-2")
        result = _restore(fleet.cfg.inventory_path, "gpu-2", tmp_path)
        o = result.outcome("gpu-2")
        assert o.decision.action is Action.SKIP and o.status is HostStatus.LEFT_ALONE
        assert "alice, ticket 4411" in o.detail and result.exit_code == 1
        assert _dpkg(fleet, "gpu-2") == before
    finally:
        fleet.clear("gpu-2")


def test_method_auto_reads_the_inventory_and_an_unknown_method_changes_nothing(fleet: Any, tmp_path: Path) -> None:
    inject(fleet, "gpu-2", "kernel-upgrade")
    try:
        before = _dpkg(fleet, "gpu-2")
        inv = _inventory(fleet, tmp_path, gpu_2={"driver_restore_method": "nvidia-installer"})
        with pytest.raises(Exception, match=r"'nvidia-installer' \(from the inventory's driver_restore_method\)"):
            _restore(inv, "gpu-2", tmp_path, method="auto")
        assert _dpkg(fleet, "gpu-2") == before
        plan = _restore(inv, "gpu-2", tmp_path, method="apt", dry_run=True)  # an explicit method wins
        assert plan.stopped == "preview" and plan.outcome("gpu-2").decision.action is Action.REBUILD
    finally:
        fleet.clear("gpu-2")


def test_the_playbook_follows_driver_restore_method_like_the_cli(fleet: Any, tmp_path: Path) -> None:
    """ansible-playbook on a host marked azure-extension: refused before any change, naming the method."""
    inject(fleet, "gpu-2", "kernel-upgrade")
    try:
        before = _dpkg(fleet, "gpu-2")
        inv = _inventory(fleet, tmp_path, gpu_2={"driver_restore_method": "azure-extension"})
        venv = Path(sys.executable).parent
        r = subprocess.run(
            [str(venv / "ansible-playbook"), "-i", str(inv), "playbooks/driver_restore.yml", "--limit", "gpu-2",
             "-e", "nvidia_driver_restore_allow_reboot=true"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_HOME": str(tmp_path)},
        )
        assert r.returncode != 0
        assert "is restored with azure-extension" in r.stdout and "nothing was changed" in r.stdout, r.stdout[-3000:]
        assert _dpkg(fleet, "gpu-2") == before
        apt = subprocess.run(
            [str(venv / "ansible-playbook"), "-i", str(inv), "playbooks/driver_restore.yml", "--limit", "gpu-2",
             "-e", "nvidia_driver_restore_method=apt", "--check"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_HOME": str(tmp_path)},
        )
        assert apt.returncode == 0 and "with apt" in apt.stdout, apt.stdout[-3000:]
    finally:
        fleet.clear("gpu-2")


# --- leases: two controllers ---------------------------------------------------------------------------------


def test_a_lease_of_another_controller_on_any_fleet_host_refuses_the_run(fleet: Any, tmp_path: Path) -> None:
    inject(fleet, "gpu-2", "kernel-upgrade")
    try:
        other = _lease_op(fleet, "gpu-1", "acquire", run_id="other-run", fleet="gpu", controller="ctl-b",
                          user="bob", pid=4242, ttl_s=600)
        assert other["result"] == "acquired"
        before = _dpkg(fleet, "gpu-2")
        holder = r"holds host gpu-1: run other-run of fleet 'gpu' from ctl-b \(user bob"
        with pytest.raises(LockHeldError, match=holder):
            _restore(fleet.cfg.inventory_path, "gpu-2", tmp_path, fleet_wide=True)
        assert _dpkg(fleet, "gpu-2") == before
        assert _lease(fleet, "gpu-2") is None  # what this run took on the way is given back
        assert (_lease(fleet, "gpu-1") or {}).get("run_id") == "other-run"

        # The other run's lease expires: this run takes it over, restores, and leaves no lease behind.
        _lease_op(fleet, "gpu-1", "release", run_id="other-run")
        stale = _lease_op(fleet, "gpu-1", "acquire", run_id="dead-run", fleet="gpu", controller="ctl-c",
                          user="carol", pid=1, ttl_s=0.01)
        assert stale["result"] == "acquired"
        time.sleep(0.2)
        result = _restore(fleet.cfg.inventory_path, "gpu-2", tmp_path, fleet_wide=True)
        assert result.exit_code == 0, result.outcomes
        assert result.leases is not None and set(result.leases.held) == {f"gpu-{i}" for i in range(1, 6)}
        assert result.leases.took_over["gpu-1"]["run_id"] == "dead-run"
        assert all(_lease(fleet, f"gpu-{i}") is None for i in range(1, 6))
    finally:
        fleet.clear("gpu-2")


def test_expired_lease_is_taken_over_by_exactly_one_of_two_controllers(fleet: Any) -> None:
    assert _lease_op(fleet, "gpu-1", "acquire", run_id="dead", fleet="gpu", ttl_s=0.01)["result"] == "acquired"
    time.sleep(0.1)
    answers: list[dict[str, Any]] = []

    def take(run_id: str) -> None:
        answers.append(_lease_op(fleet, "gpu-1", "acquire", run_id=run_id, fleet="gpu", ttl_s=600))

    threads = [threading.Thread(target=take, args=(f"ctl-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    results = sorted(a["result"] for a in answers)
    assert results == ["held", "held", "held", "took-over"], answers
    winner = next(a for a in answers if a["result"] == "took-over")["lease"]["run_id"]
    assert (_lease(fleet, "gpu-1") or {})["run_id"] == winner
    _lease_op(fleet, "gpu-1", "release", run_id=winner)


def test_leases_are_released_whatever_happens_in_the_block(fleet: Any) -> None:
    hosts = load(fleet.cfg.inventory_path, "gpu")
    with pytest.raises(RuntimeError, match="boom"), host_leases(hosts, run_id="r1", fleet="gpu", ttl_s=60) as leases:
        assert set(leases.held) == {h.name for h in hosts}
        assert (_lease(fleet, "gpu-3") or {})["run_id"] == "r1"
        raise RuntimeError("boom")
    assert all(_lease(fleet, h.name) is None for h in hosts)


# --- the CLI's edges -------------------------------------------------------------------------------------------


def _cli(lab: Any, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    invoke = ROOT / ".venv/bin/invoke"
    return subprocess.run(
        [str(invoke), "driver-restore", "--inventory", str(lab.cfg.inventory_path), *args],
        input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_cli_bad_input_no_terminal_check_and_lock_held(fleet: Any, tmp_path: Path) -> None:
    inject(fleet, "gpu-2", "kernel-upgrade")
    try:
        before, boot = _dpkg(fleet, "gpu-2"), fleet.boot_id("gpu-2")
        env = {"INVOKE_DRIVER_RESTORE_STATE_DIR": str(tmp_path)}
        bad = _cli(fleet, "--limit", "gpu-2", "--batch", "0", "--yes", env=env)
        assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
        assert "--batch 0 must be at least 1" in bad.stderr
        no_tty = _cli(fleet, "--limit", "gpu-2", env=env)
        assert no_tty.returncode == 2 and "no terminal to confirm on: pass --yes, or --check" in no_tty.stderr
        for word in ("--check", "--dry-run"):
            plan = _cli(fleet, "--limit", "gpu-2", word, env=env)
            assert plan.returncode == 0, plan.stderr
            assert "gpu-2" in plan.stdout and "rebuild" in plan.stdout
        assert _lease_op(fleet, "gpu-5", "acquire", run_id="ctl-b-run", fleet="gpu", controller="ctl-b", user="bob",
                         pid=7, ttl_s=600, change="kernel-update")["result"] == "acquired"
        held = _cli(fleet, "--limit", "gpu-2", "--yes", "--allow-reboot", env=env)
        assert held.returncode == 4, held.stdout[-2000:] + held.stderr
        assert "another kernel-update holds host gpu-5: run ctl-b-run" in held.stderr
        assert _dpkg(fleet, "gpu-2") == before and fleet.boot_id("gpu-2") == boot
    finally:
        _lease_op(fleet, "gpu-5", "release", run_id="ctl-b-run")
        fleet.clear("gpu-2")
