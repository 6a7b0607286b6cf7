"""The lab's base image: one Debian root built once with debootstrap, cached, shared read-only by every host.

Two cache levels under the cache directory:

* ``debootstrap-<suite>-<packages>/``: the plain debootstrap result (needs the Debian mirror; ~40 s, ~290 MB);
  ``<packages>`` is a digest of the packages it includes, so adding one builds a new root.
* ``base-<key>/``: that root customised for the lab, once per kernel flavour (``root/`` generic,
  ``root-azure/``): the apt repository, the simulated NVIDIA driver and the flavour's kernel installed, GRUB's
  stand-in and a generated grub.cfg, sshd configured, the lab's shims, Ubuntu 22.04's identity
  (``/etc/os-release``) and Ubuntu's stock unattended-upgrades configuration; plus the repository and native
  binaries. ``key`` hashes every input, so a change to the lab's packages or native code rebuilds it (no network).
  Another Ubuntu release than jammy (noble) is added to a finished base the first time a host of it is asked for
  (:func:`ensure_release`): ``repo-noble/``, ``root-noble/``, ``root-azure-noble/``, with noble's identity and
  stock unattended-upgrades configuration.

Each level is built in a temporary directory and renamed into place at the end: an interrupted build leaves
nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import packages
from .config import LOGIN_UID, LOGIN_USER, PYNVML_PATH, LabConfig
from .errors import LabError

LAB_DIR = Path(__file__).resolve().parent
NATIVE = LAB_DIR / "native"
HOSTFILES = LAB_DIR / "hostfiles"
# sudo: Azure images log in as azureuser and escalate with sudo; the lab's tests of that need the real one.
# zstd: Ubuntu 24.04 installs it (initramfs and kernel modules are zstd-compressed); the lab's kmod and DKMS
# stand-ins and the probe decompress .ko.zst with it. (Adding a package changes the debootstrap cache key.)
DEBOOTSTRAP_INCLUDE = (
    "openssh-server", "python3", "apt-utils", "unattended-upgrades", "cron", "procps", "sudo", "zstd"
)
REPO_MOUNT = "/srv/gpulab-repo"
BASE_FORMAT = "4"

ETC_DEFAULT_GRUB = """\
# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
# For full documentation of the options in this file, see:
#   info -f grub -n 'Simple configuration'

GRUB_DEFAULT=0
GRUB_TIMEOUT_STYLE=hidden
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"
GRUB_CMDLINE_LINUX=""
"""
CLOUDIMG_GRUB = """\
# Cloud Image specific Grub settings for Generic Cloud Images
# CLOUD_IMG: This file was created/modified by the Cloud Image build process

# Set the recordfail timeout
GRUB_RECORDFAIL_TIMEOUT=0

# Do not wait on grub prompt
GRUB_TIMEOUT=0

# Set the default commandline
GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0 earlyprintk=ttyS0"

# Set the grub console type
GRUB_TERMINAL=console
"""
OS_RELEASE = """\
PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=jammy
"""
LSB_RELEASE = """\
DISTRIB_ID=Ubuntu
DISTRIB_RELEASE=22.04
DISTRIB_CODENAME=jammy
DISTRIB_DESCRIPTION="Ubuntu 22.04.4 LTS"
"""
NOBLE_OS_RELEASE = """\
PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
"""
NOBLE_LSB_RELEASE = """\
DISTRIB_ID=Ubuntu
DISTRIB_RELEASE=24.04
DISTRIB_CODENAME=noble
DISTRIB_DESCRIPTION="Ubuntu 24.04.1 LTS"
"""
# The Allowed-Origins and defaults of Ubuntu 22.04's /etc/apt/apt.conf.d/50unattended-upgrades (comments
# shortened; every setting as shipped).
UBUNTU_UNATTENDED_UPGRADES = """\
// Automatically upgrade packages from these (origin:archive) pairs
//
// Note that in Ubuntu security updates may pull in new dependencies
// from non-security sources (e.g. chromium). By allowing the release
// pocket these get automatically pulled in.
Unattended-Upgrade::Allowed-Origins {
	"${distro_id}:${distro_codename}";
	"${distro_id}:${distro_codename}-security";
	// Extended Security Maintenance; doesn't necessarily exist for
	// every release and this system may not have it installed, but if
	// available, the policy for updates is such that unattended-upgrades
	// should also install from here by default.
	"${distro_id}ESMApps:${distro_codename}-apps-security";
	"${distro_id}ESM:${distro_codename}-infra-security";
//	"${distro_id}:${distro_codename}-updates";
//	"${distro_id}:${distro_codename}-proposed";
//	"${distro_id}:${distro_codename}-backports";
};

