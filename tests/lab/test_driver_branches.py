"""Driver branches on the lab: Trusted Launch (Secure Boot) azure hosts of the ``535-server`` and ``535-open`` branches
with Ubuntu's packages; the kernel update's plan and the S1 restore name the host's own signed module package.

One 2-host lab for the module, both Secure Boot on: gpu-1 runs ``535-server`` (``lab.up --driver-branch``), gpu-2
``535-open`` (its ``host_overrides`` entry). Read-only checks run first; gpu-2 then gets the driver-mismatch fault,
gpu-1 is broken the S1 way and restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.faults import inject
from remediation.host.audit import AuditOptions, run_audit
from remediation.kernelupdate.flow import KernelUpdateOptions, kernel_update
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore
from remediation.restore.rules import Action
from remediation.transport.inventory import load
from tests.conftest import make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
AZURE_OLD, AZURE_NEW = "6.5.0-1024-azure", "6.5.0-1025-azure"
BRANCHES = {"gpu-1": "535-server", "gpu-2": "535-open"}
MODULE_DIRS = {"535-server": "kernel/nvidia-535srv", "535-open": "kernel/nvidia-535-open"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    tmp = tmp_path_factory.mktemp("branches")
    lab = make_lab(tmp, "127.0.67", 2, flavour="azure", secure_boot=True, driver_branch="535-server",
                   host_overrides={"gpu-2": {"nvidia_driver_branch": "535-open"}})
    try:
        yield lab
    finally:
        lab.down(purge=True)


def _hosts(lab: Any, limit: str | None = None) -> list[Any]:
    return load(lab.cfg.inventory_path, "gpu", limit)


def _installed(lab: Any, host: str) -> dict[str, str]:
    out = ssh(lab, host, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n'")
    assert out.returncode == 0, out.stderr
    return {p: v for p, v, s in (line.split() for line in out.stdout.splitlines()) if s == "installed"}


def test_each_host_runs_its_branch_with_ubuntus_packages(fleet: Any) -> None:
    inventory = yaml.safe_load(fleet.cfg.inventory_path.read_text())["all"]["children"]["gpu"]["hosts"]
    for host, branch in BRANCHES.items():
        assert inventory[host]["nvidia_driver_branch"] == branch
        pkgs = _installed(fleet, host)
        common = branch.removesuffix("-open")
        assert {f"nvidia-driver-{branch}", f"nvidia-dkms-{branch}", f"nvidia-kernel-common-{common}",
                f"nvidia-utils-{common}", f"linux-modules-nvidia-{branch}-{AZURE_OLD}",
                f"linux-modules-nvidia-{branch}-azure"} <= set(pkgs), sorted(pkgs)
        assert "nvidia-driver-535" not in pkgs and "nvidia-dkms-535" not in pkgs
        audit = run_audit(_hosts(fleet, host), AUDIT).host(host)
        assert audit.facts is not None and audit.facts.nvml.ok, audit.error
        assert audit.facts.secure_boot.enabled is True
        assert audit.facts.packages.driver_branch == branch
        assert audit.facts.packages.driver_package == f"nvidia-driver-{branch}"
        module = audit.facts.booted_kernel.nvidia_module if audit.facts.booted_kernel else None
        assert module is not None and module.signed is True and module.source == "package"
        assert module.path == f"/lib/modules/{AZURE_OLD}/{MODULE_DIRS[branch]}/nvidia.ko"


def test_kernel_update_plans_the_branch_signed_package(fleet: Any, tmp_path: Path) -> None:
    opts = KernelUpdateOptions(allow_reboot=True, reboot_timeout=30, apt_lock_timeout=10, state_dir=tmp_path,
                               dry_run=True)
    result = kernel_update(_hosts(fleet), fleet.cfg.inventory_path, AUDIT, opts)
    for host, branch in BRANCHES.items():
        plan = result.outcome(host).plan
        assert plan.module_source == "signed" and plan.target_kernel == AZURE_NEW, plan
        package = f"linux-modules-nvidia-{branch}-{AZURE_NEW}"
        assert plan.install_packages == (f"linux-image-{AZURE_NEW}", package)
        assert plan.install_specs[1] == f"{package}=6.5.0-1025.26~22.04.1"  # the build for 535.183.01
        assert package in plan.hold_packages
        assert f"linux-modules-nvidia-535-{AZURE_NEW}" not in (*plan.install_packages, *plan.hold_packages)
    assert set(_installed(fleet, "gpu-1")) >= {f"linux-modules-nvidia-535-server-{AZURE_OLD}"}
    assert f"linux-image-{AZURE_NEW}" not in _installed(fleet, "gpu-1")  # --check changed nothing


def test_driver_mismatch_fault_on_the_open_branch(fleet: Any) -> None:
    inject(fleet, "gpu-2", "driver-mismatch")
    pkgs = _installed(fleet, "gpu-2")
    assert pkgs["nvidia-driver-535-open"].startswith("535.216.01") and pkgs["nvidia-utils-535"].startswith("535.216.01")
    audit = run_audit(_hosts(fleet, "gpu-2"), AUDIT).host("gpu-2")
    assert "GPU-DRV-002" in {f.id for f in audit.findings}


def test_s1_on_a_secure_boot_server_host_is_restored_with_the_server_signed_package(
    fleet: Any, tmp_path: Path
) -> None:
    # Held, the flavour's signed-module meta-package does not bring 1025's module along: unattended-upgrade installs
    # the kernel alone and the host reboots into a kernel without a module (S1).
    hold = ssh(fleet, "gpu-1", "apt-mark hold linux-modules-nvidia-535-server-azure")
    assert hold.returncode == 0, hold.stderr
    inject(fleet, "gpu-1", "kernel-upgrade")
    before = run_audit(_hosts(fleet, "gpu-1"), AUDIT).host("gpu-1")
    assert before.facts is not None and before.facts.system.kernel == AZURE_NEW
    assert not before.facts.nvml.ok and "GPU-DRV-001" in {f.id for f in before.findings}
    opts = RestoreOptions(allow_reboot=True, reboot_timeout=30, apt_lock_timeout=10, state_dir=tmp_path)
    result = driver_restore(_hosts(fleet, "gpu-1"), fleet.cfg.inventory_path, AUDIT, opts)
    o = result.outcome("gpu-1")
    assert o.decision.action is Action.REBUILD and o.decision.module_source == "signed", o.decision
    assert o.decision.install_packages == (f"linux-modules-nvidia-535-server-{AZURE_NEW}",)
    assert o.status is HostStatus.RESTORED, (o.where, o.detail)
    assert result.exit_code == 0
    pkgs = _installed(fleet, "gpu-1")
    assert f"linux-modules-nvidia-535-server-{AZURE_NEW}" in pkgs
    assert not [p for p in pkgs if p.startswith("linux-modules-nvidia-535-") and "-server" not in p]
    after = run_audit(_hosts(fleet, "gpu-1"), AUDIT).host("gpu-1")
    assert after.facts is not None and after.facts.nvml.ok and after.facts.nvml.driver_version == "535.183.01"
    assert after.facts.system.kernel == AZURE_NEW
    module = after.facts.booted_kernel.nvidia_module if after.facts.booted_kernel else None
    assert module is not None and module.signed is True
    assert module.path == f"/lib/modules/{AZURE_NEW}/kernel/nvidia-535srv/nvidia.ko"
