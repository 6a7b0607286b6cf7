"""The one-round-trip bundle: runs under an isolated interpreter without site-packages, brings pynvml only when
the host lacks it, leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from remediation.hostside import PROBE_PATH, bundle, bundle_program, probe_source, pynvml_source

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


def _run_bundle(program: bytes, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", "-", *args],
        input=program,
        capture_output=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def test_bundle_runs_isolated_and_uses_the_embedded_pynvml(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    check = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", "import pynvml"], capture_output=True, check=False)
    assert check.returncode != 0, "the isolated interpreter must not see a pynvml of its own"
    doc = _run_bundle(bundle(), "--root", "/nonexistent", env={"TMPDIR": str(tmpdir)})
    assert doc["schema"] == "gpufleet.facts/1"
    # pynvml was importable (from the bundle): NVML answered with an NVML error, not an import error
    assert doc["nvml"]["error_class"] in ("library_not_found", "none", "driver_not_loaded", "version_mismatch")
    assert list(tmpdir.iterdir()) == []  # the temporary pynvml is gone


def test_bundle_without_pynvml_reports_it_as_data() -> None:
    doc = _run_bundle(bundle(include_pynvml=False), "--root", "/nonexistent")
    assert doc["nvml"]["ok"] is False
    assert doc["nvml"]["error_class"] == "other"
    assert "pynvml" in doc["nvml"]["error"]


def test_bundle_passes_arguments_and_embeds_both_files() -> None:
    program = bundle()
    assert pynvml_source() is not None
    assert len(program) < 200_000
    doc = _run_bundle(program, "--skip-nvml", "--kernel-release", "9.9.9-1-test", "--root", "/nonexistent")
    assert doc["system"]["kernel"] == "9.9.9-1-test"
    sources = probe_source()
    assert "def collect(" in sources["gpuprobe.collect"]
    modules = {f"gpuprobe.{p.stem}" for p in PROBE_PATH.glob("*.py") if p.stem != "__init__"}
    assert set(sources) == {"gpuprobe"} | modules


def _interpreter(version: str) -> str | None:
    """A runnable ``python<version>``: on PATH (not a pyenv shim that refuses) or under ~/.pyenv/versions."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for exe in candidates:
        if exe and subprocess.run([exe, "-c", "pass"], capture_output=True, check=False).returncode == 0:
            return exe
    return None


@pytest.mark.parametrize("version", ["3.8", "3.9", "3.10"])
def test_bundle_on_older_pythons_when_available(version: str) -> None:
    exe = _interpreter(version)
    if exe is None:
        pytest.skip(f"python{version} not installed here (test_hostside checks 3.8 syntax)")
    proc = subprocess.run(
        [exe, "-I", "-S", "-", "--root", "/nonexistent"], input=bundle(), capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["schema"] == "gpufleet.facts/1"


def test_bundle_serves_a_package_from_memory_before_the_hosts_own(tmp_path: Path) -> None:
    """A package's modules travel in the bundle and import each other relatively; a module of the same name on the
    host's path (here a decoy in the working directory, on sys.path without -I) never stands in for them."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "__init__.py").write_text("raise SystemExit('the host copy was imported')\n")
    sources = {
        "toy": "from .cli import main\n",
        "toy.cli": "from .common import WORD\n\n\ndef main(argv):\n    print(WORD, argv, __name__)\n    return 0\n",
        "toy.common": "WORD = 'bundled'\n",
    }
    proc = subprocess.run([SYSTEM_PYTHON, "-S", "-", "a", "b"], input=bundle_program(sources, "toy", False),
                          cwd=tmp_path, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == "bundled ['a', 'b'] toy.cli\n"
    with pytest.raises(ValueError, match="must be 'toy'"):
        bundle_program({"toy.cli": "", "other": ""}, "toy", False)
