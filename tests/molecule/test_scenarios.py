"""Every Molecule scenario, for real, on lab hosts: check before converge, idempotence, verify.

One test per ``molecule/<scenario>/molecule.yml``; Molecule gets its hosts from ``lab.molecule``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_lab

pytestmark = pytest.mark.lab

SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario: str) -> None:
    require_lab()
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.run(
        [str(Path(venv_bin) / "molecule"), "test", "-s", scenario],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    # The sequence really ran, in order: check before converge, then idempotence and verify, each successful.
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    done = re.findall(rf"^INFO\s+{re.escape(scenario)} ➜ (\w+): Executed: Successful", out, re.M)
    steps = [s for s in done if s in ("check", "converge", "idempotence", "verify")]
    assert steps == ["check", "converge", "idempotence", "verify"], done
