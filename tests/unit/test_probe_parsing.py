"""The probe's pure parsing helpers on realistic samples (apt-config dump, dpkg status, unattended-upgrade
--dry-run output, dmesg/kern.log, history.log)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest

PROBE_DIR = Path(__file__).resolve().parents[2] / "remediation" / "hostside"
sys.path.insert(0, str(PROBE_DIR))
import gpuprobe  # noqa: E402

sys.path.remove(str(PROBE_DIR))

APT_CONFIG_DUMP = """\
APT "";
APT::Architecture "amd64";
APT::Periodic "";
APT::Periodic::Update-Package-Lists "1";
APT::Periodic::Unattended-Upgrade "1";
Unattended-Upgrade "";
Unattended-Upgrade::Allowed-Origins "";
Unattended-Upgrade::Allowed-Origins:: "${distro_id}:${distro_codename}";
Unattended-Upgrade::Allowed-Origins:: "${distro_id}:${distro_codename}-security";
Unattended-Upgrade::Origins-Pattern "";
Unattended-Upgrade::Origins-Pattern:: "origin=Debian,codename=${distro_codename},label=Debian-Security";
Unattended-Upgrade::Package-Blacklist "";
Unattended-Upgrade::Package-Blacklist:: "linux-image";
Unattended-Upgrade::Package-Blacklist:: "linux-headers";
Unattended-Upgrade::Package-Blacklist:: "libstdc\\+\\+6$";
Unattended-Upgrade::DevRelease "auto";
Unattended-Upgrade::Automatic-Reboot "false";
DPkg::Pre-Install-Pkgs:: "/usr/sbin/dpkg-preconfigure --apt || true";
"""


def test_apt_config_dump_lists_and_scalars() -> None:
    config = gpuprobe.parse_apt_config_dump(APT_CONFIG_DUMP)
    assert config["APT::Periodic::Unattended-Upgrade"] == "1"
    assert config["Unattended-Upgrade::Package-Blacklist"] == ["linux-image", "linux-headers", "libstdc\\+\\+6$"]
    assert config["Unattended-Upgrade::Allowed-Origins"][1] == "${distro_id}:${distro_codename}-security"
    uu = gpuprobe.unattended_from_config(config, installed=True)
    assert uu["enabled"] is True
    assert uu["package_blacklist"] == ["linux-image", "linux-headers", "libstdc\\+\\+6$"]
    assert uu["origins_pattern"] == ["origin=Debian,codename=${distro_codename},label=Debian-Security"]
    assert uu["automatic_reboot"] is False


@pytest.mark.parametrize(
    ("lines", "installed", "enabled"),
    [
        ('APT::Periodic::Unattended-Upgrade "0";', True, False),
        ("", True, False),  # key absent: apt's periodic job does not run it
        ('APT::Periodic::Unattended-Upgrade "1";\nAPT::Periodic::Enable "0";', True, False),
        ('APT::Periodic::Unattended-Upgrade "1";', False, False),  # not installed
        ('APT::Periodic::Unattended-Upgrade "always";', True, True),
    ],
)
def test_unattended_enabled(lines: str, installed: bool, enabled: bool) -> None:
    config = gpuprobe.parse_apt_config_dump(lines)
    assert gpuprobe.unattended_from_config(config, installed)["enabled"] is enabled


def test_empty_blacklist_is_an_empty_list() -> None:
    config = gpuprobe.parse_apt_config_dump('Unattended-Upgrade::Package-Blacklist "";\n')
    assert gpuprobe.unattended_from_config(config, True)["package_blacklist"] == []


UU_DRY_RUN = """\
Starting unattended upgrades script
Allowed origins are: origin=gpulab,label=gpulab
Initial blacklist: linux-image linux-headers linux-modules
Initial whitelist (not strict):
Checking: linux-image-generic ([<Origin component:'' archive:'' origin:'gpulab' label:'gpulab' site:'' isTrusted:True>])
skipping blacklisted package linux-image-generic
Package linux-headers-generic is blacklisted.
pkg nvidia-driver-535 is on hold
Package libnvidia-compute-535 is marked to be held back.
Packages that will be upgraded: curl libcurl4 nvidia-utils-535
"""


def test_unattended_dry_run_output() -> None:
    parsed = gpuprobe.parse_unattended_dry_run(UU_DRY_RUN)
    assert parsed["upgrade"] == ["curl", "libcurl4", "nvidia-utils-535"]
    assert parsed["blacklisted"] == ["linux-image-generic", "linux-headers-generic"]
    assert parsed["held"] == ["nvidia-driver-535", "libnvidia-compute-535"]


DPKG_STATUS = """\
Package: linux-image-6.5.0-45-generic
Status: install ok installed
Priority: optional
Section: kernel
Architecture: amd64
Version: 6.5.0-45.45
Depends: linux-modules-6.5.0-45-generic
Description: Signed kernel image generic
 A kernel image for generic.
 .
 More text.

