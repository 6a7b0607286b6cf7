"""The packages section: dpkg status, installed kernels with their NVIDIA module, the driver package."""

import gzip
import lzma
import os
import re

from .common import (
    KERNEL_FAMILY,
    Options,  # noqa: F401 - type comments
    _read_text,
    _unrooted,
    upstream_version,
)
from .modules import (
    MODULE_SCAN_MAX_BYTES,
    ZstdUnavailable,
    _modinfo_field,
    _zstd_chunks,
    module_signed,
    module_source,
    would_load,
)
from .system import kernel_flavour

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple  # noqa: F401 - type comments

MODULE_WALK_MAX_ENTRIES = 50000
MODULE_WALK_MAX_DEPTH = 8

KERNEL_META_RE = re.compile(r"^linux-(?:%s)" % KERNEL_FAMILY)

# A versioned kernel package: linux-image-6.5.0-45-generic, linux-image-unsigned-6.5.0-45-generic,
# linux-image-6.1.0-18-cloud-amd64 (Debian), linux-image-6.8.0-1015-azure.
KERNEL_IMAGE_RE = re.compile(r"^linux-image-(?:unsigned-)?(?P<release>\d+\.\d+[^\s]*)$")
# Any package whose name carries a kernel ABI version (6.5.0-45, 6.1.0-18, 5.15.0-1064).
VERSIONED_KERNEL_PKG_RE = re.compile(r"-\d+\.\d+(?:\.\d+)?-\d+")
KERNEL_NON_META = frozenset(
    (
        "linux-base",
        "linux-firmware",
        "linux-libc-dev",
        "linux-doc",
        "linux-sound-base",
        "linux-tools-common",
        "linux-cloud-tools-common",
        "linux-source",
        "linux-compiler-gcc-12-x86",
    )
)
KERNEL_NON_META_PREFIXES = ("linux-tools-", "linux-cloud-tools-", "linux-source-", "linux-doc-", "linux-kbuild-")
NVIDIA_PACKAGE_RE = re.compile(r"^(nvidia-|libnvidia-|cuda-drivers)")
# A driver branch as Ubuntu's package names carry it: 535, 535-server, 535-open, 535-server-open.
_BRANCH = r"(?P<branch>\d+(?:-server)?(?:-open)?)"
DRIVER_PACKAGE_RE = re.compile(r"^nvidia-driver(?:-" + _BRANCH + r"|-open|-server|-server-open)?$")
# Without nvidia-driver-<branch> (ubuntu-drivers --gpgpu installs the headless packages): packages that name the
# whole branch, -open included ...
BRANCH_PACKAGE_RE = re.compile(r"^nvidia-(?:headless-no-dkms|headless|dkms|kernel-source)-" + _BRANCH + r"$")
# ... then the userspace, which Ubuntu's -open packages share with the proprietary branch (no -open here).
USERSPACE_PACKAGE_RE = re.compile(
    r"^(?:libnvidia-compute|nvidia-utils|nvidia-kernel-common|libnvidia-gl)-(?P<branch>\d+(?:-server)?)$"
)


def parse_dpkg_status(text):
    # type: (str) -> List[Dict[str, str]]
    """Parse /var/lib/dpkg/status into one dict per stanza (continuation lines folded away)."""
    entries = []  # type: List[Dict[str, str]]
    current = {}  # type: Dict[str, str]
    last_key = None  # type: Optional[str]
    for line in text.splitlines():
        if not line.strip():
            if current:
                entries.append(current)
            current, last_key = {}, None
            continue
        if line[0] in " \t":
            if last_key is not None and last_key in ("Package", "Status", "Version", "Architecture", "Source"):
                current[last_key] += " " + line.strip()
            continue
        if ":" not in line:
            continue
        key, value = line.split(":", 1)
        last_key = key.strip()
        current[last_key] = value.strip()
    if current:
        entries.append(current)
    return entries


def _is_installed(entry):
    # type: (Dict[str, str]) -> bool
    status = entry.get("Status", "").split()
    # "want flag state": installed or configured-but-broken states still have the files on disk
    return len(status) == 3 and status[2] in ("installed", "half-configured", "triggers-awaited", "triggers-pending")


def _is_meta_kernel(name):
    # type: (str) -> bool
    """linux-generic, linux-image-generic, linux-headers-azure, linux-image-amd64, linux-generic-hwe-22.04:
    kernel packages without a kernel ABI version in the name (they pull the next kernel in)."""
    if not KERNEL_META_RE.match(name) or name in KERNEL_NON_META:
        return False
    if any(name.startswith(p) for p in KERNEL_NON_META_PREFIXES):
        return False
    return VERSIONED_KERNEL_PKG_RE.search(name) is None


