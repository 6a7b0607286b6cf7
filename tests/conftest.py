"""Shared fixtures: the lab fleet for integration tests, and the guard that keeps the suite inside the checkout.

The lab needs root: without it the lab tests skip with that reason; as root, a missing tool fails them (``./run
setup`` installs every tool). A lab fixture's finalizer is in place before the first host starts (:func:`make_lab`
takes the lab down itself when ``up`` fails part-way), so a fixture that errors leaves no host, supervisor or sshd
behind on its addresses.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.openguard import session_guard

ROOT = Path(__file__).resolve().parents[1]
#: Every path the test process opens outside the checkout, temp dirs, cache and system files fails the test.
OPEN_GUARD = session_guard(ROOT)
LAB_TOOLS = ("debootstrap", "unshare", "nsenter", "gcc", "ssh", "dpkg-deb")


def require_lab() -> None:
    """Skip when not root (the lab cannot run); as root, fail when a tool the lab needs is missing."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (overlay mounts, namespaces): run the suite as root, as ./run test does")
    missing = [tool for tool in LAB_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: ./run setup installs the lab's Debian packages")


def make_lab(  # type: ignore[no-untyped-def]
    tmp: Path,
    prefix: str,
    hosts: int,
    flavour: str = "generic",
    secure_boot: bool = False,
    host_overrides: dict[str, Any] | None = None,
    driver_branch: str | None = None,
    release: str = "jammy",
):
    """A running lab of ``hosts`` hosts on ``prefix``; when starting it fails part-way, whatever did start is taken
    down (purged) before the error propagates, so the caller's ``try/finally`` only has to cover a lab that is up."""
    from lab.config import LabConfig, test_prefix
    from lab.control import Lab

    cache = os.environ.get("GPULAB_CACHE_DIR") or str(ROOT / ".lab" / "cache")
    mapping: dict[str, Any] = {
        "state_dir": str(tmp / "state"),
        "cache_dir": cache,
        "address_prefix": test_prefix(prefix),
        "boot_delay": 0.3,
        "inventory_path": str(tmp / "inventory" / "hosts.yml"),
        "flavour": flavour,  # tests run generic hosts unless they ask for azure ones
        "release": release,  # Ubuntu 22.04 hosts unless a test asks for noble (24.04) ones
    }
    if host_overrides:
        mapping["host_overrides"] = host_overrides
    lab = Lab(LabConfig.from_mapping(mapping, root=ROOT))
    try:
        lab.up(hosts, secure_boot=secure_boot, driver_branch=driver_branch)
    except BaseException:
        lab.down(purge=True)
        raise
    return lab


@pytest.fixture(scope="session", autouse=True)
def checkout_collection() -> Iterator[None]:
    """The library's playbook runs in the tests (harden, driver-restore, kernel-update called directly) use the
    working tree's playbooks, as ``invoke`` in the checkout does through ``ansible.collections_path``: the checkout's
    ``collections/`` first, ahead of any installed copy of gpufleet.remediation."""
    from remediation.transport.runner import collections_first

    with collections_first([ROOT / "collections"]):
        yield


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A 4-host lab shared by the integration tests (hosts are cleared by the tests that break them)."""
    require_lab()
    tmp = tmp_path_factory.mktemp("lab")
    the_lab = make_lab(tmp, "127.0.42", 4)
    try:
        yield the_lab
    finally:
        the_lab.down(purge=True)


def ssh(lab, host: str, command: str, timeout: float = 60, as_root: bool = True) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """Plain OpenSSH through the lab's generated config, host keys checked strictly. Lab hosts log in as
    ``azureuser``, as Azure images do; ``command`` runs as root through ``sudo -n`` (the whole of it, in ``sh -c``)
    unless ``as_root`` is false."""
    cfg = lab.paths.ssh_config
    remote = f"sudo -n -H sh -c {shlex.quote(command)}" if as_root else command
    return subprocess.run(
        ["ssh", "-F", str(cfg), host, remote], capture_output=True, text=True, timeout=timeout, check=False
    )


def _outside(paths: list[str]) -> str:
    shown = sorted(set(paths))
    return (f"opened {len(shown)} path(s) outside the checkout: {', '.join(shown[:5])}"
            f"{' ...' if len(shown) > 5 else ''} (the suite reads only files in the repository: copy the data in)")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    result = yield
    found = OPEN_GUARD.since(0)
    if found:
        raise pytest.UsageError("collection " + _outside(found))
    return result


def _guarded() -> Generator[None, None, None]:
    start = OPEN_GUARD.mark()
    result = yield
    found = OPEN_GUARD.since(start)
    if found:
        pytest.fail(_outside(found), pytrace=False)
    return result


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(lambda item: (yield from _guarded()))
pytest_runtest_call = pytest.hookimpl(wrapper=True)(lambda item: (yield from _guarded()))
pytest_runtest_teardown = pytest.hookimpl(wrapper=True)(lambda item, nextitem: (yield from _guarded()))
