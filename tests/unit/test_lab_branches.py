"""The lab's driver branches (pure): the repository's packages of each branch in Ubuntu's names and dependency shapes,
and which branch a new host gets (flag, lab.driver_branch, host_overrides)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab import packages
from lab.config import LabConfig
from lab.errors import LabError

AZ = "6.5.0-1025-azure"


def _by_name(branch: str) -> dict[str, packages.Package]:
    out = {}
    for pocket, upstream in zip(packages.DRIVER_POCKETS, packages.DRIVERS, strict=True):
        for p in packages.driver_packages(upstream, Path("/x"), pocket, Path("/y"), branch):
            out.setdefault(p.name, p)
        for p in packages.signed_module_packages(AZ, upstream, pocket, branch):
            out.setdefault(p.name, p)
    return out


def test_server_branch_has_its_own_packages_and_module_directory() -> None:
    pkgs = _by_name("535-server")
    assert {"nvidia-driver-535-server", "nvidia-dkms-535-server", "nvidia-kernel-common-535-server",
            "nvidia-utils-535-server", "libnvidia-compute-535-server",
            f"linux-modules-nvidia-535-server-{AZ}", "linux-modules-nvidia-535-server-azure"} == set(pkgs)
    signed = pkgs[f"linux-modules-nvidia-535-server-{AZ}"]
    assert "nvidia-kernel-common-535-server (>= 535.183.01)" in signed.depends
    assert f"/lib/modules/{AZ}/kernel/nvidia-535srv/nvidia.ko" in signed.files
    meta = pkgs["linux-modules-nvidia-535-server-azure"]
    assert meta.depends == (f"linux-modules-nvidia-535-server-{AZ} (= {signed.version})",)
    driver = pkgs["nvidia-driver-535-server"]
    assert f"nvidia-dkms-535-server (= {driver.version})" in driver.depends
    assert not any(d.startswith(("nvidia-utils-535 ", "nvidia-kernel-common-535 ")) for d in driver.depends)


def test_open_branch_shares_the_plain_userspace_and_kernel_common() -> None:
    pkgs = _by_name("535-open")
    assert {"nvidia-driver-535-open", "nvidia-dkms-535-open", f"linux-modules-nvidia-535-open-{AZ}",
            "linux-modules-nvidia-535-open-azure"} == set(pkgs)
    assert "nvidia-kernel-common-535 (= 535.183.01-0ubuntu0.22.04.1)" in pkgs["nvidia-driver-535-open"].depends
    signed = pkgs[f"linux-modules-nvidia-535-open-{AZ}"]
    assert "nvidia-kernel-common-535 (>= 535.183.01)" in signed.depends
    assert f"/lib/modules/{AZ}/kernel/nvidia-535-open/nvidia.ko" in signed.files


def test_branches_conflict_so_apt_swaps_them(tmp_path: Path) -> None:
    plain, server = _by_name("535"), _by_name("535-server")
    for name in ("nvidia-driver", "nvidia-dkms", "nvidia-utils", "libnvidia-compute", "nvidia-kernel-common"):
        a, b = plain[f"{name}-535"], server[f"{name}-535-server"]
        assert set(a.conflicts) & set(b.provides) and set(b.conflicts) & set(a.provides), name
    deb = packages.build_deb(server["nvidia-kernel-common-535-server"], tmp_path)
    info = subprocess.run(["dpkg-deb", "-f", str(deb), "Provides", "Conflicts", "Replaces"], capture_output=True,
                          text=True, check=True).stdout
    assert "Provides: nvidia-kernel-common" in info
    assert "Conflicts: nvidia-kernel-common" in info and "Replaces: nvidia-kernel-common" in info


def test_the_repository_offers_every_branch_once() -> None:
    names = [(p.name, p.version) for p in packages.all_packages(lambda v: Path("/x"), Path("/y"))]
    assert len(names) == len(set(names))  # -open does not build the plain branch's userspace twice
    for branch in packages.DRIVER_BRANCHES:
        assert (f"nvidia-driver-{branch}", packages.driver_version(packages.BOOT_DRIVER)) in names


def test_branch_follows_host_overrides_then_the_flag_then_the_config() -> None:
    assert LabConfig().host_driver_branch("gpu-1") == "535"
    assert LabConfig(driver_branch="535-open").host_driver_branch("gpu-1") == "535-open"
    assert LabConfig(driver_branch="535-open").host_driver_branch("gpu-1", "535-server") == "535-server"
    cfg = LabConfig(host_overrides={"gpu-2": {"nvidia_driver_branch": "535-server"}})
    assert cfg.host_driver_branch("gpu-2", "535-open") == "535-server"  # the inventory will say 535-server
    assert cfg.host_driver_branch("gpu-1", "535-open") == "535-open"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"driver_branch": "470"}, "driver branch '470' .* is not one the lab has"),
        ({"host_overrides": {"gpu-1": {"nvidia_driver_branch": "535-srv"}}}, "host_overrides.gpu-1"),
    ],
)
def test_bad_branch_settings_are_named(setting: dict[str, object], message: str) -> None:
    with pytest.raises(LabError, match=message):
        LabConfig.from_mapping(setting)
    assert LabConfig.from_mapping({"driver_branch": 535}).driver_branch == "535"  # YAML reads 535 as a number