def collect_packages(options, secure_boot=None, entries=None):
    # type: (Options, Optional[bool], Optional[List[Dict[str, str]]]) -> Dict[str, Any]
    """The ``packages`` section. ``entries`` is /var/lib/dpkg/status already parsed (:func:`parse_dpkg_status`),
    read here when None: the status file of a real host is 1-3 MB, parsed once per probe."""
    status_path = options.path("/var/lib/dpkg/status")
    try:
        if entries is None:
            entries = parse_dpkg_status(_read_text(status_path))
    except (IOError, OSError) as exc:
        return {
            "source": status_path,
            "available": False,
            "error": str(exc),
            "kernels": [],
            "kernel_meta": {},
            "held": [],
            "nvidia": {},
            "driver_package": None,
            "driver_package_version": None,
            "driver_branch": None,
        }
    installed = {}  # type: Dict[str, Dict[str, str]]
    held = []  # type: List[str]
    for entry in entries:
        name = entry.get("Package")
        if not name:
            continue
        status = entry.get("Status", "").split()
        if status and status[0] == "hold":
            held.append(name)
        if _is_installed(entry):
            installed[name] = entry

    kernels = []
    for name in sorted(installed):
        match = KERNEL_IMAGE_RE.match(name)
        if not match:
            continue
        release = match.group("release")
        kernels.append(_kernel_entry(options, release, name, installed, secure_boot))
    kernel_meta = {name: installed[name].get("Version") for name in sorted(installed) if _is_meta_kernel(name)}
    nvidia = {name: installed[name].get("Version") for name in sorted(installed) if NVIDIA_PACKAGE_RE.match(name)}
    driver_package, driver_version, branch = _driver_package(nvidia)
    return {
        "source": status_path,
        "available": True,
        "error": None,
        "kernels": kernels,
        "kernel_meta": kernel_meta,
        "held": sorted(set(held)),
        "nvidia": nvidia,
        "driver_package": driver_package,
        "driver_package_version": driver_version,
        "driver_branch": branch,
    }


def _driver_package(nvidia):
    # type: (Dict[str, Optional[str]]) -> Tuple[Optional[str], Optional[str], Optional[str]]
    """The driver package, its upstream version and the driver branch, whole (``535-server``, ``535-open``: the
    signed module packages and every other name follow from it): ``nvidia-driver-<branch>`` first, else a package
    naming the whole branch (headless, DKMS, kernel source), else the userspace (never ``-open``)."""
    candidates = []
    for name, version in nvidia.items():
        for rank, pattern in ((0, DRIVER_PACKAGE_RE), (2, BRANCH_PACKAGE_RE), (3, USERSPACE_PACKAGE_RE)):
            match = pattern.match(name)
            if match:
                branch = match.group("branch")
                candidates.append((rank if branch or rank else 1, name, version, branch))
                break
    if not candidates:
        return None, None, None
    candidates.sort(key=lambda c: (c[0], c[1]))
    _, name, version, branch = candidates[0]
    upstream = upstream_version(version)
    if branch is None and upstream:
        branch = upstream.split(".")[0]
    return name, upstream, branch


# linux-modules-nvidia-535-6.5.0-1025-azure, linux-modules-nvidia-535-server-open-6.5.0-1025-azure: a release
# starts with a digit, so the branch and the release part unambiguously (the flavour meta-packages do not match).
_SIGNED_PACKAGE_RE = re.compile(r"^linux-modules-nvidia-" + _BRANCH + r"-(?P<release>\d.*)$")


def _kernel_entry(options, release, image_package, installed, secure_boot=None):
    # type: (Options, str, str, Dict[str, Dict[str, str]], Optional[bool]) -> Dict[str, Any]
    modules_dir = options.path("/lib/modules", release)
    module_path = find_nvidia_module(modules_dir)
    version = None
    version_error = None
    signed = None  # type: Optional[bool]
    if module_path is not None:
        try:
            version = module_version(module_path)
        except (IOError, OSError, EOFError, lzma.LZMAError) as exc:
            version_error = str(exc)
        try:
            signed = module_signed(module_path)
        except (IOError, OSError, EOFError, lzma.LZMAError) as exc:
            version_error = version_error or str(exc)
    source = module_source(modules_dir, module_path)
    packages = []  # type: List[str]
    for name in sorted(installed):
        match = _SIGNED_PACKAGE_RE.match(name)
        if match and match.group("release") == release:
            packages.append(name)
    return {
        "release": release,
        "flavour": kernel_flavour(release),
        "signed_module_packages": packages,
        "image_package": image_package,
        "image_version": installed[image_package].get("Version"),
        "headers_installed": ("linux-headers-" + release) in installed,
        "modules_package_installed": ("linux-modules-" + release) in installed,
        "modules_installed": os.path.isdir(modules_dir),
        "nvidia_module": {
            "present": module_path is not None,
            "version": version,
            "path": _unrooted(options, module_path),
            "error": version_error,
            "source": source,
            "signed": signed,
            "would_load": would_load(module_path is not None, signed, source, secure_boot),
        },
        "dkms": _dkms_for_release(options, release),
    }


_MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


def find_nvidia_module(modules_dir):
    # type: (str) -> Optional[str]
    """The nvidia.ko for one kernel: DKMS location, distro location, then a bounded walk."""
    if not os.path.isdir(modules_dir):
        return None
    for directory, prefix in (
        (os.path.join(modules_dir, "updates", "dkms"), "nvidia.ko"),
        (os.path.join(modules_dir, "kernel", "drivers", "video"), "nvidia"),
    ):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix) and name.endswith(_MODULE_SUFFIXES) and _is_core_module(name):
                return os.path.join(directory, name)
    seen = 0
    base_depth = modules_dir.rstrip("/").count("/")
    for directory, dirnames, filenames in os.walk(modules_dir):
        dirnames.sort()
        if directory.count("/") - base_depth >= MODULE_WALK_MAX_DEPTH:
            dirnames[:] = []
        seen += len(filenames) + len(dirnames)
        for name in sorted(filenames):
            if name.startswith("nvidia.ko") and name.endswith(_MODULE_SUFFIXES):
                return os.path.join(directory, name)
        if seen > MODULE_WALK_MAX_ENTRIES:
            break
    return None


def _is_core_module(name):
    # type: (str) -> bool
    """nvidia.ko, not nvidia-uvm.ko / nvidia-drm.ko / nvidiafb.ko."""
    stem = name.split(".ko", 1)[0]
    return stem == "nvidia"


_MODINFO_RE = re.compile(rb"(?:^|\x00)version=([0-9][0-9A-Za-z.+~_-]*)\x00")
_MODINFO_TEXT_RE = re.compile(rb"(?m)^version:\s*([0-9][0-9A-Za-z.+~_-]*)\s*$")
_VERSION_TEXT_RE = re.compile(r"^[0-9][0-9A-Za-z.+~_-]{0,63}$")


def _scan_version(chunks):
    # type: (Iterable[bytes]) -> Optional[str]
    tail = b""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        data = tail + chunk
        for regex in (_MODINFO_RE, _MODINFO_TEXT_RE):
            match = regex.search(data)
            if match:
                return match.group(1).decode("ascii", "replace")
        tail = data[-256:]
        if total >= MODULE_SCAN_MAX_BYTES:
            break
    return None


def module_version(path):
    # type: (str) -> Optional[str]
    """The ``version`` of a kernel module file, from its .modinfo strings (``version=535.183.01``)
    or a modinfo-like ``version:`` line; .ko.gz and .ko.xz are decompressed with the standard library,
    .ko.zst with the host's zstd program (else ``modinfo -F version``; None when neither can read it)."""
    if path.endswith(".zst"):
        try:
            chunks = _zstd_chunks(path)
            try:
                return _scan_version(chunks)
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # a version found early ends zstd now
        except ZstdUnavailable:
            version = _modinfo_field(path, "version")
            first = version.splitlines()[0].strip() if version else ""
            return first if _VERSION_TEXT_RE.match(first) else None
    if path.endswith(".gz"):
        opener = gzip.open  # type: Callable[..., Any]
    elif path.endswith(".xz"):
        opener = lzma.open
    else:
        opener = open
    with opener(path, "rb") as handle:
        return _scan_version(iter(lambda: handle.read(1024 * 1024), b""))


def _dkms_for_release(options, release):
    # type: (Options, str) -> List[Dict[str, Any]]
    out = []  # type: List[Dict[str, Any]]
    root = options.path("/var/lib/dkms")
    try:
        modules = sorted(os.listdir(root))
    except OSError:
        return out
    for module in modules:
        if not module.startswith("nvidia"):
            continue
        try:
            versions = sorted(os.listdir(os.path.join(root, module)))
        except OSError:
            continue
        for version in versions:
            release_dir = os.path.join(root, module, version, release)
            if not os.path.isdir(release_dir):
                continue
            built = False
            for arch in sorted(os.listdir(release_dir)):
                module_dir = os.path.join(release_dir, arch, "module")
                try:
                    if any(n.startswith("nvidia") and ".ko" in n for n in os.listdir(module_dir)):
                        built = True
                except OSError:
                    continue
            installed = any(
                os.path.exists(os.path.join(options.path("/lib/modules", release, "updates", "dkms"), "nvidia" + s))
                for s in _MODULE_SUFFIXES
            )
            state = "installed" if built and installed else ("built" if built else "added")
            out.append({"module": module, "version": version, "state": state})
    return out
