"""The lab's apt repository: packages shaped like an Azure Ubuntu GPU VM's, built with dpkg-deb.

Two flat repositories, as Ubuntu's pockets:

* ``security`` (Suite ``jammy-security``): the kernels 6.5.0-44-generic and 6.5.0-45-generic with their
  image/modules/headers packages and the meta-packages that pull each one in, the NVIDIA driver 535.183.01,
  and ``walinuxagent`` at two versions (an ordinary upgrade that must keep flowing after hardening).
* ``updates`` (Suite ``jammy-updates``): the newer NVIDIA driver 535.216.01.

Ubuntu's default unattended-upgrades configuration allows only the ``-security`` pocket; the lab hosts are
configured the same way, so an unattended run brings the new kernel (through ``linux-image-generic``) but
not the newer driver, exactly the S1 failure of the runbook.

Kernel module builds are played by a small DKMS stand-in (``lab/hostfiles/dkms``): a module is built for a
kernel only when that kernel's headers are installed. Hosts start with ``linux-image-generic`` and the
headers of the booted kernel only, as an Azure image with the NVIDIA extension does, so the new kernel that
unattended-upgrades installs has no NVIDIA module.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from remediation.errors import LabError

HOSTFILES = Path(__file__).resolve().parent / "hostfiles"

KERNELS = ("6.5.0-44-generic", "6.5.0-45-generic")
BOOT_KERNEL = KERNELS[0]
DRIVER_BRANCH = "535"
DRIVERS = ("535.183.01", "535.216.01")
BOOT_DRIVER = DRIVERS[0]
UBUNTU_SUFFIX = "-0ubuntu0.22.04.1"
AGENT_VERSIONS = ("2.9.1.1-0ubuntu0.22.04.1", "2.11.1.4-0ubuntu0.22.04.1")
ORIGIN = "GpuLab"
POCKETS = {"security": "jammy-security", "updates": "jammy-updates"}
MAINTAINER = "GPU fleet lab <lab@gpulab.invalid>"


def kernel_abi(release: str) -> str:
    """``6.5.0-45-generic`` -> ``45``."""
    return release.split("-")[1]


def kernel_version(release: str) -> str:
    """Debian version of the versioned kernel packages: ``6.5.0-45.45``."""
    base, abi = release.split("-")[0], kernel_abi(release)
    return f"{base}-{abi}.{abi}"


def meta_version(release: str) -> str:
    """Version of the kernel meta-packages for that kernel: ``6.5.0.45.45``."""
    base, abi = release.split("-")[0], kernel_abi(release)
    return f"{base}.{abi}.{abi}"


def driver_version(upstream: str) -> str:
    return f"{upstream}{UBUNTU_SUFFIX}"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    pocket: str
    description: str
    depends: tuple[str, ...] = ()
    architecture: str = "amd64"
    section: str = "misc"
    priority: str = "optional"
    files: dict[str, str | Path] = field(default_factory=dict)  # path in package -> text or a file to copy
    links: dict[str, str] = field(default_factory=dict)  # path in package -> link target
    scripts: dict[str, str] = field(default_factory=dict)  # postinst/prerm/postrm -> shell text
    executables: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.architecture}.deb"


def _sh(body: str) -> str:
    return "#!/bin/sh\nset -e\n" + body.strip() + "\n"


def kernel_packages(release: str) -> list[Package]:
    ver = kernel_version(release)
    image_postinst = _sh(
        f"""
if [ "$1" = configure ]; then
    # Hooks run for every new kernel (DKMS rebuilds its modules here, when the headers are there).
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
    headers_postinst = _sh(
        f"""
if [ "$1" = configure ] && [ -d /etc/kernel/header_postinst.d ]; then
    run-parts --report --arg={release} /etc/kernel/header_postinst.d || true
fi
"""
    )
    return [
        Package(
            name=f"linux-modules-{release}",
            version=ver,
            pocket="security",
            section="kernel",
            description=f"Linux kernel extra modules for version {release.rsplit('-', 1)[0]}",
            files={
                f"/lib/modules/{release}/modules.dep": "",
                f"/lib/modules/{release}/modules.order": "",
                f"/boot/System.map-{release}": f"gpulab simulated System.map for {release}\n",
            },
        ),
        Package(
            name=f"linux-image-{release}",
            version=ver,
            pocket="security",
            section="kernel",
            description=f"Signed kernel image generic ({release}, simulated by gpulab)",
            depends=(f"linux-modules-{release}",),
            files={
                f"/boot/vmlinuz-{release}": f"gpulab simulated kernel image {release}\n",
                f"/boot/config-{release}": "CONFIG_MODULES=y\nCONFIG_MODVERSIONS=y\n",
            },
            scripts={"postinst": image_postinst},
        ),
        Package(
            name=f"linux-headers-{release}",
            version=ver,
            pocket="security",
            section="devel",
            description=f"Linux kernel headers for version {release.rsplit('-', 1)[0]}",
            files={
                f"/usr/src/linux-headers-{release}/Makefile": f"# gpulab simulated headers for {release}\n",
                f"/usr/src/linux-headers-{release}/.config": "CONFIG_MODULES=y\n",
            },
            links={f"/lib/modules/{release}/build": f"/usr/src/linux-headers-{release}"},
            scripts={"postinst": headers_postinst},
        ),
    ]