// Python regular expressions, matching packages to exclude from upgrading
Unattended-Upgrade::Package-Blacklist {
    // The following matches all packages starting with linux-
//  "linux-";
};

// This option controls whether the development release of Ubuntu will be
// upgraded automatically. Valid values are "true", "false", and "auto".
Unattended-Upgrade::DevRelease "auto";

// Split the upgrade into the smallest possible chunks so that
// they can be interrupted with SIGTERM.
//Unattended-Upgrade::MinimalSteps "true";

// Do automatic removal of unused packages after the upgrade
//Unattended-Upgrade::Remove-Unused-Dependencies "false";

// Automatically reboot *WITHOUT CONFIRMATION* if
//  the file /var/run/reboot-required is found after the upgrade
//Unattended-Upgrade::Automatic-Reboot "false";
"""
# Ubuntu 24.04's /etc/apt/apt.conf.d/50unattended-upgrades (unattended-upgrades 2.9.1+nmu4ubuntu1): the same
# Allowed-Origins (release and -security pockets, the ESM ones) and blacklist examples; settings as shipped,
# the commented-out options' long explanations shortened.
NOBLE_UNATTENDED_UPGRADES = """\
// Automatically upgrade packages from these (origin:archive) pairs
//
// Note that in Ubuntu security updates may pull in new dependencies
// from non-security sources (e.g. chromium). By allowing the release
// pocket these get automatically pulled in.
Unattended-Upgrade::Allowed-Origins {
	"${distro_id}:${distro_codename}";
	"${distro_id}:${distro_codename}-security";
	// Extended Security Maintenance; doesn't necessarily exist for
	// every release and this system may not have it installed, but if
	// available, the policy for updates is such that unattended-upgrades
	// should also install from here by default.
	"${distro_id}ESMApps:${distro_codename}-apps-security";
	"${distro_id}ESM:${distro_codename}-infra-security";
//	"${distro_id}:${distro_codename}-updates";
//	"${distro_id}:${distro_codename}-proposed";
//	"${distro_id}:${distro_codename}-backports";
};

// Python regular expressions, matching packages to exclude from upgrading
Unattended-Upgrade::Package-Blacklist {
    // The following matches all packages starting with linux-
//  "linux-";

    // Use $ to explicitely define the end of a package name. Without
    // the $, "libc6" would match all of them.
//  "libc6$";
//  "libc6-dev$";
//  "libc6-i686$";

    // Special characters need escaping
//  "libstdc\\+\\+6$";

    // The following matches packages like xen-system-amd64, xen-utils-4.1,
    // xenstore-utils and libxenstore3.0
//  "(lib)?xen(store)?";

    // For more information about Python regular expressions, see
    // https://docs.python.org/3/howto/regex.html
};

// This option controls whether the development release of Ubuntu will be
// upgraded automatically. Valid values are "true", "false", and "auto".
Unattended-Upgrade::DevRelease "auto";

// This option allows you to control if on a unclean dpkg exit
// unattended-upgrades will automatically run
//   dpkg --force-confold --configure -a
// The default is true, to ensure updates keep getting installed
//Unattended-Upgrade::AutoFixInterruptedDpkg "true";

// Split the upgrade into the smallest possible chunks so that
// they can be interrupted with SIGTERM. This makes the upgrade
// a bit slower but it has the benefit that shutdown while a upgrade
// is running is possible (with a small delay)
//Unattended-Upgrade::MinimalSteps "true";

// Install all updates when the machine is shutting down
// instead of doing it in the background while the machine is running.
//Unattended-Upgrade::InstallOnShutdown "false";

// Send email to this address for problems or packages upgrades
//Unattended-Upgrade::Mail "";

// Set this value to one of:
//    "always", "only-on-error" or "on-change"
//Unattended-Upgrade::MailReport "on-change";

// Remove unused automatically installed kernel-related packages
// (kernel images, kernel headers and kernel version locked tools).
//Unattended-Upgrade::Remove-Unused-Kernel-Packages "true";

