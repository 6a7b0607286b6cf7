"""Secure Boot and kernel module signatures (and reading compressed modules)."""

import contextlib
import errno
import gzip
import lzma
import os
import re
import select
import subprocess
import time

from .common import (
    COMMAND_TIMEOUT_S,
    REAP_GRACE_S,
    Options,  # noqa: F401 - type comments
    _kill_group,
    _which,
    run_command,
)

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Callable, Dict, Iterable, List, Optional  # noqa: F401 - type comments

MODULE_SCAN_MAX_BYTES = 512 * 1024 * 1024
ZSTD_TIMEOUT_S = 30.0  # decompressing one .ko.zst (an nvidia.ko is ~100 MB; zstd does several hundred MB/s)

SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# What the kernel appends to a signed module (scripts/sign-file.c, include/linux/module_signature.h).
MODULE_SIGNATURE_MAGIC = b"~Module signature appended~\n"


def parse_secure_boot_efivar(data):
    # type: (bytes) -> Optional[bool]
    """The SecureBoot EFI variable as efivarfs shows it (4 attribute bytes + the value) -> enabled?"""
    if len(data) < 5:
        return None
    value = bytearray(data[4:5])[0]
    if value in (0, 1):
        return value == 1
    return None


_MOKUTIL_RE = re.compile(r"^SecureBoot (enabled|disabled)\s*$", re.MULTILINE)


def parse_mokutil_sb_state(text):
    # type: (str) -> Optional[bool]
    """``mokutil --sb-state`` -> enabled?  (``SecureBoot enabled`` / ``SecureBoot disabled``; "This system doesn't
    support Secure Boot" on a BIOS boot is disabled.)"""
    match = _MOKUTIL_RE.search(text)
    if match:
        return match.group(1) == "enabled"
    if "doesn't support Secure Boot" in text or "EFI variables are not supported" in text:
        return False
    return None


def collect_secure_boot(options):
    # type: (Options) -> Dict[str, Any]
    """Secure Boot state: the EFI variable, else ``mokutil --sb-state``, else a host without EFI (a BIOS boot has no
    Secure Boot), else unknown (``enabled`` null)."""
    errors = []  # type: List[str]
    path = options.path(SECURE_BOOT_EFIVAR)
    try:
        with open(path, "rb") as handle:
            enabled = parse_secure_boot_efivar(handle.read(64))
        if enabled is not None:
            return {"enabled": enabled, "source": "efivars", "error": None}
        errors.append("%s: unexpected content" % SECURE_BOOT_EFIVAR)
    except (IOError, OSError) as exc:
        if exc.errno != errno.ENOENT:
            errors.append("%s: %s" % (SECURE_BOOT_EFIVAR, exc.strerror))
    mokutil = _which("mokutil") if options.root in ("", "/") else None
    if mokutil is not None:
        run = run_command([mokutil, "--sb-state"], options.command_timeout)
        enabled = parse_mokutil_sb_state(run["stdout"] + "\n" + run["stderr"])
        if enabled is not None:
            return {"enabled": enabled, "source": "mokutil", "error": None}
        errors.append(run["error"] or "mokutil --sb-state: %s" % (run["stdout"] + run["stderr"]).strip()[:200])
    if not os.path.isdir(options.path("/sys/firmware/efi")) and os.path.isdir(options.path("/sys/firmware")):
        return {"enabled": False, "source": "no-efi", "error": None}
    return {"enabled": None, "source": None, "error": "; ".join(errors) or "no EFI variable and no mokutil"}


class ZstdUnavailable(Exception):
    """A .ko.zst that cannot be read on this host: no zstd program, or it failed, timed out or overflowed."""