Package: nvidia-driver-535
Status: hold ok installed
Architecture: amd64
Version: 535.183.01-0ubuntu0.22.04.1
Conffiles:
 /etc/x 0123
Description: NVIDIA driver metapackage

Package: linux-image-6.2.0-39-generic
Status: deinstall ok config-files
Version: 6.2.0-39.40

Package: half
Status: install reinstreq half-configured
Version: 1
"""


def test_dpkg_status_stanzas() -> None:
    entries = gpuprobe.parse_dpkg_status(DPKG_STATUS)
    assert [e["Package"] for e in entries] == [
        "linux-image-6.5.0-45-generic",
        "nvidia-driver-535",
        "linux-image-6.2.0-39-generic",
        "half",
    ]
    assert entries[1]["Status"] == "hold ok installed"
    assert [gpuprobe.packages._is_installed(e) for e in entries] == [True, True, False, True]


@pytest.mark.parametrize(
    ("name", "meta"),
    [
        ("linux-generic", True),
        ("linux-image-generic", True),
        ("linux-headers-azure", True),
        ("linux-generic-hwe-22.04", True),
        ("linux-image-amd64", True),
        ("linux-image-6.5.0-45-generic", False),
        ("linux-headers-6.5.0-45", False),
        ("linux-modules-6.8.0-1015-azure", False),
        ("linux-image-6.1.0-18-cloud-amd64", False),
        ("linux-libc-dev", False),
        ("linux-firmware", False),
        ("linux-tools-common", False),
        ("linux-perf", False),
    ],
)
def test_kernel_meta_packages(name: str, meta: bool) -> None:
    assert gpuprobe.packages._is_meta_kernel(name) is meta


@pytest.mark.parametrize(
    ("version", "upstream"),
    [
        ("535.183.01-0ubuntu0.22.04.1", "535.183.01"),
        ("1:535.183.01-1~deb12u1", "535.183.01"),
        ("550.54.15", "550.54.15"),
        (None, None),
    ],
)
def test_upstream_version(version: str | None, upstream: str | None) -> None:
    assert gpuprobe.upstream_version(version) == upstream


def test_driver_package_preference() -> None:
    name, version, branch = gpuprobe.packages._driver_package(
        {"libnvidia-compute-550": "550.54.15-0ubuntu1", "nvidia-driver-550-server-open": "550.54.15-0ubuntu1"}
    )
    # The whole branch: the signed modules of 550-server-open are linux-modules-nvidia-550-server-open-<kernel>.
    assert (name, version, branch) == ("nvidia-driver-550-server-open", "550.54.15", "550-server-open")
    assert gpuprobe.packages._driver_package({"libnvidia-compute-535": "535.183.01-0ubuntu1"}) == (
        "libnvidia-compute-535",
        "535.183.01",
        "535",
    )
    assert gpuprobe.packages._driver_package({}) == (None, None, None)


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        # ubuntu-drivers install --gpgpu: the datacenter branch, every package its own
        ({"nvidia-driver-535-server": "535.183.01-0ubuntu0.22.04.1",
          "nvidia-kernel-common-535-server": "535.183.01-0ubuntu0.22.04.1"},
         ("nvidia-driver-535-server", "535.183.01", "535-server")),
        # -open shares the proprietary branch's userspace and nvidia-kernel-common: the driver package names it
        ({"nvidia-driver-535-open": "535.183.01-0ubuntu0.22.04.1", "nvidia-utils-535": "535.183.01-0ubuntu0.22.04.1",
          "nvidia-kernel-common-535": "535.183.01-0ubuntu0.22.04.1"},
         ("nvidia-driver-535-open", "535.183.01", "535-open")),
        # headless (no nvidia-driver-*): the package naming the whole branch wins over the shared userspace
        ({"nvidia-headless-no-dkms-535-open": "535.183.01-0ubuntu0.22.04.1",
          "libnvidia-compute-535": "535.183.01-0ubuntu0.22.04.1"},
         ("nvidia-headless-no-dkms-535-open", "535.183.01", "535-open")),
        ({"nvidia-dkms-535-server": "535.183.01-1", "libnvidia-compute-535-server": "535.183.01-1"},
         ("nvidia-dkms-535-server", "535.183.01", "535-server")),
        # only userspace left: -server is kept, -open cannot be told (it is not in these names)
        ({"libnvidia-compute-535-server": "535.183.01-1"}, ("libnvidia-compute-535-server", "535.183.01",
                                                             "535-server")),
        # not a branch: a suffix Ubuntu does not use is no package of a branch
        ({"nvidia-utils-535-foo": "535.183.01-1"}, (None, None, None)),
    ],
)
def test_driver_branch_is_the_whole_suffix(installed: dict[str, str], expected: tuple[str, str, str]) -> None:
    assert gpuprobe.packages._driver_package(installed) == expected


@pytest.mark.parametrize(
    ("name", "branch", "release"),
    [
        ("linux-modules-nvidia-535-6.5.0-1025-azure", "535", "6.5.0-1025-azure"),
        ("linux-modules-nvidia-535-server-6.5.0-1025-azure", "535-server", "6.5.0-1025-azure"),
        ("linux-modules-nvidia-535-open-6.5.0-45-generic", "535-open", "6.5.0-45-generic"),
        ("linux-modules-nvidia-550-server-open-6.8.0-1021-azure", "550-server-open", "6.8.0-1021-azure"),
    ],
)
def test_signed_module_package_names_branch_and_kernel(name: str, branch: str, release: str) -> None:
    match = gpuprobe.packages._SIGNED_PACKAGE_RE.match(name)
    assert match is not None and (match.group("branch"), match.group("release")) == (branch, release)


def test_signed_module_meta_packages_name_no_kernel() -> None:
    for meta in ("linux-modules-nvidia-535-server-azure", "linux-modules-nvidia-535-open-generic"):
        assert gpuprobe.packages._SIGNED_PACKAGE_RE.match(meta) is None


DMESG = """\
[    0.000000] Linux version 6.5.0-45-generic (buildd@lcy02-amd64-041) (x86_64-linux-gnu-gcc-12) #45-Ubuntu SMP
[    4.212000] NIST: module nvidia not found in modules.dep
[    9.424670] NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)
               NVRM: has the version 595.84, but this kernel module has
               NVRM: the version 595.80.  Please make sure that this
