"""The lab's apt repository: packages shaped like an Ubuntu 22.04 GPU VM's (generic or Azure), built with dpkg-deb.

Two flat repositories, as Ubuntu's pockets (Release ``Origin: Ubuntu``, ``Suite: jammy-security`` /
``jammy-updates``, so Ubuntu's stock ``50unattended-upgrades`` line ``${distro_id}:${distro_codename}-security``
selects the security pocket unchanged):

* ``security``: per kernel flavour two kernels with their image/modules/headers packages and the meta-packages
  that pull each one in (``generic``: 6.5.0-44-generic, 6.5.0-45-generic; ``azure``: 6.5.0-1024-azure,
  6.5.0-1025-azure), the NVIDIA driver 535.183.01, its signed precompiled kernel modules, the boot-loader,
  ``mokutil`` and ``kmod`` stand-ins, and ``walinuxagent`` at two versions (an ordinary upgrade that must keep
  flowing after hardening).
* ``updates``: the newer NVIDIA driver 535.216.01 and the signed modules built for it.

Ubuntu's default unattended-upgrades configuration allows only the ``-security`` pocket; the lab hosts are
configured the same way, so an unattended run brings the new kernel (through ``linux-image-<flavour>``) but
not the newer driver, exactly the S1 failure of the runbook.

Versions follow Ubuntu's shapes. A kernel ``6.5.0-1025-azure`` is in ``linux-image-6.5.0-1025-azure``,
``linux-modules-6.5.0-1025-azure`` and ``linux-headers-6.5.0-1025-azure`` at Debian version
``6.5.0-1025.26~22.04.1`` (ABI 1025, upload 26, HWE backport suffix); its meta-packages ``linux-azure``,
``linux-image-azure``, ``linux-headers-azure`` are at ``6.5.0.1025.26~22.04.1``. The generic kernels keep the
lab's earlier numbers (``6.5.0-45.45``, meta ``6.5.0.45.45``).

Signed NVIDIA modules, as Ubuntu's linux-restricted-modules: per kernel ``linux-modules-nvidia-535-<release>``
installs ``/lib/modules/<release>/kernel/nvidia-535/nvidia.ko`` (and ``nvidia-uvm.ko``), signed the kernel's way
(module bytes, a PKCS#7 blob, the 12-byte ``struct module_signature``, then ``~Module signature appended~\n``).
It is built for one driver upstream version (its ``.modinfo`` says ``version=<upstream>``) and depends on
``linux-image-<release>`` and ``nvidia-kernel-common-535 (>= <upstream>), nvidia-kernel-common-535 (<=
<upstream>-1)``. The build for the first driver (535.183.01, security pocket) has the kernel's own Debian version
(``6.5.0-1025.26~22.04.1``); a respin for a later driver gets ``+N`` (``6.5.0-1025.26~22.04.1+1`` for
535.216.01, updates pocket), so ``apt-get install linux-modules-nvidia-535-<release>=<version>`` picks the build
that matches the installed driver. The meta-package ``linux-modules-nvidia-535-<flavour>`` has one version per
kernel and driver build (``<meta version>`` and ``<meta version>+1``), each depending on exactly that build of
the kernel's module package.

Driver branches (:data:`DRIVER_BRANCHES`): every driver and signed-module package above exists for ``535``,
``535-server`` and ``535-open`` under Ubuntu's names: ``nvidia-driver-535-server``, ``nvidia-dkms-535-server``,
``nvidia-kernel-common-535-server``, ``linux-modules-nvidia-535-server-<release>`` (modules in
``kernel/nvidia-535srv/``, depending on ``nvidia-kernel-common-535-server``) and
``linux-modules-nvidia-535-server-<flavour>``; ``535-open`` has ``nvidia-driver-535-open``,
``nvidia-dkms-535-open`` and ``linux-modules-nvidia-535-open-<release>`` (``kernel/nvidia-535-open/``) over the
plain branch's userspace and ``nvidia-kernel-common-535``. The base image installs ``535``; a host of another
branch swaps it with apt at creation (lab/control.py).

Kernel module builds are played by a small DKMS stand-in (``lab/hostfiles/dkms``): a module is built for a
kernel only when that kernel's headers are installed, into ``updates/dkms/`` (searched before the kernel's own
tree, as Ubuntu's depmod.conf says, so a DKMS module shadows a signed one). DKMS-built modules are unsigned.
Hosts start with ``linux-image-<flavour>`` and the headers of the booted kernel only, as an Azure image with the
NVIDIA extension does, so the new kernel that unattended-upgrades installs has no NVIDIA module.

Ubuntu 24.04 (noble; ``lab.release`` / ``lab.up --release noble``) gets its own repository, built by the same
functions with ``series="noble"``: pockets ``noble-security`` / ``noble-updates``, 6.8 kernels (generic
6.8.0-45/-47, azure 6.8.0-1016/-1017 at ``6.8.0-1017.20``, the meta-packages at the kernel's own version as noble's
are), the driver at ``535.183.01-0ubuntu0.24.04.1``, dkms 3.0.11. Its kernels are built with
``CONFIG_MODULE_COMPRESS_ZSTD=y``: ``linux-modules-<release>`` ships the kernel's own modules signed, then
zstd-compressed (``.ko.zst``), and the DKMS stand-in compresses what it builds for such a kernel as DKMS 3 does
(``updates/dkms/nvidia.ko.zst``). The signed NVIDIA modules stay ``kernel/nvidia-535/nvidia.ko``: on noble,
linux-restricted-modules links them at install time from ``linux-objects-nvidia-*`` and installs them uncompressed.

Kernel packages run ``/etc/kernel/postinst.d`` (DKMS, then ``zz-update-grub``) on configure and
``/etc/kernel/postrm.d`` (``zz-update-grub``) on removal, as Ubuntu's do; the lab boots what ``update-grub``
wrote to ``/boot/grub/grub.cfg`` (see ``lab/boot.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LabError

HOSTFILES = Path(__file__).resolve().parent / "hostfiles"


@dataclass(frozen=True)
class Kernel:
    release: str  # 6.5.0-1025-azure
    version: str  # Debian version of the versioned packages: 6.5.0-1025.26~22.04.1
    meta: str  # Debian version of the flavour's meta-packages: 6.5.0.1025.26~22.04.1

    @property
    def flavour(self) -> str:
        return self.release.rsplit("-", 1)[1]


FLAVOURS = ("generic", "azure")
# Ubuntu releases the lab can play (``lab.release``); jammy is the default and keeps the tables below.
SERIES = ("jammy", "noble")
DEFAULT_SERIES = "jammy"
FLAVOUR_KERNELS: dict[str, tuple[Kernel, Kernel]] = {
    "generic": (
        Kernel("6.5.0-44-generic", "6.5.0-44.44", "6.5.0.44.44"),
        Kernel("6.5.0-45-generic", "6.5.0-45.45", "6.5.0.45.45"),
    ),
    "azure": (
        Kernel("6.5.0-1024-azure", "6.5.0-1024.25~22.04.1", "6.5.0.1024.25~22.04.1"),
        Kernel("6.5.0-1025-azure", "6.5.0-1025.26~22.04.1", "6.5.0.1025.26~22.04.1"),
    ),
}
# Ubuntu 24.04's 6.8 kernels. Since noble the kernel meta-packages carry the kernel's own Debian version
# (``linux-generic 6.8.0-47.47``, ``linux-azure 6.8.0-1017.20``), no longer the dotted jammy form; the upload
# number may differ from the ABI (``6.8.0-1016.18``). The kernel's own modules are zstd-compressed (``.ko.zst``,
# ``CONFIG_MODULE_COMPRESS_ZSTD=y``), and DKMS 3 compresses what it builds for such a kernel the same way.
NOBLE_FLAVOUR_KERNELS: dict[str, tuple[Kernel, Kernel]] = {
    "generic": (
        Kernel("6.8.0-45-generic", "6.8.0-45.45", "6.8.0-45.45"),
        Kernel("6.8.0-47-generic", "6.8.0-47.47", "6.8.0-47.47"),
    ),
    "azure": (
        Kernel("6.8.0-1016-azure", "6.8.0-1016.18", "6.8.0-1016.18"),
        Kernel("6.8.0-1017-azure", "6.8.0-1017.20", "6.8.0-1017.20"),
    ),
}
SERIES_KERNELS: dict[str, dict[str, tuple[Kernel, Kernel]]] = {
    "jammy": FLAVOUR_KERNELS,
    "noble": NOBLE_FLAVOUR_KERNELS,
}
ALL_KERNELS = tuple(k for pair in FLAVOUR_KERNELS.values() for k in pair)
KERNELS = tuple(k.release for k in FLAVOUR_KERNELS["generic"])  # the generic pair (boot, new)
BOOT_KERNEL = KERNELS[0]
DRIVER_BRANCH = "535"
# The driver branches the repository offers, as Ubuntu 22.04 ships them for the 535 driver: ``535`` (the desktop
# default), ``535-server`` (the datacenter branch ``ubuntu-drivers list --gpgpu`` picks; every package of its own,
# ``nvidia-kernel-common-535-server`` included) and ``535-open`` (NVIDIA's open kernel modules: only
# ``nvidia-driver-535-open`` and ``nvidia-dkms-535-open`` are its own, the userspace and
# ``nvidia-kernel-common-535`` are the plain branch's, which its signed modules depend on).
DRIVER_BRANCHES = ("535", "535-server", "535-open")
DRIVERS = ("535.183.01", "535.216.01")
DRIVER_POCKETS = ("security", "updates")
BOOT_DRIVER = DRIVERS[0]
UBUNTU_SUFFIX = "-0ubuntu0.22.04.1"
AGENT_VERSIONS = ("2.9.1.1-0ubuntu0.22.04.1", "2.11.1.4-0ubuntu0.22.04.1")
ORIGIN = "Ubuntu"
POCKETS = {"security": "jammy-security", "updates": "jammy-updates"}
# Per release: the driver's Debian suffix (``535.183.01-0ubuntu0.24.04.1`` on noble), the agent's versions and
# the tools whose versions differ (noble's dkms is 3.0.11, which compresses modules for a zstd kernel).
SERIES_SUFFIX = {"jammy": UBUNTU_SUFFIX, "noble": "-0ubuntu0.24.04.1"}
SERIES_AGENT_VERSIONS = {
    "jammy": AGENT_VERSIONS,
    "noble": ("2.10.0.8-0ubuntu0.24.04.1", "2.11.1.4-0ubuntu0.24.04.1"),
}
SERIES_TOOL_VERSIONS = {
    "jammy": {"dkms": "2.8.7-2ubuntu2.2", "grub2-common": "2.06-2ubuntu7.2", "mokutil": "0.6.0-2~22.04.2",
              "kmod": "29-1ubuntu1"},
    "noble": {"dkms": "3.0.11-1ubuntu13", "grub2-common": "2.12-1ubuntu7.1", "mokutil": "0.6.0-2build3",
              "kmod": "31+20240202-2ubuntu7.1"},
}
MAINTAINER = "GPU fleet lab <lab@gpulab.invalid>"
MODULE_SIGNATURE_MAGIC = b"~Module signature appended~\n"
GRUB_VERSION = "2.06-2ubuntu7.2"


def common_branch(branch: str) -> str:
    """The branch whose userspace and ``nvidia-kernel-common`` a branch uses: ``535-open`` -> ``535`` (Ubuntu's
    open-module packages share the proprietary branch's), ``535-server`` -> ``535-server``."""
    return branch[: -len("-open")] if branch.endswith("-open") else branch


def signed_module_dir(branch: str) -> str:
    """Where linux-restricted-modules installs a branch's signed modules under ``/lib/modules/<release>``:
    ``kernel/nvidia-535``, ``kernel/nvidia-535srv`` for ``535-server``, ``kernel/nvidia-535-open``."""
    name = common_branch(branch).replace("-server", "srv")
    return f"kernel/nvidia-{name}{'-open' if branch.endswith('-open') else ''}"


def check_branch(branch: str) -> str:
    if branch not in DRIVER_BRANCHES:
        raise LabError(f"no lab driver branch {branch!r}; the lab's branches: {', '.join(DRIVER_BRANCHES)}")
    return branch


SIGNED_MODULE_DIR = signed_module_dir(DRIVER_BRANCH)


def check_series(series: str) -> str:
    if series not in SERIES:
        raise LabError(f"Ubuntu release {series!r} is not one the lab has; use one of: {', '.join(SERIES)}")
    return series


def series_kernels(series: str = DEFAULT_SERIES) -> tuple[Kernel, ...]:
    """Every kernel of that release's repository (both flavours, boot and new)."""
    return tuple(k for pair in SERIES_KERNELS[check_series(series)].values() for k in pair)


def boot_kernel(flavour: str, series: str = DEFAULT_SERIES) -> str:
    """The kernel a fresh host of that flavour boots: ``6.5.0-44-generic`` / ``6.5.0-1024-azure`` (jammy),
    ``6.8.0-45-generic`` / ``6.8.0-1016-azure`` (noble)."""
    return SERIES_KERNELS[check_series(series)][flavour][0].release


def new_kernel(flavour: str, series: str = DEFAULT_SERIES) -> str:
    """The newer kernel the security pocket brings for that flavour."""
    return SERIES_KERNELS[check_series(series)][flavour][1].release


def kernel_series(release: str) -> str:
    """The Ubuntu release whose repository has that kernel."""
    for series in SERIES:
        if any(k.release == release for k in series_kernels(series)):
            return series
    raise LabError(f"no lab kernel {release!r}")


def kernel(release: str) -> Kernel:
    everything = [k for series in SERIES for k in series_kernels(series)]
    for k in everything:
        if k.release == release:
            return k
    raise LabError(f"no lab kernel {release!r}; the lab's kernels: {', '.join(k.release for k in everything)}")


def compresses_modules(release: str) -> bool:
    """Does that kernel ship (and DKMS install) its modules zstd-compressed? Noble's 6.8 kernels do."""
    return kernel_series(release) == "noble"


def series_pockets(series: str = DEFAULT_SERIES) -> dict[str, str]:
    """The lab repository's pockets for a release: ``{"security": "noble-security", "updates": ...}``."""
    check_series(series)
    return {pocket: f"{series}-{pocket}" for pocket in POCKETS}


def kernel_abi(release: str) -> str:
    """``6.5.0-45-generic`` -> ``45``."""
    return release.split("-")[1]


def kernel_version(release: str) -> str:
    """Debian version of the versioned kernel packages: ``6.5.0-45.45``, ``6.5.0-1025.26~22.04.1``."""
    return kernel(release).version


def meta_version(release: str) -> str:
    """Version of the kernel meta-packages for that kernel: ``6.5.0.45.45``, ``6.5.0.1025.26~22.04.1``."""
    return kernel(release).meta


def driver_version(upstream: str, series: str = DEFAULT_SERIES) -> str:
    return f"{upstream}{SERIES_SUFFIX[check_series(series)]}"


def signed_module_version(release: str, upstream: str) -> str:
    """Debian version of ``linux-modules-nvidia-535-<release>`` built for driver ``upstream``."""
    index = DRIVERS.index(upstream)
    return kernel_version(release) + (f"+{index}" if index else "")


def signed_meta_version(release: str, upstream: str) -> str:
    """Version of ``linux-modules-nvidia-535-<flavour>`` pointing at that kernel's build for ``upstream``."""
    index = DRIVERS.index(upstream)
    return meta_version(release) + (f"+{index}" if index else "")


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    pocket: str
    description: str
    depends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    architecture: str = "amd64"
    section: str = "misc"
    priority: str = "optional"
    files: dict[str, str | bytes | Path] = field(default_factory=dict)  # path in package -> content or a file
    links: dict[str, str] = field(default_factory=dict)  # path in package -> link target
    scripts: dict[str, str] = field(default_factory=dict)  # postinst/prerm/postrm -> shell text
    executables: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.architecture}.deb"


