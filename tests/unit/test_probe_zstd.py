"""The probe reads ``.ko.zst`` modules (Ubuntu 24.04's kernels and DKMS 3 install them) with the host's zstd program.

Real zstd frames made by Debian's ``zstd`` (``./run setup`` installs it): version and signature come out of the
decompressed bytes; without zstd the probe asks ``modinfo``; with neither, or a broken or oversized file, it says
"cannot tell" (None) instead of guessing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from remediation.hostside import gpuprobe

MAGIC = b"~Module signature appended~\n"


def _zstd(data: bytes) -> bytes:
    if shutil.which("zstd") is None:
        pytest.fail("zstd not installed: ./run setup installs Debian's zstd")
    return subprocess.run(["zstd", "-q", "-c", "-3"], input=data, capture_output=True, check=True).stdout


def _ko(version: str, signed: bool, padding: int = 0) -> bytes:
    """An ELF module with .modinfo strings, optionally signed as the kernel's sign-file does; ``padding`` bytes of
    code before .modinfo make it as large as a real nvidia.ko."""
    body = b"\x7fELF" + b"\x00" * 60 + os.urandom(padding) + f"srcversion=ABC\x00version={version}\x00".encode()
    body += b"license=NVIDIA\x00"
    if signed:  # PKCS#7 blob, struct module_signature (sig_len big-endian), the magic
        body += b"\x30\x82\x01\x00" + b"\x11" * 256 + bytes([0, 0, 2, 0, 0, 0, 0, 0]) + (260).to_bytes(4, "big") + MAGIC
    return body


def test_version_and_signature_from_real_zstd_frames(tmp_path: Path) -> None:
    for signed in (True, False):
        path = tmp_path / f"{signed}-nvidia.ko.zst"
        path.write_bytes(_zstd(_ko("535.183.01", signed)))
        assert path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # a real zstd frame, not the module's bytes
        assert gpuprobe.module_version(str(path)) == "535.183.01"
        assert gpuprobe.module_signed(str(path)) is signed


def test_a_dkms_text_module_compressed_by_dkms3(tmp_path: Path) -> None:
    """The lab's DKMS stand-in writes a modinfo-like text module; DKMS 3 compresses it for a zstd kernel."""
    text = b"filename:       /lib/modules/6.8.0-47-generic/updates/dkms/nvidia.ko\nversion:        535.216.01\n"
    path = tmp_path / "nvidia.ko.zst"
    path.write_bytes(_zstd(text))
    assert gpuprobe.module_version(str(path)) == "535.216.01"
    assert gpuprobe.module_signed(str(path)) is False


def test_a_large_module_stops_zstd_once_the_version_is_found(tmp_path: Path) -> None:
    """A version near the start: the probe ends zstd instead of decompressing the rest; the signature needs the
    whole file and still comes out right."""
    data = _ko("550.127.05", True) + os.urandom(8 * 1024 * 1024)
    path = tmp_path / "big.ko.zst"
    path.write_bytes(_zstd(data))
    assert gpuprobe.module_version(str(path)) == "550.127.05"
    signed_at_end = tmp_path / "end.ko.zst"
    signed_at_end.write_bytes(_zstd(_ko("550.127.05", True, padding=4 * 1024 * 1024)))
    assert gpuprobe.module_signed(str(signed_at_end)) is True


def test_no_zstd_falls_back_to_modinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nvidia.ko.zst"
    path.write_bytes(_zstd(_ko("535.183.01", True)))
    modinfo = tmp_path / "modinfo"
    # A modinfo that answers as kmod does for a signed module (version / signer fields), and logs its argv.
    modinfo.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {tmp_path}/argv\n'
        'case "$2" in version) echo 535.183.01 ;; signer) echo "Canonical Ltd. Kernel Module Signing" ;; esac\n'
    )
    modinfo.chmod(0o755)
    monkeypatch.setattr(gpuprobe.modules, "_which", lambda name, *a: str(modinfo) if name == "modinfo" else None)
    assert gpuprobe.module_version(str(path)) == "535.183.01"
    assert gpuprobe.module_signed(str(path)) is True
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == [f"-F version -- {path}", f"-F signer -- {path}"]  # fixed argv, the path after --


def test_neither_zstd_nor_modinfo_cannot_tell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nvidia.ko.zst"
    path.write_bytes(_zstd(_ko("535.183.01", True)))
    monkeypatch.setattr(gpuprobe.modules, "_which", lambda name, *a: None)
    assert gpuprobe.module_version(str(path)) is None
    assert gpuprobe.module_signed(str(path)) is None


def test_broken_or_oversized_frames_cannot_tell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken.ko.zst"
    broken.write_bytes(_zstd(_ko("535.183.01", True))[:-9])  # truncated: zstd exits non-zero
    real_which = gpuprobe.modules._which
    monkeypatch.setattr(gpuprobe.modules, "_which", lambda name, *a: real_which(name) if name == "zstd" else None)
    assert gpuprobe.module_signed(str(broken)) is None
    big = tmp_path / "big.ko.zst"
    big.write_bytes(_zstd(b"\x00" * (2 * 1024 * 1024)))
    with pytest.raises(gpuprobe.ZstdUnavailable, match="more than 1000 bytes"):
        list(gpuprobe.modules._zstd_chunks(str(big), max_bytes=1000))


def test_a_zstd_that_hangs_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hang = tmp_path / "zstd"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(gpuprobe.modules, "_which", lambda name, *a: str(hang) if name == "zstd" else None)
    path = tmp_path / "nvidia.ko.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd")
    started = time.monotonic()
    with pytest.raises(gpuprobe.ZstdUnavailable, match="timed out"):
        list(gpuprobe.modules._zstd_chunks(str(path), timeout=0.5))
    assert time.monotonic() - started < 10  # the child's group was killed, not waited out


def test_kernel_entry_of_a_noble_dkms_module(tmp_path: Path) -> None:
    """The probe's per-kernel entry on a noble layout: updates/dkms/nvidia.ko.zst gives version, source, signature
    and whether it would load, so the kernel update's gate 1 can pass."""
    release = "6.8.0-47-generic"
    moddir = tmp_path / "lib/modules" / release / "updates/dkms"
    moddir.mkdir(parents=True)
    (moddir / "nvidia.ko.zst").write_bytes(_zstd(_ko("535.183.01", False)))
    installed = {f"linux-image-{release}": {"Version": "6.8.0-47.47"}}
    options = gpuprobe.Options(root=str(tmp_path))
    entry = gpuprobe.packages._kernel_entry(options, release, f"linux-image-{release}", installed, secure_boot=False)
    module = entry["nvidia_module"]
    assert module["path"] == f"/lib/modules/{release}/updates/dkms/nvidia.ko.zst"
    assert (module["version"], module["source"], module["signed"], module["would_load"]) == (
        "535.183.01", "dkms", False, True,
    )
    under_sb = gpuprobe.packages._kernel_entry(options, release, f"linux-image-{release}", installed, secure_boot=True)
    assert under_sb["nvidia_module"]["would_load"] is False  # unsigned under Secure Boot: refused, not "unknown"
