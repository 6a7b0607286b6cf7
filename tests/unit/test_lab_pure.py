"""Pure parts of the lab: boot-loader choice, hardware state, package versions, settings validation."""

from __future__ import annotations

import itertools
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from lab import boot, hardware, packages
from lab.config import MAX_HOSTS, LabConfig
from lab.control import ssh_listeners
from lab.errors import LabError


def _root(tmp_path: Path, kernels: list[str], grub: str | None = None) -> Path:
    (tmp_path / "boot").mkdir()
    for k in kernels:
        (tmp_path / "boot" / f"vmlinuz-{k}").write_text("")
    if grub is not None:
        (tmp_path / "etc/default").mkdir(parents=True)
        (tmp_path / "etc/default/grub").write_text(grub)
    return tmp_path


def test_without_grub_cfg_boots_newest_kernel_by_version_not_by_text(tmp_path: Path) -> None:
    root = _root(tmp_path, ["6.5.0-9-generic", "6.5.0-45-generic", "6.5.0-100-generic"])
    assert boot.choose_kernel(root) == "6.5.0-100-generic"


def _grub(root: Path, default: str, env: str = "") -> None:
    """grub.cfg as the lab's update-grub writes it (run here with the host's /boot)."""
    kernels = sorted(boot.installed_kernels(root), key=boot.version_key, reverse=True)
    uuid = "u"
    entries = "".join(
        f"\tmenuentry 'Ubuntu, with Linux {k}' --class ubuntu $menuentry_id_option 'gnulinux-{k}-advanced-{uuid}' {{\n"
        f"\t\tlinux\t/boot/vmlinuz-{k} root=UUID={uuid} ro\n\t}}\n"
        for k in kernels
    )
    cfg = (
        'if [ "${next_entry}" ] ; then\n   set default="${next_entry}"\n   set next_entry=\n'
        f'   save_env next_entry\nelse\n   set default="{default}"\nfi\n'
        f"menuentry 'Ubuntu' --class ubuntu $menuentry_id_option 'gnulinux-simple-{uuid}' {{\n"
        f"\tlinux\t/boot/vmlinuz-{kernels[0]} root=UUID={uuid} ro\n}}\n"
        f"submenu 'Advanced options for Ubuntu' $menuentry_id_option 'gnulinux-advanced-{uuid}' {{\n{entries}}}\n"
    )
    (root / "boot/grub").mkdir(parents=True, exist_ok=True)
    (root / "boot/grub/grub.cfg").write_text(cfg)
    (root / "boot/grub/grubenv").write_text(("# GRUB Environment Block\n" + env).ljust(1024, "#"))


def test_grub_cfg_default_picks_an_entry_by_title_path_or_id(tmp_path: Path) -> None:
    root = _root(tmp_path, ["6.5.0-44-generic", "6.5.0-45-generic"])
    _grub(root, "0")
    assert boot.grub_choice(root) == ("6.5.0-45-generic", False)
    _grub(root, "Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-44-generic")
    assert boot.choose_kernel(root) == "6.5.0-44-generic"
    _grub(root, "gnulinux-advanced-u>gnulinux-6.5.0-44-generic-advanced-u")
    assert boot.choose_kernel(root) == "6.5.0-44-generic"
    _grub(root, "1>1")
    assert boot.choose_kernel(root) == "6.5.0-44-generic"


def test_grub_default_naming_a_removed_kernel_boots_entry_zero(tmp_path: Path) -> None:
    root = _root(tmp_path, ["6.5.0-44-generic", "6.5.0-45-generic"])
    _grub(root, "Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-41-generic")
    assert boot.choose_kernel(root) == "6.5.0-45-generic"


def test_etc_default_grub_alone_changes_nothing(tmp_path: Path) -> None:
    grub = 'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-44-generic"\n'
    root = _root(tmp_path, ["6.5.0-44-generic", "6.5.0-45-generic"], grub)
    _grub(root, "0")
    assert boot.choose_kernel(root) == "6.5.0-45-generic"  # update-grub was not run