def _sh(body: str) -> str:
    return "#!/bin/sh\nset -e\n" + body.strip() + "\n"


def kernel_packages(release: str) -> list[Package]:
    k = kernel(release)
    ver = k.version
    upstream = release.rsplit("-", 1)[0].rsplit("-", 1)[0]  # 6.5.0
    image_postinst = _sh(
        f"""
if [ "$1" = configure ]; then
    # Hooks run for every new kernel: DKMS rebuilds its modules (when the headers are there), then
    # zz-update-grub regenerates grub.cfg, as Ubuntu's /etc/kernel/postinst.d does.
    if [ -d /etc/kernel/postinst.d ]; then
        run-parts --report --arg={release} --arg=/boot/vmlinuz-{release} /etc/kernel/postinst.d || true
    fi
    # As Ubuntu's update-notifier hook does: a new kernel needs a reboot.
    echo "*** System restart required ***" > /var/run/reboot-required
    grep -qx linux-image-{release} /var/run/reboot-required.pkgs 2>/dev/null \\
        || echo linux-image-{release} >> /var/run/reboot-required.pkgs
fi
"""
    )
    image_postrm = _sh(
        f"""
if [ "$1" = remove ] || [ "$1" = purge ]; then
    if [ -d /etc/kernel/postrm.d ]; then
        run-parts --report --arg={release} --arg=/boot/vmlinuz-{release} /etc/kernel/postrm.d || true
    fi
fi
"""
    )
    headers_postinst = _sh(
        f"""
if [ "$1" = configure ] && [ -d /etc/kernel/header_postinst.d ]; then
    run-parts --report --arg={release} /etc/kernel/header_postinst.d || true
fi
"""
    )
    config = "CONFIG_MODULES=y\nCONFIG_MODVERSIONS=y\nCONFIG_MODULE_SIG=y\n"
    module_files: dict[str, str | bytes | Path] = {}
    if compresses_modules(release):
        # Noble's kernel installs its modules signed, then zstd-compressed (the signature is inside).
        config += "CONFIG_MODULE_COMPRESS_ZSTD=y\n"
        for path, name in KERNEL_OWN_MODULES.items():
            module_files[f"/lib/modules/{release}/kernel/{path}.ko.zst"] = zstd_compress(
                kernel_module_bytes(release, name, "Build time autogenerated kernel key", version=None)
            )
    return [
        Package(
            name=f"linux-modules-{release}",
            version=ver,
            pocket="security",
            section="kernel",
            description=f"Linux kernel extra modules for version {upstream}",
            files={
                f"/lib/modules/{release}/modules.dep": "",
                f"/lib/modules/{release}/modules.order": "",
                f"/boot/System.map-{release}": f"gpulab simulated System.map for {release}\n",
                **module_files,
            },
        ),
        Package(
            name=f"linux-image-{release}",
            version=ver,
            pocket="security",
            section="kernel",
            description=f"Signed kernel image {k.flavour} ({release}, simulated by gpulab)",
            depends=(f"linux-modules-{release}",),
            files={
                f"/boot/vmlinuz-{release}": f"gpulab simulated kernel image {release}\n",
                f"/boot/config-{release}": config
                + "CONFIG_SECURITY_LOCKDOWN_LSM=y\nCONFIG_LOCK_DOWN_IN_EFI_SECURE_BOOT=y\n",
            },
            scripts={"postinst": image_postinst, "postrm": image_postrm},
        ),
        Package(
            name=f"linux-headers-{release}",
            version=ver,
            pocket="security",
            section="devel",
            description=f"Linux kernel headers for version {upstream}",
            files={
                f"/usr/src/linux-headers-{release}/Makefile": f"# gpulab simulated headers for {release}\n",
                f"/usr/src/linux-headers-{release}/.config": config,
            },
            links={f"/lib/modules/{release}/build": f"/usr/src/linux-headers-{release}"},
            scripts={"postinst": headers_postinst},
        ),
    ]


