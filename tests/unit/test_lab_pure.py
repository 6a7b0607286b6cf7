"""Pure parts of the lab: boot-loader choice, hardware state, package versions, settings validation."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab import boot, hardware, packages
from lab.config import LabConfig
from remediation.errors import LabError


def _root(tmp_path: Path, kernels: list[str], grub: str | None = None) -> Path:
    (tmp_path / "boot").mkdir()
    for k in kernels:
        (tmp_path / "boot" / f"vmlinuz-{k}").write_text("")
    if grub is not None:
        (tmp_path / "etc/default").mkdir(parents=True)
        (tmp_path / "etc/default/grub").write_text(grub)
    return tmp_path


def test_boots_newest_kernel_by_version_not_by_text(tmp_path: Path) -> None:
    root = _root(tmp_path, ["6.5.0-9-generic", "6.5.0-45-generic", "6.5.0-100-generic"])
    assert boot.choose_kernel(root) == "6.5.0-100-generic"


def test_grub_default_pins_an_installed_kernel(tmp_path: Path) -> None:
    grub = 'GRUB_DEFAULT=0\nGRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-44-generic"\n'
    root = _root(tmp_path, ["6.5.0-44-generic", "6.5.0-45-generic"], grub)
    assert boot.choose_kernel(root) == "6.5.0-44-generic"


def test_grub_default_naming_a_removed_kernel_falls_back_to_newest(tmp_path: Path) -> None:
    grub = "GRUB_DEFAULT='Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-41-generic'\n"
    root = _root(tmp_path, ["6.5.0-44-generic", "6.5.0-45-generic"], grub)
    assert boot.choose_kernel(root) == "6.5.0-45-generic"


def test_module_version_read_from_the_built_module(tmp_path: Path) -> None:
    ko = tmp_path / "lib/modules/6.5.0-44-generic/updates/dkms/nvidia.ko"
    ko.parent.mkdir(parents=True)
    ko.write_text("filename: x\nversion:        535.183.01\n")
    assert boot.module_version(tmp_path, "6.5.0-44-generic") == "535.183.01"
    assert boot.module_version(tmp_path, "6.5.0-45-generic") is None


def test_no_nvidia_module_boot_log_says_so(tmp_path: Path) -> None:
    lines = [text for _, text in boot.kmsg_lines("6.5.0-45-generic", None, {}, "abcdef01")]
    assert "systemd-modules-load[312]: Failed to find module 'nvidia'" in lines
    assert not any(text.startswith("NVRM:") for text in lines)


def test_healthy_state_matches_the_vm_size() -> None:
    state = hardware.healthy_state("gpu-1", "Standard_ND96asr_v4")
    assert hardware.gpu_count(state) == 8
    assert state["gpu.7.name"] == "NVIDIA A100-SXM4-40GB"
    assert state["gpu.0.uuid"] != hardware.healthy_state("gpu-2", "Standard_ND96asr_v4")["gpu.0.uuid"]
    assert state == hardware.healthy_state("gpu-1", "Standard_ND96asr_v4")  # stable across runs
    assert hardware.pci_short(state, 1) == "0002:00:00"
    assert hardware.pci_long(state, 1) == "0002:00:00.0"


def test_unknown_vm_size_is_named() -> None:
    with pytest.raises(LabError, match="unknown VM size 'Standard_Z1'"):
        hardware.healthy_state("gpu-1", "Standard_Z1")


def test_hardware_state_round_trips_and_rejects_injection(tmp_path: Path) -> None:
    path = tmp_path / "gpus"
    state = hardware.healthy_state("gpu-1", "Standard_NC24ads_A100_v4")
    hardware.write_state(path, state)
    assert hardware.read_state(path) == state
    with pytest.raises(LabError):
        hardware.write_state(path, {"gpu.0.name": "x\nhang=1"})
    assert hardware.read_state(path) == state


def test_package_versions_order_like_ubuntu() -> None:
    assert packages.kernel_version("6.5.0-45-generic") == "6.5.0-45.45"
    assert packages.meta_version("6.5.0-45-generic") == "6.5.0.45.45"
    versions = [packages.meta_version(k) for k in packages.KERNELS]
    r = subprocess.run(["dpkg", "--compare-versions", versions[1], "gt", versions[0]], check=False)
    assert r.returncode == 0


def test_built_packages_are_valid_debs(tmp_path: Path) -> None:
    pkg = packages.kernel_packages("6.5.0-45-generic")[1]
    deb = packages.build_deb(pkg, tmp_path)
    info = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Package", "Version", "Depends"], capture_output=True, text=True, check=True
    ).stdout
    assert "Package: linux-image-6.5.0-45-generic" in info
    assert "Depends: linux-modules-6.5.0-45-generic" in info
    files = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "./boot/vmlinuz-6.5.0-45-generic" in files
    packages.write_index(tmp_path, "jammy-security", [deb])
    release = (tmp_path / "Release").read_text()
    assert "Origin: GpuLab" in release and "Suite: jammy-security" in release and "Packages.gz" in release


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"address_prefix": "10.0.0"}, "not in 127.0.0.0/8"),
        ({"address_prefix": "127.0"}, "is not the first three octets"),
        ({"hostz": 3}, "unknown lab setting"),
    ],
)
def test_bad_lab_settings_are_named(setting: dict[str, object], message: str) -> None:
    with pytest.raises(LabError, match=message):
        LabConfig.from_mapping(setting)
