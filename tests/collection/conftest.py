"""The collection gpufleet.remediation as users get it: the tarball ``ansible-galaxy collection build`` makes from
the checkout, and the project's wheel its plugins import. Built once per session, into a temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
NAMESPACE, NAME, VERSION = GALAXY["namespace"], GALAXY["name"], GALAXY["version"]
FQCN = f"{NAMESPACE}.{NAME}"


@dataclass(frozen=True)
class Built:
    tarball: Path
    wheel: Path

    def members(self) -> dict[str, tarfile.TarInfo]:
        with tarfile.open(self.tarball) as tar:
            return {m.name.rstrip("/"): m for m in tar.getmembers()}

    def read(self, name: str) -> bytes:
        with tarfile.open(self.tarball) as tar:
            handle = tar.extractfile(name)
            assert handle is not None, name
            return handle.read()


def clean_env(home: Path, path_first: Path, **extra: str) -> dict[str, str]:
    """An environment with nothing of this checkout or of this pytest run's Ansible settings: no ``ANSIBLE_*``, no
    ``PYTHON*``, no virtualenv; HOME in the test's own directory; ``path_first`` leads PATH."""
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ", "TERM", "GPULAB_NET", "TMPDIR")}
    # pip's own settings (index, certificates, find-links) stay: installs must work where this one does.
    keep |= {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    env = keep | {"HOME": str(home), "PATH": f"{path_first}{os.pathsep}/usr/local/bin:/usr/bin:/bin"}
    env |= {"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The tarball (``ansible-galaxy collection build`` of the checkout) and the project's wheel (``pip wheel``)."""
    out = tmp_path_factory.mktemp("collection-build")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "ANSIBLE_HOME": str(out / "home")}
    proc = run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out)], ROOT, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tarball = out / f"{NAMESPACE}-{NAME}-{VERSION}.tar.gz"
    assert tarball.is_file(), proc.stdout
    wheels = out / "wheels"
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(wheels)], ROOT, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = wheels.glob("gpu_fleet_remediation-*.whl")
    yield Built(tarball, wheel)


def install_collection(tarball: Path, dest: Path, cwd: Path, env: dict[str, str], galaxy: Path) -> Path:
    """``ansible-galaxy collection install TARBALL -p DEST``; returns the installed collection's directory."""
    proc = run([str(galaxy), "collection", "install", str(tarball), "-p", str(dest)], cwd, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{FQCN}:{VERSION} was installed successfully" in proc.stdout, proc.stdout
    return dest / "ansible_collections" / NAMESPACE / NAME