def kernel_meta_packages(release: str) -> list[Package]:
    k = kernel(release)
    ver, flavour = k.meta, k.flavour
    title = {"generic": "Generic", "azure": "Azure"}.get(flavour, flavour)
    return [
        Package(
            name=f"linux-image-{flavour}",
            version=ver,
            pocket="security",
            section="kernel",
            description=f"{title} Linux kernel image (meta-package)",
            depends=(f"linux-image-{release}", f"linux-modules-{release}"),
        ),
        Package(
            name=f"linux-headers-{flavour}",
            version=ver,
            pocket="security",
            section="kernel",
            description=f"{title} Linux kernel headers (meta-package)",
            depends=(f"linux-headers-{release}",),
        ),
        Package(
            name=f"linux-{flavour}",
            version=ver,
            pocket="security",
            section="kernel",
            description=f"Complete {title} Linux kernel and headers (meta-package)",
            depends=(f"linux-image-{flavour} (= {ver})", f"linux-headers-{flavour} (= {ver})"),
        ),
    ]


def _module_signature() -> bytes:
    """The tail the kernel's sign-file appends: a PKCS#7 blob, ``struct module_signature`` (algo, hash,
    id_type = 2 (PKEY_ID_PKCS7), signer_len, key_id_len, 3 pad bytes, big-endian sig_len), the magic."""
    blob = b"0\x82" + struct.pack(">H", 60) + b"gpulab simulated PKCS#7 signature, Canonical key".ljust(60, b".")
    header = struct.pack(">BBBBB3xI", 0, 0, 2, 0, 0, len(blob))  # 12 bytes
    return blob + header + MODULE_SIGNATURE_MAGIC


