"""``ansible-test sanity`` on the collection as installed from the tarball: every sanity test that runs without a
container, on this Python.

ansible-test needs the collection at ``.../ansible_collections/gpufleet/remediation`` (the install is), and
makes a virtualenv per test, bootstrapping pip in it with a ``get-pip.py`` it downloads from a host outside
the package index that CI reaches. The bootstrap script is only that: pip, installed into the new virtualenv.
When ansible-test cannot download it, it names the path it reads it from; this test puts there a stand-in
that does the same from the index pip already uses (``ensurepip``, then ``pip install`` of the pinned pip).
ansible-test also runs pip with a cleaned environment, so this environment's pip settings go into the
``pip.conf`` of the HOME it runs with. The virtualenvs are kept under ``.lab/ansible-test`` between runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.collection.conftest import BIN, Built, clean_env, install_collection, run
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

HOME = ROOT / ".lab" / "ansible-test"
BOOTSTRAP_MISSING = re.compile(r"The bootstrap script can be manually downloaded and saved to: (\S+\.py)")
GET_PIP_STAND_IN = '''\
"""Stand-in for get-pip.py (written by tests/collection/test_sanity.py): pip into this virtualenv."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
subprocess.check_call([sys.executable, "-m", "pip", "install", *args])
'''


def pip_conf() -> str:
    """This environment's effective pip settings (config files and PIP_* variables) as one pip.conf."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        match = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line)
        if match:
            settings[match[1]] = match[2]
    return "[global]\n" + "".join(f"{key} = {value}\n" for key, value in sorted(settings.items()))


def test_ansible_test_sanity_passes_on_the_installed_collection(built: Built, tmp_path: Path) -> None:
    installed = install_collection(built.tarball, tmp_path / "collections", tmp_path,
                                   clean_env(tmp_path / "home", BIN), BIN / "ansible-galaxy")
    # The ignore file lives in the checkout's tests/, which the build leaves out.
    (installed / "tests" / "sanity").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "sanity" / "ignore-2.19.txt", installed / "tests" / "sanity")
    (HOME / ".config" / "pip").mkdir(parents=True, exist_ok=True)
    (HOME / ".config" / "pip" / "pip.conf").write_text(pip_conf())
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    argv = [str(BIN / "ansible-test"), "sanity", "--python", python, "--color", "no"]
    env = clean_env(HOME, BIN)
    proc = run(argv, installed, env, timeout=900)
    missing = BOOTSTRAP_MISSING.search(proc.stdout + proc.stderr)
    if proc.returncode != 0 and missing:
        Path(missing[1]).parent.mkdir(parents=True, exist_ok=True)
        Path(missing[1]).write_text(GET_PIP_STAND_IN)
        proc = run(argv, installed, env, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    ran = set(re.findall(r'Running sanity test "([a-z0-9-]+)"', output))
    # The tests that read the collection's code and metadata ran (pslint and shellcheck have nothing to check).
    assert {"validate-modules", "pylint", "import", "compile", "ansible-doc", "runtime-metadata", "symlinks",
            "shebang", "yamllint", "pep8", "ignores"} <= ran, sorted(ran)
    assert "ERROR" not in proc.stdout