def test_saved_entry_and_one_shot_next_entry(tmp_path: Path) -> None:
    root = _root(tmp_path, ["6.5.0-44-generic", "6.5.0-45-generic"])
    saved = "saved_entry=Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-44-generic\n"
    once = "next_entry=Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-45-generic\n"
    _grub(root, "${saved_entry}", saved + once)
    assert boot.grub_choice(root) == ("6.5.0-45-generic", True)
    boot.consume_next_entry(root)
    assert boot.read_grubenv(root)["next_entry"] == ""
    assert len((root / "boot/grub/grubenv").read_bytes()) == 1024
    assert boot.grub_choice(root) == ("6.5.0-44-generic", False)


def test_signed_module_is_found_after_dkms_and_judged_by_its_magic(tmp_path: Path) -> None:
    release = "6.5.0-1025-azure"
    signed = tmp_path / f"lib/modules/{release}/kernel/nvidia-535/nvidia.ko"
    signed.parent.mkdir(parents=True)
    signed.write_bytes(packages.signed_module_bytes(release, "535.183.01"))
    assert signed.read_bytes().endswith(b"~Module signature appended~\n")
    assert boot.find_module(tmp_path, release) == signed and boot.module_signed(signed)
    assert boot.module_version(tmp_path, release) == "535.183.01"
    dkms = tmp_path / f"lib/modules/{release}/updates/dkms/nvidia.ko"
    dkms.parent.mkdir(parents=True)
    dkms.write_text("version:        535.216.01\n")
    assert boot.find_module(tmp_path, release) == dkms and not boot.module_signed(dkms)  # updates/ first
    assert boot.module_version(tmp_path, release) == "535.216.01"


def test_secure_boot_refuses_an_unsigned_module_at_boot_with_the_kernels_words() -> None:
    lines = [t for _, t in boot.kmsg_lines("6.5.0-1025-azure", "535.183.01", {}, "abcdef01", secure_boot=True)]
    assert "Lockdown: systemd-modules: unsigned module loading is restricted; see man kernel_lockdown.7" in lines
    assert "systemd-modules-load[312]: Failed to insert module 'nvidia': Key was rejected by service" in lines
    assert not any(t.startswith("NVRM:") for t in lines)
    ok = [t for _, t in boot.kmsg_lines("6.5.0-1025-azure", "535.183.01", {}, "abcdef01", True, signed=True)]
    assert any(t.startswith("NVRM: loading NVIDIA UNIX") for t in ok)


def test_azure_package_versions_and_signed_module_scheme() -> None:
    assert packages.kernel_version("6.5.0-1025-azure") == "6.5.0-1025.26~22.04.1"
    assert packages.meta_version("6.5.0-1025-azure") == "6.5.0.1025.26~22.04.1"
    assert packages.signed_module_version("6.5.0-1025-azure", "535.183.01") == "6.5.0-1025.26~22.04.1"
    assert packages.signed_module_version("6.5.0-1025-azure", "535.216.01") == "6.5.0-1025.26~22.04.1+1"
    ordered = [
        packages.signed_meta_version("6.5.0-1024-azure", "535.183.01"),
        packages.signed_meta_version("6.5.0-1024-azure", "535.216.01"),
        packages.signed_meta_version("6.5.0-1025-azure", "535.183.01"),
        packages.signed_meta_version("6.5.0-1025-azure", "535.216.01"),
    ]
    for older, newer in itertools.pairwise(ordered):
        assert subprocess.run(["dpkg", "--compare-versions", newer, "gt", older], check=False).returncode == 0


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
    assert "Origin: Ubuntu" in release and "Suite: jammy-security" in release and "Packages.gz" in release