def _zstd_chunks(path, timeout=ZSTD_TIMEOUT_S, max_bytes=MODULE_SCAN_MAX_BYTES):
    # type: (str, float, int) -> Iterable[bytes]
    """The decompressed bytes of a .zst file, in chunks, from the host's own ``zstd -q -d -c -- PATH`` (fixed
    argv, no shell; Ubuntu 24.04 installs zstd): the standard library has no zstd before Python 3.14.  At most
    ``max_bytes`` and ``timeout`` seconds; a consumer that stops early (it found what it wanted) ends the child.
    Raises :class:`ZstdUnavailable` when the program is missing, fails, is too slow or its output too long."""
    zstd = _which("zstd")
    if zstd is None:
        raise ZstdUnavailable("no zstd program on the host to read %s" % path)
    try:
        proc = subprocess.Popen(
            [zstd, "-q", "-d", "-c", "--", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except (IOError, OSError) as exc:
        raise ZstdUnavailable("zstd: %s" % exc) from None
    deadline = time.monotonic() + timeout
    total = 0
    finished = False
    try:
        stdout = proc.stdout
        assert stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZstdUnavailable("zstd -d %s timed out after %.0f s" % (path, timeout)) from None
            ready, _, _ = select.select([stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(stdout.fileno(), 1024 * 1024)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise ZstdUnavailable("%s decompresses to more than %d bytes" % (path, max_bytes))
            yield chunk
        try:
            rc = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise ZstdUnavailable("zstd -d %s timed out after %.0f s" % (path, timeout)) from None
        if rc != 0:
            err = proc.stderr.read(400) if proc.stderr is not None else b""
            raise ZstdUnavailable("zstd -d %s: exit %d %s" % (path, rc, err.decode("utf-8", "replace").strip()))
        finished = True
    finally:
        if not finished:
            _kill_group(proc.pid)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.wait(timeout=REAP_GRACE_S)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _modinfo_field(path, field, timeout=COMMAND_TIMEOUT_S):
    # type: (str, str, float) -> Optional[str]
    """``modinfo -F FIELD PATH`` (kmod; noble's reads .ko.zst): the value, "" when the module has none, None when
    modinfo is missing or cannot read the file."""
    modinfo = _which("modinfo")
    if modinfo is None:
        return None
    run = run_command([modinfo, "-F", field, "--", path], timeout)
    if run["error"] or run["rc"] != 0:
        return None
    return run["stdout"][:4096].strip()


def module_signed(path):
    # type: (str) -> Optional[bool]
    """Does the module file end with the kernel's signature magic?  .ko.gz/.ko.xz are decompressed with the
    standard library, .ko.zst with the host's zstd program (the signature is inside the compressed file); without
    zstd, ``modinfo`` (a signed module has a ``signer``); else None (cannot tell)."""
    size = len(MODULE_SIGNATURE_MAGIC)
    if path.endswith(".zst"):
        try:
            tail = b""
            for chunk in _zstd_chunks(path):
                tail = (tail + chunk)[-size:]
            return tail == MODULE_SIGNATURE_MAGIC
        except ZstdUnavailable:
            signer = _modinfo_field(path, "signer")
            return None if signer is None else bool(signer)
    if path.endswith((".gz", ".xz")):
        opener = gzip.open if path.endswith(".gz") else lzma.open  # type: Callable[..., Any]
        tail = b""
        total = 0
        with opener(path, "rb") as handle:
            while total < MODULE_SCAN_MAX_BYTES:
                chunk = handle.read(1024 * 1024)
                if not chunk:
                    break
                total += len(chunk)
                tail = (tail + chunk)[-size:]
        return tail == MODULE_SIGNATURE_MAGIC
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() < size:
            return False
        handle.seek(-size, os.SEEK_END)
        return handle.read(size) == MODULE_SIGNATURE_MAGIC


def module_source(modules_dir, path):
    # type: (str, Optional[str]) -> Optional[str]
    """Where a kernel's NVIDIA module comes from, by its place under /lib/modules/<release>: ``dkms`` (DKMS installs
    into ``updates/dkms``), ``package`` (the kernel's own tree, ``kernel/...``: a precompiled package such as
    linux-modules-nvidia-535-<release>), ``other``; None without a module."""
    if path is None:
        return None
    rel = os.path.relpath(path, modules_dir).replace(os.sep, "/")
    if rel.startswith("updates/dkms/"):
        return "dkms"
    if rel.startswith("kernel/"):
        return "package"
    return "other"


def would_load(present, signed, source, secure_boot):
    # type: (bool, Optional[bool], Optional[str], Optional[bool]) -> Optional[bool]
    """Would the kernel load this module?  A module signed by its distribution (a precompiled package) loads under
    Secure Boot; without Secure Boot any module loads; with it an unsigned one is refused, and a DKMS module signed
    with DKMS's own key loads only if that key is enrolled, which the probe cannot see.  None where it cannot be
    told (Secure Boot state unknown, a .ko.zst the host cannot decompress, a DKMS-signed module)."""
    if not present:
        return False
    if signed is True and source != "dkms":
        return True
    if secure_boot is False:
        return True
    if secure_boot is None:
        return None
    if signed is False:
        return False
    return None
