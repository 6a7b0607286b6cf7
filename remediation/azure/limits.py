"""The NVIDIA GPU driver VM extension's documented limits, checked against a host's facts before anything changes.

From Microsoft Learn, "NVIDIA GPU Driver Extension for Linux" (``virtual-machines/extensions/hpccompute-gpu-linux``,
ms.date 2025-06-30), and the driver list that page links as the extension's source of supported drivers
(github.com/Azure/azhpc-extensions ``NvidiaGPU/Nvidia-GPU-Linux-Resources.json``, Version 20240829):

* "Secure Boot is not supported using Windows or Linux extensions": the extension builds the module with DKMS,
  unsigned, and a Secure Boot kernel refuses it (on a Trusted Launch VM the install waits on a MOK password prompt
  and provisioning never finishes: Azure/azure-linux-extensions#1754). Ubuntu's signed precompiled module
  (``linux-modules-nvidia-<branch>-<kernel>``, the apt method with ``module_source: signed``) is the way there.
* Supported releases per driver type. The page's table: CUDA on Ubuntu 20.04 LTS; GRID on Ubuntu 22.04 LTS and
  24.04 LTS; it says the support depends "on driver support for the specific OS version", which the linked list
  states per driver: CUDA 12.2 (driver 535.54) on Ubuntu 22.04 LTS, CUDA 12.1 on Ubuntu 18.x/20.x; GRID 535.161.08 on
  Ubuntu 22.04, 20.04 and 18.04 LTS. :data:`SUPPORTED_UBUNTU` is the union of the two; no source lists CUDA on 24.04.
* The driver type follows the VM family (the list's ``DefaultSelectionsPerVMFamily``): NC and ND sizes get CUDA
  (GRID with the ``installGridNC`` / ``installGridND`` settings), NV sizes get GRID. AMD sizes (NVv4, ND MI300X) are
  not NVIDIA's: the extension does not apply.
* It installs the latest supported driver unless told otherwise, and for NC/ND sizes ``driverVersion`` is a CUDA
  toolkit version, not a driver version: what the host runs afterwards is what the extension reports
  (:func:`reported_driver_version`), never an inventory's pinned ``nvidia_driver_expected_version``.

Pure: no I/O. :func:`refusal` says in one line why the extension must not be used on a host, naming the apt path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from remediation.core import skus
from remediation.core.facts import HostFacts
from remediation.core.kernelflavour import signed_module_package

__all__ = ["SUPPORTED_UBUNTU", "driver_type", "refusal", "reported_driver_version"]

#: Ubuntu releases (``VERSION_ID``) the extension installs each driver type on (see the module docstring).
SUPPORTED_UBUNTU: Mapping[str, tuple[str, ...]] = {
    "CUDA": ("18.04", "20.04", "22.04"),
    "GRID": ("18.04", "20.04", "22.04", "24.04"),
}
EXTENSION = "the NvidiaGpuDriverLinux extension"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "yes", "1")


def driver_type(vm_size: str | None, settings: Mapping[str, Any]) -> tuple[str | None, str]:
    """(``CUDA`` | ``GRID`` | ``AMD`` | None, why) for a VM size and the extension's settings; None: cannot tell."""
    if not vm_size:
        return None, "azure_vm_size is not set for this host"
    name = str(vm_size).strip()
    known = skus.size(name)
    if known is not None and known.gpu_model.upper().startswith("AMD"):
        return "AMD", f"{known.name} has {known.gpu_model} GPUs"
    lower = name.lower()
    if lower.startswith("standard_nv"):
        return "GRID", f"{name} is an NV size (GRID drivers)"
    for prefix, setting in (("standard_nc", "installGridNC"), ("standard_nd", "installGridND")):
        if lower.startswith(prefix):
            if _truthy(settings.get(setting, False)):
                return "GRID", f"{name} with {setting}: true (GRID drivers)"
            return "CUDA", f"{name} is an {prefix[9:].upper()} size (CUDA drivers)"
    return None, f"{name} is not an N-series GPU size"


def _apt_path(facts: HostFacts) -> str:
    """The apt method's signed-module path for this host, naming the package when the branch is known."""
    branch, kernel = facts.packages.driver_branch, facts.system.kernel
    if branch and kernel:
        package = signed_module_package(branch, kernel)
        return (f"restore it with --method apt (driver_restore_method: apt), which installs Canonical's signed "
                f"module {package}")
    return "restore it with --method apt (driver_restore_method: apt), which installs Canonical's signed module"


def refusal(facts: HostFacts, host_vars: Mapping[str, Any]) -> str | None:
    """Why the extension must not restore this host (one line, with the apt path offered), or None."""
    sb = facts.secure_boot
    if sb.enabled is True:
        return (f"Secure Boot is on ({sb.source or 'probe'}): {EXTENSION} does not support Secure Boot (its DKMS "
                f"module is unsigned and the kernel refuses it); {_apt_path(facts)}")
    if sb.enabled is None:
        why = sb.error or "no EFI variable or mokutil answer"
        return (f"Secure Boot state unknown ({why}): {EXTENSION} does not support Secure Boot and this host's state "
                f"cannot be told; {_apt_path(facts)}")
    settings = host_vars.get("azure_nvidia_driver_extension_settings") or {}
    kind, why = driver_type(host_vars.get("azure_vm_size"), settings if isinstance(settings, Mapping) else {})
    if kind == "AMD":
        return f"{why}: {EXTENSION} installs NVIDIA drivers only; it does not apply to this VM"
    os_id = (facts.system.os_id or "").lower()
    version = facts.system.os_version_id or ""
    release = facts.system.os_pretty_name or f"{facts.system.os_id or '?'} {version or '?'}"
    if os_id != "ubuntu":
        return f"{release} is not an Ubuntu release {EXTENSION} is checked for here; {_apt_path(facts)}"
    if kind is not None and kind in SUPPORTED_UBUNTU:
        if version not in SUPPORTED_UBUNTU[kind]:
            listed = ", ".join(SUPPORTED_UBUNTU[kind])
            return (f"{release}: {EXTENSION} does not support Ubuntu {version} for {kind} drivers ({why}; supported:"
                    f" Ubuntu {listed}); {_apt_path(facts)}")
        return None
    # The driver type cannot be told: the release must be one every driver type supports.
    if all(version in releases for releases in SUPPORTED_UBUNTU.values()):
        return None
    some = [k for k, releases in SUPPORTED_UBUNTU.items() if version in releases]
    if some:
        return (f"{release}: {EXTENSION} supports Ubuntu {version} for {' and '.join(some)} drivers only and the "
                f"driver type cannot be told ({why}): set azure_vm_size for this host, or {_apt_path(facts)}")
    return f"{release}: {EXTENSION} does not support Ubuntu {version}; {_apt_path(facts)}"


_DRIVER = re.compile(r"(?i)\bdriver\b.{0,120}?(?<![\d.])(\d{3}\.\d{1,3}(?:\.\d{1,3})?)(?!\.?\d)")


def reported_driver_version(messages: Iterable[str]) -> str | None:
    """The NVIDIA driver version the extension's status messages name (``535.216.01``), or None.

    A driver version has a three-digit branch (``535.216.01``); CUDA versions (``12.2``) and handler versions
    (``1.9``) do not, so a message naming both is read right. The last message naming one wins (the install's end)."""
    found = None
    for message in messages:
        for m in _DRIVER.finditer(message[:2000]):
            found = m.group(1)
    return found