def test_flavour_follows_the_flag_then_the_config_then_the_vm_size() -> None:
    assert LabConfig().host_flavour() == "azure"  # an Azure VM size runs linux-azure
    assert LabConfig(flavour="generic").host_flavour() == "generic"
    assert LabConfig(flavour="generic").host_flavour("azure") == "azure"
    assert LabConfig(sku="on-prem").host_flavour() == "generic"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"address_prefix": "10.0.0"}, "not in 127.0.0.0/8"),
        ({"address_prefix": "127.0"}, "is not the first three octets"),
        ({"hostz": 3}, "unknown lab setting"),
        ({"flavour": "rhel"}, "kernel flavour 'rhel' .* is not one the lab has"),
    ],
)
def test_bad_lab_settings_are_named(setting: dict[str, object], message: str) -> None:
    with pytest.raises(LabError, match=message):
        LabConfig.from_mapping(setting)


def test_noble_kernels_packages_and_release_settings(tmp_path: Path) -> None:
    """Ubuntu 24.04: 6.8 kernels whose meta-packages carry the kernel's own version, the noble driver suffix, the
    kernel's own modules as zstd frames that the boot loader reads (signed inside), and the release setting."""
    assert [packages.boot_kernel(f, "noble") for f in packages.FLAVOURS] == ["6.8.0-45-generic", "6.8.0-1016-azure"]
    assert packages.new_kernel("azure", "noble") == "6.8.0-1017-azure"
    assert packages.kernel_version("6.8.0-1017-azure") == packages.meta_version("6.8.0-1017-azure") == "6.8.0-1017.20"
    assert packages.signed_module_version("6.8.0-1017-azure", packages.DRIVERS[1]) == "6.8.0-1017.20+1"
    assert packages.driver_version("535.183.01", "noble") == "535.183.01-0ubuntu0.24.04.1"
    assert packages.driver_version("535.183.01") == "535.183.01-0ubuntu0.22.04.1"  # jammy stays the default
    assert packages.series_pockets("noble") == {"security": "noble-security", "updates": "noble-updates"}
    assert packages.compresses_modules("6.8.0-47-generic") and not packages.compresses_modules("6.5.0-45-generic")
    modules = packages.kernel_packages("6.8.0-1017-azure")[0]
    zst = {p: c for p, c in modules.files.items() if p.endswith(".ko.zst")}
    assert set(zst) == {"/lib/modules/6.8.0-1017-azure/kernel/drivers/gpu/drm/drm.ko.zst",
                        "/lib/modules/6.8.0-1017-azure/kernel/fs/nls/nls_iso8859-1.ko.zst"}
    path = tmp_path / "drm.ko.zst"
    data = zst["/lib/modules/6.8.0-1017-azure/kernel/drivers/gpu/drm/drm.ko.zst"]
    assert isinstance(data, bytes) and data[:4] == b"\x28\xb5\x2f\xfd"
    path.write_bytes(data)
    assert boot.module_signed(path) and boot.find_module(tmp_path, "x") is None
    image = packages.kernel_packages("6.8.0-47-generic")[1]
    assert "CONFIG_MODULE_COMPRESS_ZSTD=y" in str(image.files["/boot/config-6.8.0-47-generic"])
    assert "CONFIG_MODULE_COMPRESS_ZSTD" not in str(packages.kernel_packages("6.5.0-45-generic")[1].files[
        "/boot/config-6.5.0-45-generic"])
    deb = packages.build_deb(modules, tmp_path)
    packages.write_index(tmp_path, "noble-security", [deb], codename="noble")
    assert "Codename: noble" in (tmp_path / "Release").read_text()
    cfg = LabConfig(release="noble", host_overrides={"gpu-2": {"release": "jammy"}})
    assert (cfg.host_release("gpu-1"), cfg.host_release("gpu-2"), cfg.host_release("gpu-1", "jammy")) == (
        "noble", "jammy", "jammy")
    with pytest.raises(LabError, match=r"lab\.release 'focal'"):
        LabConfig(release="focal").validate()
    with pytest.raises(LabError, match=r"host_overrides.gpu-3.release"):
        LabConfig(host_overrides={"gpu-3": {"release": "bionic"}}).validate()