def signed_module_bytes(release: str, upstream: str, name: str = "nvidia") -> bytes:
    """A signed kernel module file as the lab's kernel sees one: ``.modinfo`` strings, then the signature."""
    return kernel_module_bytes(release, name, "Canonical Ltd. Kernel Module Signing", version=upstream)


def kernel_module_bytes(release: str, name: str, signer: str, version: str | None) -> bytes:
    """A signed module: an ELF header, the ``.modinfo`` strings (``version=`` only for a versioned module such as
    NVIDIA's), then the signature the kernel's sign-file appends."""
    fields = [f"version={version}"] if version else []
    fields += [
        "supported=external" if version else "license=GPL",
        "license=NVIDIA" if version else "intree=Y",
        "srcversion=6C9AE4F3DEB2E8E1B7B09E1",
        "alias=char-major-195-*" if version else f"alias={name}",
        "depends=",
        "retpoline=Y",
        f"name={name}",
        f"vermagic={release} SMP preempt mod_unload modversions ",
        "sig_id=PKCS#7",
        f"signer={signer}",
    ]
    modinfo = b"\0".join(s.encode() for s in fields)
    body = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\0" + modinfo + b"\0"
    return body + _module_signature()


# A few of the kernel's own modules, as noble's linux-modules-<release> ships them (path under kernel/, name).
KERNEL_OWN_MODULES = {"fs/nls/nls_iso8859-1": "nls_iso8859_1", "drivers/gpu/drm/drm": "drm"}


