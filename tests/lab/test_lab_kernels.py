"""The lab's kernel lifecycle on real hosts, for both kernel flavours: packages, grub.cfg boots, Secure Boot, the
latent kernel faults and Ubuntu's identity (issue 9, the lab's part).

One lab of its own (127.0.74.N): gpu-1 generic, gpu-2 azure, gpu-3 azure and gpu-4 generic as Trusted Launch
hosts (Secure Boot on, signed NVIDIA module). Tests that change a host clear it first.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest

from lab import packages
from lab.faults import FAULTS, LATENT, inject
from tests.conftest import make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

HOST = {"generic": "gpu-1", "azure": "gpu-2"}
TRUSTED = {"azure": "gpu-3", "generic": "gpu-4"}
FLAVOURS = ("generic", "azure")
UUID = "4d3c1b6e-8f2a-4a71-9c55-2e6f0b7d1a93"
NVML = (
    "import json, pynvml\n"
    "try:\n"
    "    pynvml.nvmlInit()\n"
    "except pynvml.NVMLError as e:\n"
    "    print(json.dumps({'error': type(e).__name__})); raise SystemExit(0)\n"
    "print(json.dumps({'driver': pynvml.nvmlSystemGetDriverVersion()}))\n"
)
REJECTED = "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
LOCKDOWN = "unsigned module loading is restricted; see man kernel_lockdown.7"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_lab()
    the_lab = make_lab(tmp_path_factory.mktemp("kernels"), "127.0.74", 1, flavour="generic")
    try:
        the_lab.up(2, flavour="azure")
        the_lab.up(3, flavour="azure", secure_boot=True)
        the_lab.up(4, flavour="generic", secure_boot=True)
        yield the_lab
    finally:
        the_lab.down(purge=True)


def run(lab, host: str, command: str, rc: int | None = 0, timeout: float = 300) -> str:  # type: ignore[no-untyped-def]
    r = ssh(lab, host, command, timeout=timeout)
    if rc is not None:
        assert r.returncode == rc, f"{command}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    return r.stdout + r.stderr


def nvml(lab, host: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    out: dict[str, str] = json.loads(run(lab, host, "python3 -c " + shlex.quote(NVML)))
    return out


def uname(lab, host: str) -> str:  # type: ignore[no-untyped-def]
    return run(lab, host, "uname -r").strip()


def entry(release: str) -> str:
    return f"gnulinux-advanced-{UUID}>gnulinux-{release}-advanced-{UUID}"


def last_boot(lab, host: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    record: dict[str, object] = json.loads((lab.paths.host(host) / "boots.log").read_text().splitlines()[-1])
    return record


def test_hosts_are_ubuntu_jammy_of_their_flavour(lab) -> None:  # type: ignore[no-untyped-def]
    for flavour, host in HOST.items():
        assert uname(lab, host) == packages.boot_kernel(flavour)
        assert lab.spec(host)["flavour"] == flavour
        assert run(lab, host, "lsb_release -a").splitlines() == [
            "Distributor ID:\tUbuntu",
            "Description:\tUbuntu 22.04.4 LTS",
            "Release:\t22.04",
            "Codename:\tjammy",
        ]
        assert "VERSION_CODENAME=jammy" in run(lab, host, "cat /etc/os-release")
        held = run(lab, host, "dpkg-query -W -f='${Package} ${Version}\\n' 'linux-*'").splitlines()
        assert f"linux-image-{flavour} {packages.meta_version(packages.boot_kernel(flavour))}" in held
        other = "azure" if flavour == "generic" else "generic"
        assert not any(line.startswith(f"linux-image-{other}") for line in held)
        assert run(lab, host, "mokutil --sb-state").strip() == "SecureBoot disabled"


def test_latent_faults_are_kept_apart_from_the_audit_matrix() -> None:
    assert set(LATENT) == {"secure-boot", "dkms-build-fail", "new-kernel-panic", "fails-under-load"}
    assert not set(LATENT) & set(FAULTS)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_stock_unattended_upgrades_picks_the_security_pocket(lab, flavour: str) -> None:  # type: ignore[no-untyped-def]
    host = HOST[flavour]
    lab.clear(host)
    conf = run(lab, host, "cat /etc/apt/apt.conf.d/50unattended-upgrades")
    assert '\t"${distro_id}:${distro_codename}-security";' in conf
    assert run(lab, host, "ls /etc/apt/apt.conf.d").split() == [
        "01autoremove",
        "20auto-upgrades",
        "50unattended-upgrades",
        "70debconf",
    ]
    run(lab, host, "apt-get update -q")
    dry = run(lab, host, "unattended-upgrade --dry-run -d")
    assert "Allowed origins are: o=Ubuntu,a=jammy, o=Ubuntu,a=jammy-security," in dry
    new = packages.new_kernel(flavour)
    assert f"linux-image-{new}" in dry
    # The S1 failure, with the stock configuration: the new kernel arrives, the host reboots without a module.
    inject(lab, host, "kernel-upgrade")
    assert uname(lab, host) == new
    assert nvml(lab, host) == {"error": "NVMLError_DriverNotLoaded"}
    history = run(lab, host, "cat /var/log/apt/history.log")
    assert f"Upgrade: linux-image-{flavour}:amd64 ({packages.meta_version(packages.boot_kernel(flavour))}," in history
    assert "nvidia" not in history.split("Commandline: /usr/bin/unattended-upgrade")[-1]  # -updates stays out


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_update_grub_and_grub_reboot_choose_the_kernel(lab, flavour: str) -> None:  # type: ignore[no-untyped-def]
    host, old, new = HOST[flavour], packages.boot_kernel(flavour), packages.new_kernel(flavour)
    lab.clear(host)
    out = run(lab, host, f"apt-get install -y -q linux-image-{flavour} linux-headers-{flavour}")
    assert f"Found linux image: /boot/vmlinuz-{new}" in out  # the kernel's postinst ran zz-update-grub
    assert f"Installing to /lib/modules/{new}/updates/dkms/" in out
    cfg = run(lab, host, "cat /boot/grub/grub.cfg")
    assert cfg.index(f"'Ubuntu, with Linux {new}'") < cfg.index(f"'Ubuntu, with Linux {old}'")
    assert f"$menuentry_id_option 'gnulinux-{new}-advanced-{UUID}'" in cfg
    lab.reboot(host)
    assert uname(lab, host) == new
    assert nvml(lab, host) == {"driver": packages.BOOT_DRIVER}
    # An edit of /etc/default/grub alone changes nothing: the boot loader reads grub.cfg.
    run(lab, host, f"sed -i 's/^GRUB_DEFAULT=.*/GRUB_DEFAULT=\"{entry(old)}\"/' /etc/default/grub")
    lab.reboot(host)
    assert uname(lab, host) == new
    run(lab, host, "update-grub")
    lab.reboot(host)
    assert uname(lab, host) == old
    # GRUB_DEFAULT=saved with grub-set-default, then a one-shot grub-reboot.
    run(lab, host, "sed -i 's/^GRUB_DEFAULT=.*/GRUB_DEFAULT=saved/' /etc/default/grub && update-grub")
    run(lab, host, f"grub-set-default '{entry(old)}'")
    run(lab, host, f"grub-reboot 'Advanced options for Ubuntu>Ubuntu, with Linux {new}'")
    assert f"next_entry=Advanced options for Ubuntu>Ubuntu, with Linux {new}" in run(lab, host, "grub-editenv - list")
    lab.reboot(host)
    assert uname(lab, host) == new
    assert "next_entry=\n" in run(lab, host, "grub-editenv - list")  # used up by that boot
    lab.reboot(host)
    assert uname(lab, host) == old
    assert len(run(lab, host, "cat /boot/grub/grubenv")) == 1024


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_signed_module_loads_under_secure_boot_unsigned_is_rejected(lab, flavour: str) -> None:  # type: ignore[no-untyped-def]
    host, old, new = TRUSTED[flavour], packages.boot_kernel(flavour), packages.new_kernel(flavour)
    assert run(lab, host, "mokutil --sb-state").strip() == "SecureBoot enabled"
    efivar = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    assert run(lab, host, f"od -An -t x1 {efivar}").split() == ["06", "00", "00", "00", "01"]
    signed = f"/lib/modules/{old}/kernel/nvidia-535/nvidia.ko"
    assert run(lab, host, "modprobe --show-depends nvidia").strip() == f"insmod {signed}"
    assert run(lab, host, f"tail -c 28 {signed}") == "~Module signature appended~\n"
    assert run(lab, host, "modinfo -F version nvidia").strip() == packages.BOOT_DRIVER
    assert nvml(lab, host) == {"driver": packages.BOOT_DRIVER}
    kmsg = run(lab, host, "dmesg")
    assert "Kernel is locked down from EFI Secure Boot mode; see man kernel_lockdown.7" in kmsg
    assert "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01" in kmsg
    assert "module verification failed" not in kmsg
    # The new kernel with its headers: DKMS builds an unsigned module (updates/ wins over the signed tree).
    run(lab, host, f"apt-get install -y -q linux-image-{flavour} linux-headers-{flavour}")
    run(lab, host, f"grub-reboot '{entry(new)}'")
    lab.reboot(host)
    assert uname(lab, host) == new
    assert nvml(lab, host) == {"error": "NVMLError_DriverNotLoaded"}
    kmsg = run(lab, host, "dmesg")
    assert f"Lockdown: systemd-modules: {LOCKDOWN}" in kmsg
    assert "systemd-modules-load[312]: Failed to insert module 'nvidia': Key was rejected by service" in kmsg
    assert "NVRM: loading" not in kmsg
    r = ssh(lab, host, "modprobe nvidia")
    assert (r.returncode, r.stderr.strip()) == (1, REJECTED)
    assert f"Lockdown: modprobe: {LOCKDOWN}" in run(lab, host, "dmesg | tail -n 1")
    # The signed package for the new kernel, and DKMS's unsigned build out of the way: it loads.
    version = packages.signed_module_version(new, packages.BOOT_DRIVER)
    run(lab, host, f"apt-get install -y -q linux-modules-nvidia-535-{new}={version}")
    run(lab, host, f"dkms remove -m nvidia -v {packages.BOOT_DRIVER} -k {new}")
    run(lab, host, f"grub-reboot '{entry(new)}'")
    lab.reboot(host)
    assert uname(lab, host) == new
    assert nvml(lab, host) == {"driver": packages.BOOT_DRIVER}
    assert last_boot(lab, host)["signed"] is True


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_secure_boot_fault_takes_effect_at_the_next_boot(lab, flavour: str) -> None:  # type: ignore[no-untyped-def]
    host = HOST[flavour]
    lab.clear(host)
    inject(lab, host, "secure-boot")
    assert run(lab, host, "mokutil --sb-state").strip() == "SecureBoot disabled"  # a firmware setting
    lab.reboot(host)
    assert run(lab, host, "mokutil --sb-state").strip() == "SecureBoot enabled"
    assert nvml(lab, host) == {"error": "NVMLError_DriverNotLoaded"}  # the DKMS module is unsigned
    assert f"Lockdown: systemd-modules: {LOCKDOWN}" in run(lab, host, "dmesg")
    lab.clear(host)
    assert run(lab, host, "mokutil --sb-state").strip() == "SecureBoot disabled"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_dkms_build_fail_leaves_no_module_for_the_next_kernel(lab, flavour: str) -> None:  # type: ignore[no-untyped-def]
    host, old, new = HOST[flavour], packages.boot_kernel(flavour), packages.new_kernel(flavour)
    lab.clear(host)
    inject(lab, host, "dkms-build-fail")
    out = run(lab, host, f"apt-get install -y -q linux-image-{flavour} linux-headers-{flavour}")
    assert f"Error! Bad return status for module build on kernel: {new} (x86_64)" in out
    r = ssh(lab, host, f"dkms install -m nvidia -v {packages.BOOT_DRIVER} -k {new}")
    assert r.returncode == 10
    assert f"Consult /var/lib/dkms/nvidia/{packages.BOOT_DRIVER}/build/make.log for more information." in r.stdout
    log = run(lab, host, f"cat /var/lib/dkms/nvidia/{packages.BOOT_DRIVER}/build/make.log")
    assert f"DKMS make.log for nvidia-{packages.BOOT_DRIVER} for kernel {new} (x86_64)" in log
    assert "error: implicit declaration of function" in log and "make: *** [Makefile:82: modules] Error 2" in log
    run(lab, host, f"test ! -e /lib/modules/{new}/updates/dkms/nvidia.ko")
    assert run(lab, host, "dkms status").splitlines() == [f"nvidia/{packages.BOOT_DRIVER}, {old}, x86_64: installed"]
    assert nvml(lab, host) == {"driver": packages.BOOT_DRIVER}  # the running host is still healthy


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_new_kernel_panic_falls_back_after_a_one_shot_trial(lab, flavour: str) -> None:  # type: ignore[no-untyped-def]
    host, old, new = HOST[flavour], packages.boot_kernel(flavour), packages.new_kernel(flavour)
    lab.clear(host)
    inject(lab, host, "new-kernel-panic")
    run(lab, host, f"apt-get install -y -q linux-image-{flavour} linux-headers-{flavour}")
    run(lab, host, "sed -i 's/^GRUB_DEFAULT=.*/GRUB_DEFAULT=saved/' /etc/default/grub && update-grub")
    run(lab, host, f"grub-set-default '{entry(old)}' && grub-reboot '{entry(new)}'")
    lab.reboot(host, timeout=60)
    assert uname(lab, host) == old
    boots = [json.loads(line) for line in (lab.paths.host(host) / "boots.log").read_text().splitlines()[-2:]]
    assert [(b["kernel"], b["panic"], b["next_entry"]) for b in boots] == [(new, True, True), (old, False, False)]
    assert boots[1]["time"] - boots[0]["time"] >= 3.0  # down for a while, as a VM restarting after a panic
    kern = run(lab, host, "cat /var/log/kern.log")
    assert "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)" in kern
    assert nvml(lab, host) == {"driver": packages.BOOT_DRIVER}
    assert "next_entry=\n" in run(lab, host, "grub-editenv - list")
