"""Package names from the installed driver's branch, whole (``535-server``, ``535-open``), never from its number:
the naming helpers, the restore's decisions and the kernel update's plan on sample host trees of each branch."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from remediation.core.checks import Policy, run_checks
from remediation.core.facts import facts_from_dict
from remediation.core.kernelflavour import (
    branch_number,
    common_branch,
    driver_install_packages,
    is_branch,
    kernel_common_package,
    signed_module_meta,
    signed_module_package,
)
from remediation.kernelupdate.rules import available_query, parse_available, plan_host
from remediation.restore.rules import Action, decide
from tests.unit.test_probe_host import run_probe
from tests.unit.test_secure_boot import AZ_NEW, AZ_OLD, _azure_host

DEB = "535.183.01-0ubuntu0.22.04.1"


@pytest.mark.parametrize(
    ("branch", "common", "driver", "signed"),
    [
        ("535", "nvidia-kernel-common-535", ("nvidia-driver-535", "nvidia-utils-535", "libnvidia-compute-535"),
         "linux-modules-nvidia-535-6.5.0-1025-azure"),
        ("535-server", "nvidia-kernel-common-535-server",
         ("nvidia-driver-535-server", "nvidia-utils-535-server", "libnvidia-compute-535-server"),
         "linux-modules-nvidia-535-server-6.5.0-1025-azure"),
        # -open: its own driver package and signed modules over the proprietary branch's userspace and common
        ("535-open", "nvidia-kernel-common-535",
         ("nvidia-driver-535-open", "nvidia-utils-535", "libnvidia-compute-535"),
         "linux-modules-nvidia-535-open-6.5.0-1025-azure"),
        ("550-server-open", "nvidia-kernel-common-550-server",
         ("nvidia-driver-550-server-open", "nvidia-utils-550-server", "libnvidia-compute-550-server"),
         "linux-modules-nvidia-550-server-open-6.5.0-1025-azure"),
    ],
)
def test_names_follow_the_whole_branch(branch: str, common: str, driver: tuple[str, ...], signed: str) -> None:
    assert is_branch(branch) and branch_number(branch) == branch.split("-")[0]
    assert kernel_common_package(branch) == common
    assert driver_install_packages(branch) == driver
    assert signed_module_package(branch, AZ_NEW) == signed
    assert signed_module_meta(branch, "azure") == f"linux-modules-nvidia-{branch}-azure"
    assert common_branch(branch) == common.removeprefix("nvidia-kernel-common-")


@pytest.mark.parametrize("bad", ["", None, "535-", "server", "535-open-server", "535 ; rm", "535-server\n"])
def test_what_is_not_a_branch(bad: str | None) -> None:
    assert not is_branch(bad)


def _branch_host(tmp_path: Path, branch: str, *, secure_boot: bool, booted: str = AZ_NEW) -> Any:
    """An azure host whose driver packages are those of ``branch`` (Ubuntu's names), booted into ``booted``."""
    root = _azure_host(tmp_path, secure_boot=secure_boot, signed_new=False)
    status = root / "var/lib/dpkg/status"
    common = common_branch(branch)
    text = status.read_text()
    for name in ("nvidia-driver", "nvidia-dkms"):
        text = text.replace(f"Package: {name}-535\n", f"Package: {name}-{branch}\n")
    for name in ("nvidia-kernel-common", "libnvidia-compute", "nvidia-utils"):
        text = text.replace(f"Package: {name}-535\n", f"Package: {name}-{common}\n")
    if booted == AZ_OLD:  # only the booted kernel installed: 1025 is what apt offers
        shutil.rmtree(root / "lib/modules" / AZ_NEW, ignore_errors=True)
        text = "\n\n".join(s for s in text.split("\n\n") if AZ_NEW not in s)
    status.write_text(text)
    doc = run_probe("--root", str(root), "--kernel-release", booted, "--skip-nvml")
    if booted == AZ_NEW:  # S1: the new kernel has no module
        doc["nvml"] = {"ok": False, "error_class": "driver_not_loaded", "error": "Driver Not Loaded", "error_code": 9}
    else:
        doc["nvml"] = {"ok": True, "error_class": "none", "driver_version": "535.183.01", "device_count": 0,
                       "gpus": []}
    doc["device_users"] = {"users": [], "unreadable": 0}
    return facts_from_dict(doc, host="h")


@pytest.mark.parametrize("branch", ["535-server", "535-open"])
def test_the_probe_reports_the_whole_branch(tmp_path: Path, branch: str) -> None:
    facts = _branch_host(tmp_path, branch, secure_boot=True)
    assert facts.packages.driver_branch == branch
    assert facts.packages.driver_package == f"nvidia-driver-{branch}"


@pytest.mark.parametrize("branch", ["535-server", "535-open"])
def test_s1_restore_under_secure_boot_names_the_branch_signed_package(tmp_path: Path, branch: str) -> None:
    facts = _branch_host(tmp_path, branch, secure_boot=True)
    # The inventory's branch is for installs only: the signed module follows the installed driver.
    d = decide("h", facts, run_checks(facts, Policy()), {"nvidia_driver_expected_version": "535.183.01"})
    assert d.action is Action.REBUILD and d.module_source == "signed"
    assert d.install_packages == (f"linux-modules-nvidia-{branch}-{AZ_NEW}",)
    assert d.driver_package == f"nvidia-driver-{branch}"
    names = " ".join((*d.install_packages, *d.hold_packages, *d.steps))
    assert not re.search(rf"linux-modules-nvidia-535-{re.escape(AZ_NEW)}", names), names


def test_a_missing_driver_is_installed_from_the_inventory_branch(tmp_path: Path) -> None:
    facts = _branch_host(tmp_path, "535-server", secure_boot=False)
    doc = dict(facts.raw)
    doc["packages"] = dict(doc["packages"], nvidia={}, driver_package=None, driver_package_version=None,
                           driver_branch=None)
    gone = facts_from_dict(doc, host="h")
    vars_ = {"nvidia_driver_expected_version": "535.183.01", "nvidia_driver_branch": "535-server"}
    d = decide("h", gone, run_checks(gone, Policy()), vars_)
    assert "GPU-DRV-003" in d.findings and d.action is Action.INSTALL
    assert d.driver_package == "nvidia-driver-535-server"
    assert d.install_packages == ("nvidia-driver-535-server", "nvidia-utils-535-server",
                                  "libnvidia-compute-535-server")
    open_vars = dict(vars_, nvidia_driver_branch="535-open")
    d_open = decide("h", gone, run_checks(gone, Policy()), open_vars)
    assert d_open.install_packages == ("nvidia-driver-535-open", "nvidia-utils-535", "libnvidia-compute-535")
    # No branch in the inventory and nothing on the host to name one: 535.183.01 alone is three branches.
    d_none = decide("h", gone, run_checks(gone, Policy()), {"nvidia_driver_expected_version": "535.183.01"})
    assert d_none.action is Action.MANUAL and "set nvidia_driver_branch" in (d_none.blocked or "")
    bad = decide("h", gone, run_checks(gone, Policy()), dict(vars_, nvidia_driver_branch="535; reboot"))
    assert bad.action is Action.MANUAL and "not a driver branch" in (bad.blocked or "")


def test_a_missing_driver_takes_the_branch_its_leftovers_name(tmp_path: Path) -> None:
    facts = _branch_host(tmp_path, "535-server", secure_boot=False)
    doc = dict(facts.raw)
    left = {"nvidia-kernel-common-535-server": DEB}
    doc["packages"] = dict(doc["packages"], nvidia=left, driver_package="nvidia-kernel-common-535-server",
                           driver_package_version="535.183.01", driver_branch="535-server")
    # The driver and its userspace were purged: NVML's library is gone (GPU-DRV-003), nvidia-kernel-common stays.
    doc["nvml"] = {"ok": False, "error_class": "library_not_found", "error": "libnvidia-ml.so.1: cannot open"}
    gone = facts_from_dict(doc, host="h")
    d = decide("h", gone, run_checks(gone, Policy()), {"nvidia_driver_expected_version": "535.183.01"})
    assert "GPU-DRV-003" in d.findings
    assert d.action is Action.INSTALL and d.driver_package == "nvidia-driver-535-server", d
    # ... but a leftover of another branch number is no answer for 550
    d_550 = decide("h", gone, run_checks(gone, Policy()), {"nvidia_driver_expected_version": "550.54.15"})
    assert d_550.action is Action.MANUAL and "550-server" in (d_550.blocked or ""), d_550


def _show(branch: str) -> str:
    common = kernel_common_package(branch)
    pkg = signed_module_package(branch, AZ_NEW)
    return (
        f"Package: linux-image-{AZ_NEW}\nVersion: 6.5.0-1025.26~22.04.1\n"
        f"Package: {pkg}\nVersion: 6.5.0-1025.26~22.04.1+1\n"
        f"Depends: linux-image-{AZ_NEW}, {common} (>= 535.216.01), {common} (<= 535.216.01-1)\n"
        f"Package: {pkg}\nVersion: 6.5.0-1025.26~22.04.1\n"
        f"Depends: linux-image-{AZ_NEW}, {common} (>= 535.183.01), {common} (<= 535.183.01-1)\n"
        # the plain branch's package is offered too: it belongs to another driver
        f"Package: linux-modules-nvidia-535-{AZ_NEW}\nVersion: 6.5.0-1025.26~22.04.1\n"
        f"Depends: linux-image-{AZ_NEW}, nvidia-kernel-common-535 (>= 535.183.01)\n"
    )


@pytest.mark.parametrize("branch", ["535-server", "535-open"])
def test_kernel_update_plan_names_the_branch_signed_build(tmp_path: Path, branch: str) -> None:
    facts = _branch_host(tmp_path, branch, secure_boot=True, booted=AZ_OLD)
    assert f"linux-modules-nvidia-{branch}-\"$r\"" in available_query("azure", facts.packages.driver_branch)
    p = plan_host("h", facts, run_checks(facts, Policy()), {}, parse_available(_show(branch)))
    assert p.changes_host and p.module_source == "signed", p
    package = f"linux-modules-nvidia-{branch}-{AZ_NEW}"
    assert p.install_specs == (f"linux-image-{AZ_NEW}", f"{package}=6.5.0-1025.26~22.04.1")
    assert package in p.hold_packages
    assert f"linux-modules-nvidia-535-{AZ_NEW}" not in (*p.install_packages, *p.hold_packages)