def zstd_compress(data: bytes) -> bytes:
    """zstd-compress with the zstd program (Debian's ``zstd``), as the kernel's ``make modules_install`` and
    DKMS 3 do for a ``CONFIG_MODULE_COMPRESS_ZSTD`` kernel."""
    if shutil.which("zstd") is None:
        raise LabError("zstd not found: install Debian's zstd (the README's setup command does)")
    proc = subprocess.run(["zstd", "-q", "-c", "-19"], input=data, capture_output=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"zstd could not compress a module: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def signed_module_packages(release: str, upstream: str, pocket: str, branch: str = DRIVER_BRANCH) -> list[Package]:
    """``linux-modules-nvidia-<branch>-<release>`` built for ``upstream`` and the flavour's meta-package version
    pointing at it. The module package depends on ``nvidia-kernel-common`` of the branch's :func:`common_branch`
    (``linux-modules-nvidia-535-server-6.5.0-1025-azure`` on ``nvidia-kernel-common-535-server``,
    ``linux-modules-nvidia-535-open-...`` on ``nvidia-kernel-common-535``), as Ubuntu's do."""
    k = kernel(release)
    ver = signed_module_version(release, upstream)
    meta = signed_meta_version(release, upstream)
    common = f"nvidia-kernel-common-{common_branch(branch)}"
    moddir = f"/lib/modules/{release}/{signed_module_dir(branch)}"
    return [
        Package(
            name=f"linux-modules-nvidia-{branch}-{release}",
            version=ver,
            pocket=pocket,
            section="restricted/kernel",
            description=f"Linux kernel nvidia modules for version {release} (signed, built for {upstream})",
            depends=(f"linux-image-{release}", f"{common} (>= {upstream})", f"{common} (<= {upstream}-1)"),
            files={
                f"{moddir}/nvidia.ko": signed_module_bytes(release, upstream, "nvidia"),
                f"{moddir}/nvidia-uvm.ko": signed_module_bytes(release, upstream, "nvidia_uvm"),
            },
        ),
        Package(
            name=f"linux-modules-nvidia-{branch}-{k.flavour}",
            version=meta,
            pocket=pocket,
            section="restricted/kernel",
            description=f"Extra drivers for nvidia-{branch} for the {k.flavour} flavour (meta-package)",
            depends=(f"linux-modules-nvidia-{branch}-{release} (= {ver})",),
        ),
    ]


def dkms_package(series: str = DEFAULT_SERIES) -> Package:
    hook = _sh('[ -n "${1:-}" ] || exit 0\ndkms autoinstall -k "$1" || true')
    return Package(
        name="dkms",
        version=SERIES_TOOL_VERSIONS[series]["dkms"],
        pocket="security",
        architecture="all",
        section="kernel",
        description="Dynamic Kernel Module System (gpulab stand-in keeping DKMS's layout and messages)",
        files={
            "/usr/sbin/dkms": HOSTFILES / "dkms",
            "/etc/kernel/postinst.d/dkms": hook,
            "/etc/kernel/header_postinst.d/dkms": hook,
        },
        executables=("/usr/sbin/dkms", "/etc/kernel/postinst.d/dkms", "/etc/kernel/header_postinst.d/dkms"),
    )


def grub_package(series: str = DEFAULT_SERIES) -> Package:
    """``update-grub``, ``grub-mkconfig``, ``grub-editenv``, ``grub-set-default``, ``grub-reboot`` and the
    kernel hooks ``zz-update-grub`` (stand-ins keeping GRUB's file formats and words)."""
    hook = _sh("command -v update-grub >/dev/null 2>&1 || exit 0\nexec update-grub")
    return Package(
        name="grub2-common",
        version=SERIES_TOOL_VERSIONS[series]["grub2-common"],
        pocket="security",
        section="admin",
        description="GRand Unified Bootloader (common files; gpulab stand-in writing grub.cfg and grubenv)",
        files={
            "/usr/sbin/grub-mkconfig": HOSTFILES / "grub-mkconfig",
            "/usr/sbin/update-grub": "#!/bin/sh\nset -e\nexec grub-mkconfig -o /boot/grub/grub.cfg \"$@\"\n",
            "/usr/bin/grub-editenv": HOSTFILES / "grub-editenv",
            "/usr/sbin/grub-set-default": HOSTFILES / "grub-set-default",
            "/usr/sbin/grub-reboot": HOSTFILES / "grub-set-default",
            "/etc/kernel/postinst.d/zz-update-grub": hook,
            "/etc/kernel/postrm.d/zz-update-grub": hook,
        },
        executables=(
            "/usr/sbin/grub-mkconfig",
            "/usr/sbin/update-grub",
            "/usr/bin/grub-editenv",
            "/usr/sbin/grub-set-default",
            "/usr/sbin/grub-reboot",
            "/etc/kernel/postinst.d/zz-update-grub",
            "/etc/kernel/postrm.d/zz-update-grub",
        ),
    )


def tool_packages(series: str = DEFAULT_SERIES) -> list[Package]:
    """``mokutil`` (Secure Boot state from the EFI variable) and ``kmod`` (modprobe, modinfo, lsmod against the
    lab's simulated kernel: module search order, signatures and lockdown)."""
    kmod_links = {f"/usr/sbin/{n}": "../bin/kmod" for n in ("modprobe", "rmmod", "insmod", "depmod")}
    kmod_links |= {f"/usr/bin/{n}": "kmod" for n in ("lsmod", "modinfo")}
    return [
        Package(
            name="mokutil",
            version=SERIES_TOOL_VERSIONS[series]["mokutil"],
            pocket="security",
            section="admin",
            description="tools for manipulating machine owner keys (gpulab stand-in: --sb-state)",
            files={"/usr/bin/mokutil": HOSTFILES / "mokutil"},
            executables=("/usr/bin/mokutil",),
        ),
        Package(
            name="kmod",
            version=SERIES_TOOL_VERSIONS[series]["kmod"],
            pocket="security",
            section="admin",
            description="tools for managing Linux kernel modules (gpulab stand-in for the simulated kernel)",
            files={"/usr/bin/kmod": HOSTFILES / "kmod"},
            links=kmod_links,
            executables=("/usr/bin/kmod",),
        ),
    ]


# The driver daemons' start script (sysvinit, as the lab's hosts run: /etc/rc2.d/S* at boot). Like Ubuntu's
# nvidia-persistenced.service it does nothing without the loaded module's devices; the fabric manager runs only on
# sizes with NVSwitch (``nvswitch=1`` in the host's hardware file, lab/hardware.py). Safe to run again (the lab
# re-runs the start scripts to bring sshd back): a daemon already running is left alone.
DRIVER_DAEMONS_INIT = _sh(
    """
### BEGIN INIT INFO
# Provides:          nvidia-persistenced nv-fabricmanager
# Short-Description: NVIDIA persistence daemon (and fabric manager on NVSwitch sizes): gpulab stand-ins
### END INIT INFO
[ "$1" = start ] || exit 0
[ -e /dev/nvidiactl ] || exit 0
start() {
    pid=$(cat "/run/$1/$1.pid" 2>/dev/null || true)
    if [ -n "$pid" ]; then
        case "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" in "/usr/bin/$1"*) return 0 ;; esac
    fi
    "/usr/bin/$1" </dev/null >/dev/null 2>&1 &
}
start nvidia-persistenced
if grep -qx 'nvswitch=1' /run/gpulab/hw/gpus 2>/dev/null; then start nv-fabricmanager; fi
exit 0
"""
)


def driver_packages(
    upstream: str, libnvml: Path, pocket: str, daemon: Path, branch: str = DRIVER_BRANCH,
    series: str = DEFAULT_SERIES,
) -> list[Package]:
    """The driver's packages of one branch and Ubuntu release; ``daemon``: lab/native/driverd.c built, installed
    as the driver's daemons. A ``-open`` branch has only its ``nvidia-driver-`` and ``nvidia-dkms-`` packages:
    the rest is the :func:`common_branch`'s. Packages of different branches conflict through the virtual names
    Ubuntu's provide (``nvidia-driver-binary``, ``nvidia-dkms-kernel``, ...), so apt swaps one branch for another.

    As on Ubuntu, ``nvidia-dkms-<branch>``'s maintainer scripts register and build the module; the
    ``nvidia-driver-<branch>`` metapackage has none, so reinstalling it rebuilds nothing."""
    ver = driver_version(upstream, series)
    shared = common_branch(branch)
    libdir = "/usr/lib/x86_64-linux-gnu"
    postinst = _sh(
        f"""
if [ "$1" = configure ]; then
    dkms add -m nvidia -v {upstream} >/dev/null
    # Build the kernel module for every installed kernel that has its headers (DKMS skips the others).
    for image in /boot/vmlinuz-*; do
        [ -e "$image" ] || continue
        kernel=${{image#/boot/vmlinuz-}}
        dkms install -m nvidia -v {upstream} -k "$kernel" || echo "nvidia {upstream}: module not built for $kernel"
    done
fi
"""
    )
    prerm = _sh(
        f"""
case "$1" in
    remove|upgrade|deconfigure) dkms remove -m nvidia -v {upstream} --all >/dev/null || true ;;
esac
"""
    )
    ldconfig = _sh("ldconfig")
    kind = " (open kernel module)" if branch.endswith("-open") else ""
    own = [
        Package(
            name=f"nvidia-dkms-{branch}",
            version=ver,
            pocket=pocket,
            section="restricted/misc",
            description=f"NVIDIA DKMS package{kind} (the module's source, registered with DKMS)",
            depends=("dkms", f"nvidia-kernel-common-{shared} (>= {upstream})"),
            provides=("nvidia-dkms-kernel",),
            conflicts=("nvidia-dkms-kernel",),
            files={
                f"/usr/src/nvidia-{upstream}/dkms.conf": (
                    f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{upstream}"\nBUILT_MODULE_NAME[0]="nvidia"\n'
                    'DEST_MODULE_LOCATION[0]="/updates/dkms"\nAUTOINSTALL="yes"\n'
                )
            },
            # As Ubuntu's: this package's scripts register the source with DKMS and build it (dkms_common).
            scripts={"postinst": postinst, "prerm": prerm},
        ),
        Package(
            name=f"nvidia-driver-{branch}",
            version=ver,
            pocket=pocket,
            section="restricted/misc",
            description=f"NVIDIA driver{kind} metapackage (kernel module built by DKMS)",
            depends=(
                "dkms",
                f"nvidia-dkms-{branch} (= {ver})",
                f"nvidia-utils-{shared} (= {ver})",
                f"libnvidia-compute-{shared} (= {ver})",
                f"nvidia-kernel-common-{shared} (= {ver})",
            ),
            provides=("nvidia-driver-binary",),
            conflicts=("nvidia-driver-binary",),
        ),
    ]
    if shared != branch:
        return own
    return [
        Package(
            name=f"libnvidia-compute-{branch}",
            version=ver,
            pocket=pocket,
            section="libs",
            description="NVIDIA libcompute package (libnvidia-ml: the lab's simulated NVML)",
            provides=("libnvidia-compute",),
            conflicts=("libnvidia-compute",),
            files={f"{libdir}/libnvidia-ml.so.{upstream}": libnvml},
            links={f"{libdir}/libnvidia-ml.so.1": f"libnvidia-ml.so.{upstream}"},
            scripts={"postinst": ldconfig, "postrm": ldconfig},
        ),
        Package(
            name=f"nvidia-kernel-common-{branch}",
            version=ver,
            pocket=pocket,
            section="restricted/libs",
            description="Shared files used with the kernel module (firmware; what the signed modules depend on)",
            provides=("nvidia-kernel-common",),
            conflicts=("nvidia-kernel-common",),
            files={f"/lib/firmware/nvidia/{upstream}/README": f"gpulab: NVIDIA GSP firmware for {upstream}\n"},
        ),
        Package(
            name=f"nvidia-utils-{branch}",
            version=ver,
            pocket=pocket,
            section="utils",
            # Ubuntu ships the daemons in nvidia-compute-utils-<branch> (persistenced) and
            # nvidia-fabricmanager-<branch>; the lab folds them into its one utils package.
            description="NVIDIA driver support binaries (nvidia-smi, nvidia-persistenced, nv-fabricmanager)",
            depends=(f"libnvidia-compute-{branch} (= {ver})",),
            provides=("nvidia-utils",),
            conflicts=("nvidia-utils",),
            files={
                "/usr/bin/nvidia-smi": HOSTFILES / "nvidia-smi",
                "/usr/bin/nvidia-persistenced": daemon,
                "/usr/bin/nv-fabricmanager": daemon,
                "/etc/init.d/nvidia-persistenced": DRIVER_DAEMONS_INIT,
            },
            links={"/etc/rc2.d/S02nvidia-persistenced": "../init.d/nvidia-persistenced"},
            executables=(
                "/usr/bin/nvidia-smi",
                "/usr/bin/nvidia-persistenced",
                "/usr/bin/nv-fabricmanager",
                "/etc/init.d/nvidia-persistenced",
            ),
        ),
        *own,
    ]


def agent_packages(series: str = DEFAULT_SERIES) -> list[Package]:
    return [
        Package(
            name="walinuxagent",
            version=v,
            pocket="security",
            architecture="all",
            section="admin",
            description="Windows Azure Linux Agent (stand-in: an ordinary upgrade that hardening must not block)",
            files={"/usr/share/doc/walinuxagent/VERSION": v + "\n"},
        )
        for v in SERIES_AGENT_VERSIONS[series]
    ]


def all_packages(
    libnvml_for: Callable[[str], Path], daemon: Path, series: str = DEFAULT_SERIES
) -> list[Package]:
    """Every package of one Ubuntu release's repository (``series``: jammy or noble)."""
    kernels = series_kernels(series)
    pkgs: list[Package] = [
        dkms_package(series), grub_package(series), *tool_packages(series), *agent_packages(series)
    ]
    for k in kernels:
        pkgs += kernel_packages(k.release) + kernel_meta_packages(k.release)
    for branch in DRIVER_BRANCHES:
        for upstream, pocket in zip(DRIVERS, DRIVER_POCKETS, strict=True):
            pkgs += driver_packages(upstream, libnvml_for(upstream), pocket, daemon, branch, series)
            for k in kernels:
                pkgs += signed_module_packages(k.release, upstream, pocket, branch)
    return pkgs


def build_deb(pkg: Package, out_dir: Path) -> Path:
    """Build one .deb with dpkg-deb (root-owned files, reproducible enough for a lab)."""
    with tempfile.TemporaryDirectory(prefix=f"gpulab-{pkg.name}-") as tmp:
        root = Path(tmp)
        for dest, src in pkg.files.items():
            target = root / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, Path):
                shutil.copyfile(src, target)
            elif isinstance(src, bytes):
                target.write_bytes(src)
            else:
                target.write_text(src)
            target.chmod(0o755 if (dest in pkg.executables or dest.endswith(".so") or ".so." in dest) else 0o644)
        for dest, link in pkg.links.items():
            target = root / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(link)
        debian = root / "DEBIAN"
        debian.mkdir()
        control = [
            f"Package: {pkg.name}",
            f"Version: {pkg.version}",
            f"Architecture: {pkg.architecture}",
            f"Maintainer: {MAINTAINER}",
            f"Section: {pkg.section}",
            f"Priority: {pkg.priority}",
        ]
        if pkg.depends:
            control.append("Depends: " + ", ".join(pkg.depends))
        if pkg.provides:
            control.append("Provides: " + ", ".join(pkg.provides))
        if pkg.conflicts:
            control.append("Conflicts: " + ", ".join(pkg.conflicts))
            control.append("Replaces: " + ", ".join(pkg.conflicts))
        control.append(f"Description: {pkg.description}")
        (debian / "control").write_text("\n".join(control) + "\n")
        for script, text in pkg.scripts.items():
            path = debian / script
            path.write_text(text)
            path.chmod(0o755)
        out = out_dir / pkg.filename
        proc = subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise LabError(f"dpkg-deb could not build {pkg.name} {pkg.version}: {proc.stderr.strip()}")
        return out


