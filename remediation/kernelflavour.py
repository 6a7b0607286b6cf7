"""Kernel flavours as Ubuntu names them, and the package names that follow from one (pure).

A kernel release is ``<version>-<abi>-<flavour>`` (``6.5.0-1025-azure``, ``6.5.0-45-generic``). Every kernel package
rule follows the BOOTED kernel's flavour: Azure VMs run ``azure`` kernels pulled in by ``linux-azure`` /
``linux-image-azure`` / ``linux-headers-azure``; the signed precompiled NVIDIA modules come as
``linux-modules-nvidia-<branch>-<release>`` with the meta-package ``linux-modules-nvidia-<branch>-<flavour>``.
The probe has the same :func:`flavour_of` (``remediation/probe/gpuprobe.py: kernel_flavour``), for the host side.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "KernelRelease",
    "flavour_metas",
    "flavour_of",
    "is_flavour_meta",
    "meta_pattern",
    "parse_release",
    "signed_module_meta",
    "signed_module_package",
]

_RELEASE = re.compile(r"^(?P<version>\d+\.\d+(?:\.\d+)?)-(?P<abi>\d+)(?:-(?P<flavour>[a-z][a-z0-9.+-]*))?$")


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
    match = _RELEASE.match(release or "")
    if not match:
        return None
    return KernelRelease(str(release), match.group("version"), int(match.group("abi")), match.group("flavour"))


def flavour_of(release: str | None) -> str | None:
    """``6.5.0-1025-azure`` -> ``azure``; None when the release names no flavour."""
    parsed = parse_release(release)
    return parsed.flavour if parsed else None


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
    """Ubuntu's signed NVIDIA module package of one kernel (``linux-modules-nvidia-535-6.5.0-1025-azure``)."""
    return f"linux-modules-nvidia-{branch}-{release}"


def signed_module_meta(branch: str, flavour: str) -> str:
    """Its meta-package for a flavour: ``linux-modules-nvidia-535-azure``."""
    return f"linux-modules-nvidia-{branch}-{flavour}"