def kernel_meta_packages(release: str) -> list[Package]:
    ver = meta_version(release)
    return [
        Package(
            name="linux-image-generic",
            version=ver,
            pocket="security",
            section="kernel",
            description="Generic Linux kernel image (meta-package)",
            depends=(f"linux-image-{release}", f"linux-modules-{release}"),
        ),
        Package(
            name="linux-headers-generic",
            version=ver,
            pocket="security",
            section="kernel",
            description="Generic Linux kernel headers (meta-package)",
            depends=(f"linux-headers-{release}",),
        ),
        Package(
            name="linux-generic",
            version=ver,
            pocket="security",
            section="kernel",
            description="Complete Generic Linux kernel and headers (meta-package)",
            depends=(f"linux-image-generic (= {ver})", f"linux-headers-generic (= {ver})"),
        ),
    ]


def dkms_package() -> Package:
    hook = _sh('[ -n "${1:-}" ] || exit 0\ndkms autoinstall -k "$1" || true')
    return Package(
        name="dkms",
        version="2.8.7-2ubuntu2.2",
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


def driver_packages(upstream: str, libnvml: Path, pocket: str) -> list[Package]:
    ver = driver_version(upstream)
    branch = DRIVER_BRANCH
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
    return [
        Package(
            name=f"libnvidia-compute-{branch}",
            version=ver,
            pocket=pocket,
            section="libs",
            description="NVIDIA libcompute package (libnvidia-ml: the lab's simulated NVML)",
            files={f"{libdir}/libnvidia-ml.so.{upstream}": libnvml},
            links={f"{libdir}/libnvidia-ml.so.1": f"libnvidia-ml.so.{upstream}"},
            scripts={"postinst": ldconfig, "postrm": ldconfig},
        ),
        Package(
            name=f"nvidia-utils-{branch}",
            version=ver,
            pocket=pocket,
            section="utils",
            description="NVIDIA driver support binaries (nvidia-smi)",
            depends=(f"libnvidia-compute-{branch} (= {ver})",),
            files={"/usr/bin/nvidia-smi": HOSTFILES / "nvidia-smi"},
            executables=("/usr/bin/nvidia-smi",),
        ),
        Package(
            name=f"nvidia-driver-{branch}",
            version=ver,
            pocket=pocket,
            section="restricted/misc",
            description="NVIDIA driver metapackage (kernel module built by DKMS)",
            depends=("dkms", f"nvidia-utils-{branch} (= {ver})", f"libnvidia-compute-{branch} (= {ver})"),
            files={
                f"/usr/src/nvidia-{upstream}/dkms.conf": (
                    f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{upstream}"\nBUILT_MODULE_NAME[0]="nvidia"\n'
                    'DEST_MODULE_LOCATION[0]="/updates/dkms"\nAUTOINSTALL="yes"\n'
                )
            },
            scripts={"postinst": postinst, "prerm": prerm},
        ),
    ]


def agent_packages() -> list[Package]:
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
        for v in AGENT_VERSIONS
    ]


def all_packages(libnvml_for: Callable[[str], Path]) -> list[Package]:
    pkgs: list[Package] = [dkms_package(), *agent_packages()]
    for release in KERNELS:
        pkgs += kernel_packages(release) + kernel_meta_packages(release)
    for upstream, pocket in zip(DRIVERS, ("security", "updates"), strict=True):
        pkgs += driver_packages(upstream, libnvml_for(upstream), pocket)
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


def write_index(pocket_dir: Path, suite: str, debs: Iterable[Path]) -> None:
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
        "Codename: jammy",
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


def build_repo(repo_dir: Path, libnvml_for: Callable[[str], Path]) -> dict[str, list[Path]]:
    """Build every package into ``repo_dir/<pocket>/`` and index each pocket."""
    if shutil.which("dpkg-deb") is None:
        raise LabError("dpkg-deb not found: install Debian's dpkg (the README's setup command does)")
    built: dict[str, list[Path]] = {p: [] for p in POCKETS}
    for pocket in POCKETS:
        (repo_dir / pocket).mkdir(parents=True, exist_ok=True)
    for pkg in all_packages(libnvml_for):
        built[pkg.pocket].append(build_deb(pkg, repo_dir / pkg.pocket))
    for pocket, suite in POCKETS.items():
        write_index(repo_dir / pocket, suite, built[pocket])
    return built
