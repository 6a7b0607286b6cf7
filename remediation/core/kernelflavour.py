"""Kernel flavours as Ubuntu names them, and the package names that follow from one (pure).

A kernel release is ``<version>-<abi>-<flavour>`` (``6.5.0-1025-azure``, ``6.5.0-45-generic``). Every kernel package
rule follows the BOOTED kernel's flavour: Azure VMs run ``azure`` kernels pulled in by ``linux-azure`` /
``linux-image-azure`` / ``linux-headers-azure``; the signed precompiled NVIDIA modules come as
``linux-modules-nvidia-<branch>-<release>`` with the meta-package ``linux-modules-nvidia-<branch>-<flavour>``.
A release is parsed with the probe's own pattern (``remediation/hostside/gpuprobe/system.py``:
``KERNEL_RELEASE_RE``), and a release's flavour is the probe's ``kernel_flavour``: one definition for the host and the
controller.

A driver branch is Ubuntu's whole suffix, never only its number: ``535``, ``535-server`` (the datacenter branch
``ubuntu-drivers list --gpgpu`` picks), ``535-open`` (open kernel modules), ``535-server-open``. Every package name
is built from the branch the probe read off the installed packages (``nvidia-driver-535-server`` ->
``535-server``): ``linux-modules-nvidia-535-<kernel>`` belongs to another driver than
``linux-modules-nvidia-535-server-<kernel>``. The ``-open`` branches keep the proprietary branch's userspace and
``nvidia-kernel-common`` (:func:`common_branch`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from remediation.hostside.gpuprobe import KERNEL_RELEASE_RE

__all__ = [
    "KernelRelease",
    "branch_number",
    "common_branch",
    "driver_install_packages",
    "flavour_metas",
    "is_branch",
    "is_flavour_meta",
    "kernel_common_package",
    "meta_pattern",
    "parse_release",
    "signed_module_meta",
    "signed_module_package",
]

_BRANCH = re.compile(r"^(?P<number>[0-9]+)(?P<server>-server)?(?P<open>-open)?$")


@dataclass(frozen=True)
class KernelRelease:
    """``6.5.0-1025-azure``: version ``6.5.0``, ABI 1025, flavour ``azure``."""

    release: str
    version: str
    abi: int
    flavour: str | None

    def sort_key(self) -> tuple[tuple[int, ...], int]:
        return tuple(int(p) for p in self.version.split(".")), self.abi


def parse_release(release: str | None) -> KernelRelease | None:
    """The parts of a ``uname -r`` release, or None when it does not look like ``X.Y.Z-ABI[-flavour]``."""
    match = KERNEL_RELEASE_RE.match(release or "")
    if not match:
        return None
    return KernelRelease(str(release), match.group("version"), int(match.group("abi")), match.group("flavour"))


def meta_pattern(flavour: str) -> str:
    """An anchored Python regex for the kernel meta-packages of ``flavour``: ``linux-azure``, ``linux-image-azure``,
    ``linux-headers-azure``, ``linux-modules-extra-azure``, ``linux-tools-azure``, the HWE/LTS/edge variants
    (``linux-generic-hwe-22.04``, ``linux-azure-lts-22.04``) and the signed NVIDIA module meta-package
    ``linux-modules-nvidia-535-azure`` (it pulls the next kernel in through the module package's dependency)."""
    f = re.escape(flavour)
    return (
        rf"^linux-(?:image-|headers-|modules-extra-|tools-|cloud-tools-|modules-nvidia-[0-9]+-(?:server-|open-)*)?"
        rf"{f}(?:-hwe-[0-9.]+|-lts-[0-9.]+|-edge)?$"
    )


def is_flavour_meta(package: str, flavour: str | None) -> bool:
    """``package`` is a kernel meta-package of ``flavour``."""
    return flavour is not None and re.match(meta_pattern(flavour), package) is not None


def flavour_metas(installed: Iterable[str], flavour: str | None) -> tuple[str, ...]:
    """The installed kernel meta-packages of ``flavour``, sorted."""
    return tuple(sorted(n for n in installed if is_flavour_meta(n, flavour)))


def signed_module_package(branch: str, release: str) -> str:
    """Ubuntu's signed NVIDIA module package of one kernel (``linux-modules-nvidia-535-6.5.0-1025-azure``,
    ``linux-modules-nvidia-535-server-6.5.0-1025-azure`` for the branch ``535-server``)."""
    return f"linux-modules-nvidia-{branch}-{release}"


def signed_module_meta(branch: str, flavour: str) -> str:
    """Its meta-package for a flavour: ``linux-modules-nvidia-535-azure``, ``linux-modules-nvidia-535-server-azure``."""
    return f"linux-modules-nvidia-{branch}-{flavour}"


def is_branch(branch: str | None) -> bool:
    """``535``, ``535-server``, ``535-open``, ``535-server-open``: a branch as Ubuntu's package names carry it."""
    return _BRANCH.fullmatch(str(branch or "")) is not None


def branch_number(branch: str) -> str:
    """``535-server`` -> ``535``."""
    match = _BRANCH.fullmatch(branch)
    return match.group("number") if match else branch


def common_branch(branch: str) -> str:
    """The branch whose userspace (``nvidia-utils-``, ``libnvidia-compute-``) and ``nvidia-kernel-common-`` a
    branch installs: Ubuntu's ``-open`` packages share the proprietary branch's (``nvidia-driver-535-open``
    depends on ``nvidia-kernel-common-535``, ``linux-modules-nvidia-535-server-open-<kernel>`` on
    ``nvidia-kernel-common-535-server``); the others are their own."""
    return branch[: -len("-open")] if branch.endswith("-open") else branch


def kernel_common_package(branch: str) -> str:
    """``nvidia-kernel-common-535-server``: what a branch's signed module packages depend on (with the driver
    version they are built for)."""
    return f"nvidia-kernel-common-{common_branch(branch)}"


def driver_install_packages(branch: str) -> tuple[str, str, str]:
    """What installing a branch's driver names: ``nvidia-driver-<branch>`` and the userspace it depends on
    (``nvidia-utils-``, ``libnvidia-compute-`` of :func:`common_branch`)."""
    common = common_branch(branch)
    return f"nvidia-driver-{branch}", f"nvidia-utils-{common}", f"libnvidia-compute-{common}"
