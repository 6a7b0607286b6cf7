"""``invoke kernel-update`` on the lab, both flavours: real apt, DKMS stand-in, signed module packages, Secure Boot,
GRUB (update-grub, grub-set-default, grub-reboot) and reboots.

Two module-scoped labs, each driven once and inspected by several tests:
- generic, Secure Boot off: gpu-1 healthy (moves, DKMS), gpu-2 with ``dkms-build-fail`` (stopped at gate 1, still
  healthy on its kernel), gpu-3 with ``new-kernel-panic`` (the trial boot panics, the host comes back on its old kernel
  by itself, the run undoes and writes the incident report). One run, all three in one batch.
- azure, Secure Boot on (Trusted Launch): gpu-2 under ``module_source: dkms`` (stopped at gate 1: unsigned), then
  gpu-1 and gpu-2 with ``auto`` (the signed precompiled module: both move, one batch each); gpu-3 broken the S1 way
  (its signed-module meta-package held, so the new kernel comes alone) is restored by ``driver-restore`` with the
  signed package.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.host.audit import AuditOptions, run_audit
from remediation.kernelupdate.flow import KernelStatus, KernelUpdateOptions, kernel_update
from remediation.report.kernel_update_view import render_kernel_report
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore
from remediation.transport.inventory import load
from tests.conftest import make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
GENERIC_OLD, GENERIC_NEW = "6.5.0-44-generic", "6.5.0-45-generic"
AZURE_OLD, AZURE_NEW = "6.5.0-1024-azure", "6.5.0-1025-azure"


def _hosts(lab: Any, limit: str | None = None) -> list[Any]:
    return load(lab.cfg.inventory_path, "gpu", limit)


def _update(lab: Any, tmp: Path, limit: str | None = None, **kw: Any) -> Any:
    opts = {"allow_reboot": True, "reboot_timeout": 30, "apt_lock_timeout": 10, "state_dir": tmp, **kw}
    return kernel_update(_hosts(lab, limit), lab.cfg.inventory_path, AUDIT, KernelUpdateOptions(**opts))


def _host(lab: Any, host: str, command: str) -> str:
    proc = ssh(lab, host, command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _boot_state(lab: Any, host: str) -> dict[str, Any]:
    return {
        "kernel": _host(lab, host, "uname -r"),
        "grub_default": _host(lab, host, "grep ^GRUB_DEFAULT= /etc/default/grub"),
        "saved": _host(lab, host, "sed -n 's/^saved_entry=//p' /boot/grub/grubenv"),
        "kernels": _host(lab, host, "ls /boot").split(),
        "held": set(_host(lab, host, "apt-mark showhold").split()),
    }


@pytest.fixture(scope="module")
def generic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, Any]]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("kernel-generic")
    lab = make_lab(tmp, "127.0.64", 3, flavour="generic", secure_boot=False)
    try:
        inject(lab, "gpu-2", "dkms-build-fail")
        inject(lab, "gpu-3", "new-kernel-panic")
        before = {h: _boot_state(lab, h) for h in ("gpu-1", "gpu-2", "gpu-3")}
        check = _update(lab, tmp, dry_run=True)
        after_check = {h: _boot_state(lab, h) for h in ("gpu-1", "gpu-2", "gpu-3")}
        result = _update(lab, tmp, batch=3, max_failures=3)
        yield lab, {"before": before, "check": check, "after_check": after_check, "result": result,
                    "after": {h: _boot_state(lab, h) for h in ("gpu-1", "gpu-2", "gpu-3")}}
    finally:
        lab.down(purge=True)


def test_check_prints_the_plan_and_changes_nothing(generic: tuple[Any, dict[str, Any]]) -> None:
    _lab, runs = generic
    check = runs["check"]
    assert check.stopped == "preview" and check.exit_code == 0
    for plan in check.plan:
        assert plan.changes_host and plan.flavour == "generic" and plan.secure_boot is False
        assert (plan.booted_kernel, plan.target_kernel, plan.module_source) == (GENERIC_OLD, GENERIC_NEW, "dkms")
        assert plan.install_packages == (f"linux-image-{GENERIC_NEW}", f"linux-headers-{GENERIC_NEW}")
        assert any(step.startswith("gate 1:") for step in plan.steps)
        assert any("grub-reboot" in step for step in plan.steps)
    assert runs["after_check"] == runs["before"]


def test_a_healthy_generic_host_moves_with_dkms(generic: tuple[Any, dict[str, Any]]) -> None:
    lab, runs = generic
    o = runs["result"].outcome("gpu-1")
    assert o.status is KernelStatus.MOVED, (o.where, o.detail)
    state = runs["after"]["gpu-1"]
    assert state["kernel"] == GENERIC_NEW
    assert state["grub_default"] == "GRUB_DEFAULT=saved"
    assert state["saved"] == f"Advanced options for Ubuntu>Ubuntu, with Linux {GENERIC_NEW}"
    held = {f"linux-image-{GENERIC_NEW}", f"linux-headers-{GENERIC_NEW}", f"linux-modules-{GENERIC_NEW}"}
    assert held <= state["held"]
    audit = run_audit(_hosts(lab, "gpu-1"), AUDIT).host("gpu-1")
    assert audit.facts is not None and audit.facts.nvml.ok and audit.facts.system.kernel == GENERIC_NEW
    # It stays there: the next boot uses the saved default, not a one-shot entry.
    lab.reboot("gpu-1")
    assert _host(lab, "gpu-1", "uname -r") == GENERIC_NEW


def test_a_dkms_build_failure_stops_at_gate_1_and_leaves_the_host_healthy(generic: tuple[Any, dict[str, Any]]) -> None:
    lab, runs = generic
    o = runs["result"].outcome("gpu-2")
    assert o.status is KernelStatus.FAILED
    assert "Gate 1" in (o.where or "") and "no NVIDIA module" in o.detail and "Error 2" in o.detail
    assert "nothing was rebooted" in o.detail
    assert o.undone == (
        f"remove linux-image-{GENERIC_NEW}, linux-headers-{GENERIC_NEW}, linux-modules-{GENERIC_NEW}",
    )
    assert runs["after"]["gpu-2"] == runs["before"]["gpu-2"]
    audit = run_audit(_hosts(lab, "gpu-2"), AUDIT).host("gpu-2")
    assert audit.facts is not None and audit.facts.nvml.ok and audit.healthy is False  # unhardened, but GPUs work
    assert not [f for f in audit.findings if f.severity.value == "critical"]


def test_a_kernel_that_panics_falls_back_to_the_old_one_with_an_incident_report(
    generic: tuple[Any, dict[str, Any]],
) -> None:
    lab, runs = generic
    result = runs["result"]
    o = result.outcome("gpu-3")
    assert o.status is KernelStatus.FAILED
    assert "came back on " + GENERIC_OLD in o.detail and "Kernel panic - not syncing" in o.detail
    assert "put back GRUB_DEFAULT=0" in "; ".join(o.undone)
    state = runs["after"]["gpu-3"]
    assert state["kernel"] == GENERIC_OLD and state["grub_default"] == "GRUB_DEFAULT=0"
    assert f"vmlinuz-{GENERIC_NEW}" not in state["kernels"]
    report = render_kernel_report(result)
    section = report.split("## gpu-3", 1)[1]
    for title in ("### Symptoms", "### Diagnosis", "### Root cause", "### Resolution", "### Prevention"):
        assert title in section
    assert "Kernel panic" in section and "Undone after the failure" in section
    assert result.exit_code == 1
    lab.reboot("gpu-3")  # the old kernel stays the one it boots
    assert _host(lab, "gpu-3", "uname -r") == GENERIC_OLD


@pytest.fixture(scope="module")
def trusted_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, Any]]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("kernel-azure")
    lab = make_lab(tmp, "127.0.65", 3, flavour="azure", secure_boot=True)
    try:
        dkms = _update(lab, tmp, limit="gpu-2", module_source="dkms")
        after_dkms = _boot_state(lab, "gpu-2")
        signed = _update(lab, tmp, limit="gpu-1,gpu-2", batch=1, max_failures=1)
        yield lab, {"dkms": dkms, "after_dkms": after_dkms, "signed": signed, "tmp": tmp}
    finally:
        lab.down(purge=True)


def test_an_unsigned_module_on_a_secure_boot_host_stops_at_gate_1(
    trusted_launch: tuple[Any, dict[str, Any]],
) -> None:
    _lab, runs = trusted_launch
    o = runs["dkms"].outcome("gpu-2")
    assert o.plan.secure_boot is True and o.plan.module_source == "dkms"
    assert o.status is KernelStatus.FAILED and "Gate 1" in (o.where or "")
    assert "unsigned and Secure Boot is on" in o.detail and "Key was rejected by service" in o.detail
    assert runs["after_dkms"]["kernel"] == AZURE_OLD
    assert f"vmlinuz-{AZURE_NEW}" not in runs["after_dkms"]["kernels"]


def test_the_signed_module_moves_secure_boot_hosts_of_the_azure_flavour(
    trusted_launch: tuple[Any, dict[str, Any]],
) -> None:
    lab, runs = trusted_launch
    result = runs["signed"]
    for host in ("gpu-1", "gpu-2"):
        o = result.outcome(host)
        assert o.plan.flavour == "azure" and o.plan.module_source == "signed"
        assert "Secure Boot is on" in o.plan.module_source_reason
        assert o.plan.install_packages == (f"linux-image-{AZURE_NEW}", f"linux-modules-nvidia-535-{AZURE_NEW}")
        assert o.status is KernelStatus.MOVED, (o.where, o.detail)
        state = _boot_state(lab, host)
        assert state["kernel"] == AZURE_NEW
        assert f"linux-modules-nvidia-535-{AZURE_NEW}" in state["held"]
        audit = run_audit(_hosts(lab, host), AUDIT).host(host)
        assert audit.facts is not None and audit.facts.nvml.ok and audit.facts.secure_boot.enabled is True
        assert audit.facts.booted_kernel is not None
        assert audit.facts.booted_kernel.nvidia_module.source == "package"
        assert audit.facts.booted_kernel.nvidia_module.signed is True
    assert result.exit_code == 0


def test_driver_restore_uses_the_signed_package_on_a_secure_boot_host(
    trusted_launch: tuple[Any, dict[str, Any]],
) -> None:
    lab, runs = trusted_launch
    # The signed module's meta-package would bring 1025's module along with the kernel (as on Ubuntu); held, it does
    # not: unattended-upgrade installs 1025 alone and the host reboots into a kernel without a module (S1).
    _host(lab, "gpu-3", "apt-mark hold linux-modules-nvidia-535-azure")
    inject(lab, "gpu-3", "kernel-upgrade")
    before = run_audit(_hosts(lab, "gpu-3"), AUDIT).host("gpu-3")
    assert before.facts is not None and before.facts.system.kernel == AZURE_NEW
    assert "GPU-DRV-001" in {f.id for f in before.findings}
    opts = RestoreOptions(allow_reboot=True, reboot_timeout=30, apt_lock_timeout=10, state_dir=runs["tmp"])
    result = driver_restore(_hosts(lab, "gpu-3"), lab.cfg.inventory_path, AUDIT, opts)
    o = result.outcome("gpu-3")
    assert o.decision.module_source == "signed" and "Secure Boot is on" in o.decision.reason
    assert o.status is HostStatus.RESTORED, (o.where, o.detail)
    after = run_audit(_hosts(lab, "gpu-3"), AUDIT).host("gpu-3")
    assert after.facts is not None and after.facts.nvml.ok
    assert after.facts.booted_kernel is not None and after.facts.booted_kernel.nvidia_module.signed is True


def test_a_host_that_changes_after_the_plan_is_refused_unchanged(generic: tuple[Any, dict[str, Any]]) -> None:
    """The play takes the printed plan and checks again what may change: a job started after the plan was shown."""
    lab, runs = generic
    before = _boot_state(lab, "gpu-2")

    def start_a_job(plan: Any) -> bool:
        inject(lab, "gpu-2", "gpu-job")
        return True

    opts = KernelUpdateOptions(allow_reboot=True, reboot_timeout=30, apt_lock_timeout=10,
                               state_dir=runs["check"].options.state_dir)
    result = kernel_update(_hosts(lab, "gpu-2"), lab.cfg.inventory_path, AUDIT, opts, confirm=start_a_job)
    o = result.outcome("gpu-2")
    assert o.plan.changes_host and o.status is KernelStatus.FAILED
    assert "changed since the plan was printed" in o.detail and "nothing was changed" in o.detail
    assert o.changed == () and _boot_state(lab, "gpu-2") == before