// Do automatic removal of newly unused dependencies after the upgrade
//Unattended-Upgrade::Remove-New-Unused-Dependencies "true";

// Do automatic removal of unused packages after the upgrade
// (equivalent to apt-get autoremove)
//Unattended-Upgrade::Remove-Unused-Dependencies "false";

// Automatically reboot *WITHOUT CONFIRMATION* if
//  the file /var/run/reboot-required is found after the upgrade
//Unattended-Upgrade::Automatic-Reboot "false";

// Automatically reboot even if there are users currently logged in
// when Unattended-Upgrade::Automatic-Reboot is set to true
//Unattended-Upgrade::Automatic-Reboot-WithUsers "true";

// If automatic reboot is enabled and needed, reboot at the specific
// time instead of immediately
//  Default: "now"
//Unattended-Upgrade::Automatic-Reboot-Time "02:00";

// Enable logging to syslog. Default is False
// Unattended-Upgrade::SyslogEnable "false";

// Verbose logging
// Unattended-Upgrade::Verbose "false";

// Allow package downgrade if Pin-Priority exceeds 1000
// Unattended-Upgrade::Allow-downgrade "false";
"""
#: Per Ubuntu release: /usr/lib/os-release, /etc/lsb-release, the stock 50unattended-upgrades.
IDENTITY = {
    "jammy": (OS_RELEASE, LSB_RELEASE, UBUNTU_UNATTENDED_UPGRADES),
    "noble": (NOBLE_OS_RELEASE, NOBLE_LSB_RELEASE, NOBLE_UNATTENDED_UPGRADES),
}


@dataclass(frozen=True)
class Base:
    """A finished base: the host root, the apt repository and the native binaries."""

    path: Path

    @property
    def root(self) -> Path:
        return self.root_for("generic")

    def root_for(self, flavour: str, release: str = packages.DEFAULT_SERIES) -> Path:
        """The host root of that kernel flavour (``root`` for generic, ``root-<flavour>`` otherwise) and Ubuntu
        release (jammy as is; another adds ``-<release>``: ``root-noble``, ``root-azure-noble``)."""
        name = "root" if flavour == "generic" else f"root-{flavour}"
        return self.path / (name if release == packages.DEFAULT_SERIES else f"{name}-{release}")

    @property
    def repo(self) -> Path:
        return self.repo_for(packages.DEFAULT_SERIES)

    def repo_for(self, release: str) -> Path:
        """That release's apt repository (``repo`` for jammy, ``repo-<release>``)."""
        return self.path / ("repo" if release == packages.DEFAULT_SERIES else f"repo-{release}")

    def has_release(self, release: str) -> bool:
        return release == packages.DEFAULT_SERIES or (self.path / f".release-{release}-complete").exists()

    @property
    def init(self) -> Path:
        return self.path / "native" / "gpulab-init"


def _inputs() -> list[Path]:
    files = [LAB_DIR / "base.py", LAB_DIR / "packages.py"]
    files += sorted(p for p in HOSTFILES.iterdir() if p.is_file())
    files += sorted(NATIVE.glob("*.c"))
    return files


def base_key() -> str:
    h = hashlib.sha256(BASE_FORMAT.encode())
    for f in _inputs():
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(_pynvml_source().read_bytes())
    return h.hexdigest()[:16]


def _pynvml_source() -> Path:
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise LabError("pynvml is not installed on the controller: install the project (pip install -e .)")
    return Path(spec.origin)


def _run(cmd: list[str], log: Path, what: str, **kw: object) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise LabError(f"lab base: {what} failed (exit {proc.returncode}); see {log}")


def _mirror_reachable(mirror: str, suite: str) -> str | None:
    url = f"{mirror.rstrip('/')}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the configured Debian mirror
            resp.read(64)
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))


