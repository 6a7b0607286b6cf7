"""Driver restore runs of several hosts on the lab: batches of more than one host, more than one allowed failure,
a batch that does not finish (playbook timeout, runner crash), and the install path (driver not installed).

One 5-host lab for the module (127.0.63.N); every test breaks the hosts it uses and clears them afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.host.audit import AuditOptions
from remediation.report.restore_view import render_restore_report
from remediation.restore.flow import HostStatus, RestoreHooks, RestoreOptions, driver_restore
from remediation.restore.methods import AptMethod
from remediation.restore.rules import Action
from remediation.transport.inventory import load
from tests.conftest import make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("batches"), "127.0.63", 5)
    try:
        yield lab
    finally:
        lab.down(purge=True)


def _restore(lab: Any, limit: str, tmp: Path, hooks: RestoreHooks | None = None, **kw: Any) -> Any:
    opts = {"allow_reboot": True, "reboot_timeout": 15, "apt_lock_timeout": 3, "state_dir": tmp, **kw}
    inventory = lab.cfg.inventory_path
    return driver_restore(load(inventory, "gpu", limit), inventory, AUDIT, RestoreOptions(**opts), hooks=hooks)


def _dkms_fails(lab: Any, host: str, before: str = "") -> None:
    """DKMS on ``host`` cannot build the module (after running ``before``): GPU-DKMS-001."""
    assert ssh(lab, host, "mv /usr/sbin/dkms /usr/sbin/dkms.real").returncode == 0
    wrapper = lab.host_path(host, "/usr/sbin/dkms")
    wrapper.write_text(
        '#!/bin/sh\ncase "$1" in install|build|autoinstall)\n'
        f"    {before}echo 'Error! Bad return status for module build'; exit 10 ;;\nesac\n"
        'exec /usr/sbin/dkms.real "$@"\n'
    )
    wrapper.chmod(0o755)


def _packages(lab: Any, host: str) -> set[str]:
    """Packages with files on the host: installed, or left half-configured/unpacked by a step cut short."""
    r = ssh(lab, host, "dpkg-query -W -f '${Package} ${Status}\\n'")
    gone = ("not-installed", "config-files")
    return {line.split()[0] for line in r.stdout.splitlines() if line.strip() and line.split()[-1] not in gone}


@pytest.fixture
def broken(fleet: Any) -> Iterator[list[str]]:
    hosts = ["gpu-2", "gpu-4", "gpu-5"]
    for h in hosts:
        inject(fleet, h, "kernel-upgrade")
    yield hosts
    for h in hosts:
        fleet.clear(h)


def test_batches_of_two_and_two_allowed_failures(fleet: Any, broken: list[str], tmp_path: Path) -> None:
    _dkms_fails(fleet, "gpu-4")
    _dkms_fails(fleet, "gpu-5")
    seen: list[list[str]] = []
    result = _restore(fleet, "gpu-2,gpu-4,gpu-5", tmp_path, batch=2, max_failures=2,
                      hooks=RestoreHooks(before_batch=seen.append))
    assert seen == [["gpu-2", "gpu-4"], ["gpu-5"]]  # the second batch ran: one failure is below the limit
    assert result.outcome("gpu-2").status is HostStatus.RESTORED, result.outcomes
    for host in ("gpu-4", "gpu-5"):
        o = result.outcome(host)
        assert o.status is HostStatus.FAILED and "DKMS did not build" in o.detail, o
        assert any("linux-headers-6.5.0-45-generic" in u for u in o.undone), o
        assert "linux-headers-6.5.0-45-generic" not in _packages(fleet, host)
    assert result.stopped is not None and "stopped after 2 failed host(s) (--max-failures 2)" in result.stop_detail
    assert result.exit_code == 1


def test_a_playbook_that_times_out_mid_batch_is_a_host_failure_undone_and_reported(
    fleet: Any, broken: list[str], tmp_path: Path
) -> None:
    # DKMS hangs on gpu-2 for longer than the batch may run; gpu-4 is the next batch and must stay untouched.
    _dkms_fails(fleet, "gpu-2", before="sleep 40; ")
    before_4, boot_4 = _packages(fleet, "gpu-4"), fleet.boot_id("gpu-4")
    result = _restore(fleet, "gpu-2,gpu-4", tmp_path, playbook_timeout=25, apt_lock_timeout=60)
    o = result.outcome("gpu-2")
    assert o.status is HostStatus.FAILED, o
    assert o.where == "apply: did not finish" and "timed out" in o.detail, o
    assert o.changed and any("linux-headers-6.5.0-45-generic" in u for u in o.undone), o
    assert "linux-headers-6.5.0-45-generic" not in _packages(fleet, "gpu-2")
    assert result.exit_code == 1 and result.outcome("gpu-4").status is HostStatus.NOT_STARTED
    assert _packages(fleet, "gpu-4") == before_4 and fleet.boot_id("gpu-4") == boot_4
    report = render_restore_report(result)
    assert "did not finish" in report and "timed out" in report and "Undone after the failure" in report


def test_a_runner_crash_is_a_host_failure_not_bad_input(
    fleet: Any, broken: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(self: AptMethod, decisions: Any, inventory: Any, settings: Any) -> Any:
        raise OSError(28, "No space left on device: ansible-runner artifacts")

    monkeypatch.setattr(AptMethod, "apply", crash)
    result = _restore(fleet, "gpu-2,gpu-4", tmp_path)
    o = result.outcome("gpu-2")
    assert o.status is HostStatus.FAILED and o.where == "apply: did not finish", o
    assert "apt did not finish: OSError" in o.detail and "No space left" in o.detail
    assert result.exit_code == 1 and result.outcome("gpu-4").status is HostStatus.NOT_STARTED
    assert "apt did not finish" in render_restore_report(result)


def test_a_host_without_the_driver_gets_the_expected_version_installed(fleet: Any, tmp_path: Path) -> None:
    try:
        r = ssh(fleet, "gpu-4", "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q nvidia-driver-535 "
                "nvidia-utils-535 libnvidia-compute-535", timeout=300)
        assert r.returncode == 0, r.stderr
        fleet.reboot("gpu-4")
        result = _restore(fleet, "gpu-4", tmp_path)
        o = result.outcome("gpu-4")
        assert o.decision.action is Action.INSTALL and "GPU-DRV-003" in o.decision.findings, o
        assert result.exit_code == 0 and o.status is HostStatus.RESTORED, o
        after = result.after.host("gpu-4").facts
        assert after.nvml.ok and after.nvml.driver_version == "535.183.01"
        assert {"nvidia-driver-535", "libnvidia-compute-535"} <= _packages(fleet, "gpu-4")
    finally:
        fleet.clear("gpu-4")