def test_a_lab_past_254_hosts_gets_unique_addresses_across_consecutive_24s() -> None:
    cfg = LabConfig(address_prefix="127.12.1")
    addresses = [cfg.address(i) for i in range(1, MAX_HOSTS + 1)]
    assert len(set(addresses)) == MAX_HOSTS == 1000
    assert addresses[0] == "127.12.1.1" and addresses[253] == "127.12.1.254"  # up to 254 hosts: as before
    assert addresses[254] == "127.12.2.1" and addresses[-1] == "127.12.4.238"
    assert {a.rsplit(".", 1)[0] for a in addresses} == set(cfg.address_nets(MAX_HOSTS)) == {
        "127.12.1", "127.12.2", "127.12.3", "127.12.4"}
    assert all(1 <= int(a.rsplit(".", 1)[1]) <= 254 for a in addresses)  # never .0 or .255
    assert cfg.address_nets(254) == ["127.12.1"] and cfg.address_nets(255) == ["127.12.1", "127.12.2"]


def test_host_counts_past_the_limit_or_the_end_of_the_prefix_are_named() -> None:
    LabConfig(address_prefix="127.0.1").check_count(MAX_HOSTS)
    with pytest.raises(LabError, match=f"--hosts {MAX_HOSTS + 1} is out of range: the lab runs 1 to {MAX_HOSTS}"):
        LabConfig().check_count(MAX_HOSTS + 1)
    with pytest.raises(LabError, match="--hosts 0 is out of range"):
        LabConfig().check_count(0)
    LabConfig(address_prefix="127.0.254").check_count(508)  # 127.0.254 and 127.0.255
    with pytest.raises(LabError, match=r"would need addresses up to 127\.0\.256\.x.*lower third octet"):
        LabConfig(address_prefix="127.0.254").check_count(509)


def test_ssh_listeners_read_from_the_kernel_tcp_table(tmp_path: Path) -> None:
    def hex_addr(address: str) -> str:  # as the kernel prints a __be32: the raw word in host byte order
        return f"{struct.unpack('=I', socket.inet_aton(address))[0]:08X}"

    rows = [  # 127.12.1.1:22 listening; 127.12.1.2:22 a session (not a listener); 127.12.1.3:2222 listening
        f"   0: {hex_addr('127.12.1.1')}:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 1\n",
        f"   1: {hex_addr('127.12.1.2')}:0016 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  0  0 2\n",
        f"   2: {hex_addr('127.12.1.3')}:08AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 3\n",
    ]
    table = tmp_path / "tcp"
    table.write_text("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout\n"
                     + "".join(rows))
    assert ssh_listeners(str(table)) == {"127.12.1.1"}


def test_whether_a_new_host_has_pynvml_follows_its_override_then_the_config() -> None:
    cfg = LabConfig.from_mapping({"pynvml": "false", "host_overrides": {"gpu-2": {"pynvml": True}}}, root=Path("/x"))
    assert (cfg.host_pynvml("gpu-1"), cfg.host_pynvml("gpu-2")) == (False, True)
    assert LabConfig(host_overrides={"gpu-3": {"pynvml": "False"}}).host_pynvml("gpu-3") is False
    assert LabConfig().host_pynvml("gpu-1") is True  # the default image has the bindings, as before
    with pytest.raises(LabError, match=r"host_overrides\.gpu-3\.pynvml is 'no': use true .* or false"):
        LabConfig(host_overrides={"gpu-3": {"pynvml": "no"}}).validate()


def test_molecule_lab_refuses_a_host_without_pynvml_that_the_scenario_does_not_have(tmp_path: Path) -> None:
    from lab import molecule

    with pytest.raises(LabError, match=r"--without-pynvml gpu-3: not one of this scenario's hosts \(gpu-1 \.\. gpu-2"):
        molecule.up("demo-scenario", 2, None, root=tmp_path, without_pynvml=["gpu-3"])
    assert not (tmp_path / ".lab").exists()  # refused before anything was made