def ensure_debootstrap(cfg: LabConfig, log: Path) -> Path:
    included = hashlib.sha256(",".join(DEBOOTSTRAP_INCLUDE).encode()).hexdigest()[:8]
    target = cfg.cache / f"debootstrap-{cfg.suite}-{included}"
    if (target / ".gpulab-complete").exists():
        return target
    if shutil.which("debootstrap") is None:
        raise LabError("debootstrap not found: install it (apt-get install debootstrap; the README's setup does)")
    why = _mirror_reachable(cfg.mirror, cfg.suite)
    if why is not None:
        raise LabError(
            f"lab base not built (no {target}) and the Debian mirror {cfg.mirror} is unreachable ({why}):"
            " build it once with network access, or set lab.mirror / GPULAB_MIRROR to a reachable mirror"
        )
    cfg.cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".debootstrap-{cfg.suite}-", dir=cfg.cache))
    try:
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(DEBOOTSTRAP_INCLUDE)}",
                cfg.suite,
                str(tmp),
                cfg.mirror,
            ],
            log,
            f"debootstrap {cfg.suite} from {cfg.mirror}",
        )
        (tmp / ".gpulab-complete").write_text("ok\n")
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _build_native(out: Path) -> dict[str, Path]:
    from .native.build import NativeBuildError, build_native  # the simulated NVML and uname preload

    libs: dict[str, Path] = {}
    for version in packages.DRIVERS:
        try:
            built = build_native(out / version, version)
        except NativeBuildError as exc:
            raise LabError(str(exc).splitlines()[0]) from exc
        libs[version] = built["nvml"]
        libs["uname"] = built["uname_preload"]
    libs["init"] = _compile_program(out / "gpulab-init", "labinit.c")
    # installed as /usr/bin/nvidia-persistenced and nv-fabricmanager
    libs["driverd"] = _compile_program(out / "gpulab-driverd", "driverd.c")
    return libs


