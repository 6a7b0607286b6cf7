"""The ``gpufleet.remediation.dpkg_hold`` module's pure part (plugins/modules/dpkg_hold.py): what it reads from the
real ``dpkg-query`` over a status file with every state a hold can be in, which agrees with the real
``apt-mark showhold``, and which packages it chooses. The module's runs on hosts (one run, check mode, idempotence)
are in tests/lab/test_harden_roles.py and the gpu_kernel_hold Molecule scenario."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dpkg_hold", ROOT / "plugins/modules/dpkg_hold.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dpkg_hold = _module()

# Every dpkg state a hold can be in, with the fields the real dpkg-query requires: installed, a foreign architecture
# beside the native one, removed with its configuration kept, never installed; and packages that are installed or
# selected for removal but not held.
DPKG_STATUS = """\
Package: walinuxagent
Status: hold ok installed
Architecture: amd64
Version: 2.9.1.1-0ubuntu0.22.04.1
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Description: walinuxagent (test entry)

Package: linux-image-generic
Status: install ok installed
Architecture: amd64
Version: 6.5.0.44.44
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Description: linux-image-generic (test entry)

Package: libfoo
Status: hold ok installed
Architecture: i386
Multi-Arch: same
Version: 1.0
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Description: libfoo (test entry)

Package: libfoo
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Version: 1.0
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Description: libfoo (test entry)

Package: nvidia-utils-535
Status: hold ok half-configured
Architecture: amd64
Version: 535.183.01-0ubuntu0.22.04.1
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Description: nvidia-utils-535 (test entry)

Package: gone
Status: hold ok not-installed
Architecture: amd64

Package: removed
Status: hold ok config-files
Architecture: amd64
Version: 2.0
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Description: removed (test entry)

Package: bar
Status: deinstall ok installed
Architecture: amd64
Version: 1.0
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Description: bar (test entry)
"""


def apt_mark_showhold(root: Path) -> list[str]:
    """`apt-mark showhold` on the status file under ``root`` (no sources, no caches written), as the role reads it:
    each line without its ``:ARCH``."""
    if shutil.which("apt-mark") is None:
        pytest.skip("apt-mark is not installed here")
    empty = root / "empty"
    empty.mkdir()
    opts = {
        "Dir::State::status": root / "var/lib/dpkg/status",
        "Dir::State::Lists": empty,
        "Dir::State::extended_states": empty / "extended_states",
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": empty,
        "Dir::Cache::pkgcache": "",
        "Dir::Cache::srcpkgcache": "",
        "APT::Architecture": "amd64",
        "APT::Architectures::": "amd64",
    }
    argv = ["apt-mark"]
    for key, value in opts.items():
        argv += ["-o", f"{key}={value}"]
    argv += ["-o", "APT::Architectures::=i386", "showhold"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [line.split(":", 1)[0] for line in proc.stdout.splitlines()]


def dpkg_query(root: Path) -> str:
    """The module's own query (its format, every package) run by the real dpkg-query on the status file under root."""
    if shutil.which("dpkg-query") is None:
        pytest.skip("dpkg-query is not installed here")
    proc = subprocess.run(
        ["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "--show", "--showformat", dpkg_hold.QUERY_FORMAT, "*"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "var/lib/dpkg/updates").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(DPKG_STATUS)
    (tmp_path / "var/lib/dpkg/available").write_text("")
    return tmp_path


def test_the_holds_it_reads_are_what_apt_mark_showhold_lists(root: Path) -> None:
    installed, held = dpkg_hold.read_db(dpkg_query(root))
    shown = apt_mark_showhold(root)
    assert shown == ["gone", "libfoo", "nvidia-utils-535", "removed", "walinuxagent"]  # apt-mark really read it
    assert sorted(held) == shown
    # Installed: unpacked files on the host, whatever the selection; purged and config-files-only are not.
    assert installed == {"walinuxagent", "linux-image-generic", "libfoo", "nvidia-utils-535", "bar"}


def test_it_holds_the_installed_named_and_matching_packages_not_held_yet(root: Path) -> None:
    installed, held = dpkg_hold.read_db(dpkg_query(root))
    names = ["linux-image-generic", "linux-modules-extra-6.5.0-44-generic", "gone", "walinuxagent"]
    patterns = [re.compile(p) for p in ("^nvidia-utils-[0-9]", "^lib")]

    chosen, newly, skipped = dpkg_hold.choose(installed, held, names, patterns)

    assert chosen == ["libfoo", "linux-image-generic", "nvidia-utils-535", "walinuxagent"]
    assert newly == ["linux-image-generic"]  # the others are held already
    # Not installed: dpkg cannot hold them (a purged package that is still selected "hold" included).
    assert skipped == ["gone", "linux-modules-extra-6.5.0-44-generic"]


def test_nothing_to_hold_and_odd_names_are_reported_not_run() -> None:
    installed, held = dpkg_hold.read_db("walinuxagent\thold\tinstalled\nbad line\n\tinstall\tinstalled\n")
    assert (installed, held) == ({"walinuxagent"}, {"walinuxagent"})
    # A name from the inventory is never passed to dpkg unless dpkg itself listed it as installed.
    chosen, newly, skipped = dpkg_hold.choose(installed, held, ["x; rm -rf /", "walinuxagent"], [])
    assert (chosen, newly, skipped) == (["walinuxagent"], [], ["x; rm -rf /"])