[   12.000000] r8169 0000:03:00.0 eth0: RTL8125B, 58:47:ca:7b:55:71, XID 641, IRQ 51
[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
               NVRM: (PCI ID: 10de:26b5) installed in this system has
               NVRM: fallen off the bus and is not responding to commands.
[ 1900.000000] usb 1-1: new high-speed USB device
"""


def test_kernel_log_filter_keeps_nvidia_lines_with_continuations() -> None:
    lines, dropped = gpuprobe.filter_kernel_log_lines(DMESG.splitlines())
    assert dropped == 0
    assert lines[0] == "[    4.212000] NIST: module nvidia not found in modules.dep"
    assert "               NVRM: the version 595.80.  Please make sure that this" in lines
    assert "               NVRM: fallen off the bus and is not responding to commands." in lines
    assert not any("usb" in line for line in lines)
    # the NIC's "XID 641" line matches the case-insensitive Xid filter: it is sent, the parser rejects it
    assert any("XID 641" in line for line in lines)


def test_kernel_log_cap_keeps_head_and_newest() -> None:
    lines = [f"[{i}] NVRM: Xid (PCI:0000:07:00): 13, line {i}" for i in range(1200)]
    kept, dropped = gpuprobe.filter_kernel_log_lines(lines)
    assert len(kept) == gpuprobe.KERNEL_LOG_MAX_LINES and dropped == 700
    assert kept[0].endswith("line 0") and kept[-1].endswith("line 1199")
    assert kept[gpuprobe.KERNEL_LOG_HEAD_LINES - 1].endswith(f"line {gpuprobe.KERNEL_LOG_HEAD_LINES - 1}")


def test_kern_log_without_boot_banner_filters_by_time() -> None:
    now = dt.datetime.now(dt.UTC)
    boot = now - dt.timedelta(hours=1)
    old = (now - dt.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%S.000000+00:00")
    new = (now - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.000000+00:00")
    xid = "gpu01 kernel: NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus"
    text = f"{old} {xid}\n{new} gpu01 kernel: NVRM: loading\n"
    assert gpuprobe.kern_log_since_boot(text, boot) == [text.splitlines()[1]]


def test_history_stanzas_tolerate_web_rendering() -> None:
    text = (
        "Start-Date: 2020-03-03 06:00:08 | |\nCommandline: /usr/bin/unattended-upgrade | |\n"
        "Upgrade: libarchive13:amd64 (3.2.2-3.1ubuntu0.5, 3.2.2-3.1ubuntu0.6) | |\nEnd-Date: 2020-03-03 06:00:09 | |\n"
        "Start-Date: 2021-06-04  06:41:09\nCommandline: /usr/bin/unattended-upgrade\n"
        "Upgrade: libnvidia-common-460:amd64 (460.73.01-0ubuntu0.20.04.1, 460.80-0ubuntu0.20.04.2)\n"
        "End-Date: 2021-06-04  06:41:09\n"
    )
    assert len(gpuprobe.split_history_stanzas(text)) == 2
    selected = gpuprobe.select_history_stanzas(text)
    assert len(selected) == 1 and "libnvidia-common-460" in selected[0]


def test_os_release() -> None:
    text = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_ID="12"\nID=debian\n# comment\n'
    assert gpuprobe.parse_os_release(text) == {
        "ID": "debian",
        "VERSION_ID": "12",
        "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)",
    }


def test_proc_locks_holder_lookup(tmp_path: Path) -> None:
    import os

    lock = tmp_path / "lock"
    lock.write_text("")
    st = os.stat(lock)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    text = (
        f"1: POSIX  ADVISORY  WRITE 4242 {dev} 0 EOF\n"
        f"1: -> POSIX  ADVISORY  WRITE 999 {dev} 0 EOF\n"
        "2: FLOCK  ADVISORY  WRITE 77 00:01:1 0 EOF\n"
    )
    assert gpuprobe.locks._proc_locks_holders(st, text) == [4242]


def test_collect_accepts_a_mapping_of_options_and_rejects_unknown_ones() -> None:
    doc = gpuprobe.collect({"skip_nvml": True, "root": "/nonexistent-root"})
    assert doc["schema"] == "gpufleet.facts/1"
    assert doc["nvml"]["error"] == "NVML not probed (--skip-nvml)"
    with pytest.raises(ValueError, match="bogus"):
        gpuprobe.collect({"bogus": 1})