def _compile_program(target: Path, source: str) -> Path:
    """One of the lab's small C programs (lab/native/SOURCE) built into ``target``. Linked statically: every host
    runs each of them (its PID 1, its driver daemons) for as long as it is up, and a dynamically linked one carries
    about 0.1 MiB of private memory per process (the loader's relocations of libc, the uname preload) for nothing
    they use; both only make system calls."""
    proc = subprocess.run(
        ["gcc", "-O2", "-Wall", "-Werror", "-static", "-o", str(target), str(NATIVE / source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise LabError(f"could not compile lab/native/{source}: {proc.stderr.strip()}")
    return target


CUSTOMIZE = r"""
set -eu
R=$1; REPO=$2
mkdir -p "$R{repo_mount}"
mount --bind "$REPO" "$R{repo_mount}"
mount -o remount,bind,ro "$R{repo_mount}"
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=755 tmpfs "$R/dev"
for d in null zero full random urandom; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mkdir -p "$R/run/lock"
printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"; chmod 755 "$R/usr/sbin/policy-rc.d"
export DEBIAN_FRONTEND=noninteractive LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin
chroot "$R" apt-get update -q
chroot "$R" apt-get install -y -q --no-install-recommends {install}
chroot "$R" apt-mark auto {auto} >/dev/null
chroot "$R" apt-get clean
chroot "$R" dpkg-divert --local --rename --add /usr/bin/dmesg
chroot "$R" dpkg-divert --local --rename --add /usr/lib/os-release
rm -f "$R/usr/sbin/policy-rc.d"
"""


def _customize(
    root: Path, repo: Path, native: dict[str, Path], log: Path, flavour: str, release: str = packages.DEFAULT_SERIES
) -> None:
    # Sources: only the lab repository (hosts have no network); Debian's lists are dropped so that hosts do
    # not rebuild ~70 MB of apt caches in their overlays.
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    for lists in (root / "var/lib/apt/lists").glob("*_dists_*"):
        lists.unlink()
    (root / "etc/apt/sources.list.d/gpulab.list").write_text(
        "".join(f"deb [trusted=yes] file:{REPO_MOUNT}/{pocket} ./\n" for pocket in packages.POCKETS)
    )
    boot = packages.boot_kernel(flavour, release)
    tools = packages.SERIES_TOOL_VERSIONS[release]
    install = [
        f"grub2-common={tools['grub2-common']}",
        f"mokutil={tools['mokutil']}",
        f"kmod={tools['kmod']}",
        f"linux-image-{flavour}={packages.meta_version(boot)}",
        f"linux-headers-{boot}={packages.kernel_version(boot)}",
        *(
            f"{name}-{packages.DRIVER_BRANCH}={packages.driver_version(packages.BOOT_DRIVER, release)}"
            for name in ("nvidia-driver", "nvidia-dkms", "nvidia-utils", "libnvidia-compute", "nvidia-kernel-common")
        ),
        f"walinuxagent={packages.SERIES_AGENT_VERSIONS[release][0]}",
    ]
    auto = [f"linux-image-{boot}", f"linux-modules-{boot}", "dkms"]
    auto += [
        f"{name}-{packages.DRIVER_BRANCH}"
        for name in ("nvidia-dkms", "nvidia-utils", "libnvidia-compute", "nvidia-kernel-common")
    ]
    script = CUSTOMIZE.replace("{repo_mount}", REPO_MOUNT)
    script = script.replace("{install}", " ".join(install)).replace("{auto}", " ".join(auto))
    _run(
        [
            "unshare",
            "--mount",
            "--pid",
            "--fork",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(root),
            str(repo),
        ],
        log,
        f"installing the simulated {release} {flavour} kernel and NVIDIA driver into the base",
    )
    _install_lab_files(root, native, release)
    _run(["chroot", str(root), "update-grub"], log, f"update-grub in the {flavour} base")


def _run_chroot(root: Path, argv: list[str]) -> None:
    proc = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"lab base: {' '.join(argv)} failed in the base (exit {proc.returncode}): {proc.stderr.strip()}")


def _put(root: Path, dest: str, src: Path | str, mode: int = 0o644) -> None:
    target = root / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    if isinstance(src, Path):
        shutil.copyfile(src, target)
    else:
        target.write_text(src)
    target.chmod(mode)


def _install_lab_files(root: Path, native: dict[str, Path], release: str = packages.DEFAULT_SERIES) -> None:
    # Power: reboot/shutdown/halt/poweroff signal the host's own init (never reboot(2)).
    _put(root, "/usr/sbin/gpulab-power", HOSTFILES / "gpulab-power", 0o755)
    for name in ("reboot", "shutdown", "halt", "poweroff"):
        link = root / "usr/sbin" / name
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to("gpulab-power")
    _put(root, "/usr/bin/dmesg", HOSTFILES / "dmesg", 0o755)
    # The login user an Azure Ubuntu image has (cloud-init's default user): its own group, adm and sudo, no
    # password ('*': sshd without PAM refuses a locked '!' account, an image's sshd with PAM does not), and
    # cloud-init's sudoers rule. Its authorized_keys is written per host (lab/control.py).
    _run_chroot(root, ["useradd", "-m", "-u", str(LOGIN_UID), "-U", "-G", "adm,sudo", "-s", "/bin/bash",
                       "-c", "", LOGIN_USER])
    _run_chroot(root, ["usermod", "-p", "*", LOGIN_USER])
    _put(root, "/etc/sudoers.d/90-cloud-init-users",
         f"# Created by cloud-init\n\n# User rules for {LOGIN_USER}\n{LOGIN_USER} ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    # The host's own notion of its booted kernel for uname(2) callers.
    _put(root, "/usr/lib/gpulab/libgpulab-uname.so", native["uname"], 0o755)
    _put(root, "/etc/ld.so.preload", "/usr/lib/gpulab/libgpulab-uname.so\n")
    # pynvml, as a host with the NVIDIA Python bindings would have it.
    _put(root, PYNVML_PATH, _pynvml_source())
    _put(
        root,
        "/etc/ssh/sshd_config.d/10-gpulab.conf",
        "# gpulab: key-only root login; the listen address is in 20-gpulab-listen.conf (per host)\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nUseDNS no\nMaxStartups 200:30:400\nMaxSessions 50\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n",
    )
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # every host gets its own key at creation
    # Boot (gpulab-init runs /etc/rc2.d/S*): drop the start scripts an Azure image's systemd does not run at boot.
    # Ubuntu masks sudo's unit (sudo makes /run/sudo/ts itself on first use), and unattended-upgrades' script does
    # nothing on start. Each cost a shell with init-functions on every boot of every host (about 9 ms of CPU: a
    # sixth of a host's start at 1,000 hosts). The scripts stay in /etc/init.d.
    for name in ("sudo", "unattended-upgrades"):
        for link in (root / "etc/rc2.d").glob(f"S[0-9][0-9]{name}"):
            link.unlink()
    # Ubuntu's stock boot-loader defaults and an Azure cloud image's grub.d settings.
    _put(root, "/etc/default/grub", ETC_DEFAULT_GRUB)
    _put(root, "/etc/default/grub.d/50-cloudimg-settings.cfg", CLOUDIMG_GRUB)
    _put(root, "/boot/grub/grubenv", "# GRUB Environment Block\n".ljust(1024, "#"))
    # The release's Ubuntu identity, so `lsb_release` (Debian's reads os-release) and unattended-upgrades'
    # ${distro_id}/${distro_codename} say Ubuntu/jammy or Ubuntu/noble.
    os_release, lsb_release, unattended = IDENTITY[release]
    _put(root, "/usr/lib/os-release", os_release)
    _put(root, "/etc/lsb-release", lsb_release)
    _put(
        root,
        "/etc/apt/apt.conf.d/20auto-upgrades",
        'APT::Periodic::Update-Package-Lists "1";\nAPT::Periodic::Unattended-Upgrade "1";\n',
    )
    # Ubuntu's stock unattended-upgrades configuration, unchanged: the lab repository's Release says
    # Origin: Ubuntu, Suite: <release>-security, which its "${distro_id}:${distro_codename}-security" selects.
    _put(root, "/etc/apt/apt.conf.d/50unattended-upgrades", unattended)
    for leftover in ("run/reboot-required", "run/reboot-required.pkgs"):
        (root / leftover).unlink(missing_ok=True)
    (root / "var/log/kern.log").touch()
    subprocess.run(["chroot", str(root), "ldconfig"], check=True)


def ensure_base(cfg: LabConfig) -> Base:
    """Return the cached base for the current lab sources, building what is missing."""
    key = base_key()
    final = cfg.cache / f"base-{key}"
    if (final / ".gpulab-complete").exists():
        return Base(final)
    cfg.cache.mkdir(parents=True, exist_ok=True)
    log = cfg.cache / "build.log"
    deboot = ensure_debootstrap(cfg, log)
    tmp = Path(tempfile.mkdtemp(prefix=f".base-{key}-", dir=cfg.cache))
    try:
        native = _build_native(tmp / "native")
        packages.build_repo(tmp / "repo", lambda version: native[version], native["driverd"])
        for flavour in packages.FLAVOURS:
            root = Base(tmp).root_for(flavour)
            _run(["cp", "-a", "--reflink=auto", str(deboot), str(root)], log, "copying the debootstrap root")
            (root / ".gpulab-complete").unlink(missing_ok=True)
            _customize(root, tmp / "repo", native, log, flavour)
        (tmp / ".gpulab-complete").write_text(key + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in cfg.cache.glob("base-*"):
        if old != final and not _in_use(old):
            shutil.rmtree(old, ignore_errors=True)
    return Base(final)


def ensure_release(cfg: LabConfig, base: Base, release: str) -> Base:
    """Add another Ubuntu release's repository and host roots to a finished base, once, when a host of that
    release is first asked for (jammy's are always there): ``repo-<release>/``, ``root-<release>``,
    ``root-<flavour>-<release>``. Built in a temporary directory beside them and renamed into place, the marker
    ``.release-<release>-complete`` last; the roots already in use by running hosts are never touched."""
    packages.check_series(release)
    if base.has_release(release):
        return base
    log = cfg.cache / "build.log"
    deboot = ensure_debootstrap(cfg, log)
    tmp = Path(tempfile.mkdtemp(prefix=f".release-{release}-", dir=base.path))
    try:
        native = _build_native(tmp / "native")
        staged = Base(tmp)
        packages.build_repo(staged.repo_for(release), lambda version: native[version], native["driverd"], release)
        for flavour in packages.FLAVOURS:
            root = staged.root_for(flavour, release)
            _run(["cp", "-a", "--reflink=auto", str(deboot), str(root)], log, "copying the debootstrap root")
            (root / ".gpulab-complete").unlink(missing_ok=True)
            _customize(root, staged.repo_for(release), native, log, flavour, release)
        if not base.has_release(release):  # another lab may have finished the same release meanwhile
            parts = [staged.repo_for(release), *(staged.root_for(f, release) for f in packages.FLAVOURS)]
            for part in parts:
                final = base.path / part.name
                if final.exists():  # left by an interrupted build (no marker): nothing boots from it
                    shutil.rmtree(final)
                os.replace(part, final)
            (base.path / f".release-{release}-complete").write_text(release + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return base


def _in_use(base_dir: Path) -> bool:
    """True while any overlay mount anywhere uses this base as its lower layer."""
    needle = str(base_dir / "root")
    for mounts in Path("/proc").glob("[0-9]*/mounts"):
        try:
            if needle in mounts.read_text():
                return True
        except OSError:
            continue
    return False
