"""Shared fixtures: the lab fleet for integration tests (root only; skipped elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    for tool in ("debootstrap", "unshare", "nsenter", "gcc", "ssh", "dpkg-deb"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (./run setup installs it)"
    return None


def make_lab(tmp: Path, prefix: str, hosts: int, flavour: str = "generic", secure_boot: bool = False):  # type: ignore[no-untyped-def]
    from lab.config import LabConfig, test_prefix
    from lab.control import Lab

    cache = os.environ.get("GPULAB_CACHE_DIR") or str(ROOT / ".lab" / "cache")
    cfg = LabConfig.from_mapping(
        {
            "state_dir": str(tmp / "state"),
            "cache_dir": cache,
            "address_prefix": test_prefix(prefix),
            "boot_delay": 0.3,
            "inventory_path": str(tmp / "inventory" / "hosts.yml"),
            "flavour": flavour,  # tests run generic hosts unless they ask for azure ones
        },
        root=ROOT,
    )
    lab = Lab(cfg)
    lab.up(hosts, secure_boot=secure_boot)
    return lab


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A 4-host lab shared by the integration tests (hosts are cleared by the tests that break them)."""
    why = lab_unavailable()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("lab")
    the_lab = make_lab(tmp, "127.0.42", 4)
    try:
        yield the_lab
    finally:
        the_lab.down(purge=True)


def ssh(lab, host: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """Plain OpenSSH through the lab's generated config, host keys checked strictly."""
    cfg = lab.paths.ssh_config
    return subprocess.run(
        ["ssh", "-F", str(cfg), host, command], capture_output=True, text=True, timeout=timeout, check=False
    )
