"""The system section: kernel release and flavour, boot, os-release, reboot-required."""

import os
import re

from .common import (
    Options,  # noqa: F401 - type comments
    _read_text_or_none,
    _utc_iso,
)

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Dict, List, Optional  # noqa: F401 - type comments


def collect_system(options):
    # type: (Options) -> Dict[str, Any]
    release = options.kernel_release or os.uname().release
    boot_id = _read_text_or_none("/proc/sys/kernel/random/boot_id")
    boot_time = None
    stat = _read_text_or_none("/proc/stat")
    if stat:
        match = re.search(r"^btime\s+(\d+)", stat, re.MULTILINE)
        if match:
            boot_time = _utc_iso(int(match.group(1)))
    os_release = parse_os_release(_read_text_or_none(options.path("/etc/os-release")) or "")
    reboot_required = any(os.path.exists(options.path(p)) for p in ("/run/reboot-required", "/var/run/reboot-required"))
    pkgs = []  # type: List[str]
    for candidate in ("/run/reboot-required.pkgs", "/var/run/reboot-required.pkgs"):
        text = _read_text_or_none(options.path(candidate))
        if text is not None:
            pkgs = [line.strip() for line in text.splitlines() if line.strip()]
            break
    return {
        "kernel": release,
        "kernel_flavour": kernel_flavour(release),
        "boot_id": boot_id.strip() if boot_id else None,
        "boot_time": boot_time,
        "os_release": os_release,
        "reboot_required": reboot_required,
        "reboot_required_pkgs": pkgs,
    }


# A kernel release, uname -r: <version>-<abi>[-<flavour>]. The controller parses releases with this same pattern
# (remediation.core.kernelflavour.parse_release) and takes the flavour with kernel_flavour below.
KERNEL_RELEASE_RE = re.compile(r"^(?P<version>\d+\.\d+(?:\.\d+)?)-(?P<abi>\d+)(?:-(?P<flavour>[a-z][a-z0-9.+-]*))?$")


def kernel_flavour(release):
    # type: (Optional[str]) -> Optional[str]
    """The flavour of a kernel release, as Ubuntu names its meta-packages: ``6.5.0-1025-azure`` -> ``azure``,
    ``6.5.0-45-generic`` -> ``generic``, ``6.1.0-18-cloud-amd64`` -> ``cloud-amd64``; None when there is none."""
    match = KERNEL_RELEASE_RE.match(release or "")
    return match.group("flavour") if match else None


def parse_os_release(text):
    # type: (str) -> Dict[str, Optional[str]]
    values = {}  # type: Dict[str, str]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return {"ID": values.get("ID"), "VERSION_ID": values.get("VERSION_ID"), "PRETTY_NAME": values.get("PRETTY_NAME")}