def _control_paragraph(deb: Path) -> str:
    proc = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True)
    return proc.stdout.rstrip("\n")


def _hashes(path: Path) -> tuple[str, str, int]:
    data = path.read_bytes()
    return hashlib.md5(data, usedforsecurity=False).hexdigest(), hashlib.sha256(data).hexdigest(), len(data)


def write_index(pocket_dir: Path, suite: str, debs: Iterable[Path], codename: str = DEFAULT_SERIES) -> None:
    """Write Packages, Packages.gz and Release for a flat repository (``deb file:DIR ./``)."""
    paragraphs = []
    for deb in sorted(debs):
        md5, sha256, size = _hashes(deb)
        paragraphs.append(
            _control_paragraph(deb) + f"\nFilename: ./{deb.name}\nSize: {size}\nMD5sum: {md5}\nSHA256: {sha256}"
        )
    packages = "\n\n".join(paragraphs) + "\n"
    (pocket_dir / "Packages").write_text(packages)
    with gzip.GzipFile(pocket_dir / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages.encode())
    lines = [
        f"Origin: {ORIGIN}",
        f"Label: {ORIGIN}",
        f"Suite: {suite}",
        f"Codename: {codename}",
        "Architectures: amd64 all",
        "Components: main",
        f"Description: gpulab simulated Ubuntu pocket {suite}",
        "Date: Mon, 01 Jul 2024 00:00:00 UTC",
    ]
    for field_name, algo in (("MD5Sum", 0), ("SHA256", 1)):
        lines.append(f"{field_name}:")
        for name in ("Packages", "Packages.gz"):
            h = _hashes(pocket_dir / name)
            lines.append(f" {h[algo]} {h[2]:>8} {name}")
    tmp = pocket_dir / ".Release.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, pocket_dir / "Release")


def build_repo(
    repo_dir: Path, libnvml_for: Callable[[str], Path], daemon: Path, series: str = DEFAULT_SERIES
) -> dict[str, list[Path]]:
    """Build every package of one Ubuntu release into ``repo_dir/<pocket>/`` and index each pocket as that
    release's (``Suite: <series>-security``; ``daemon``: the driver daemons' program, lab/native/driverd.c)."""
    if shutil.which("dpkg-deb") is None:
        raise LabError("dpkg-deb not found: install Debian's dpkg (the README's setup command does)")
    built: dict[str, list[Path]] = {p: [] for p in POCKETS}
    for pocket in POCKETS:
        (repo_dir / pocket).mkdir(parents=True, exist_ok=True)
    for pkg in all_packages(libnvml_for, daemon, series):
        built[pkg.pocket].append(build_deb(pkg, repo_dir / pkg.pocket))
    for pocket, suite in series_pockets(series).items():
        write_index(repo_dir / pocket, suite, built[pocket], codename=series)
    return built
