"""The one-round-trip bundle: runs under an isolated interpreter without site-packages, brings pynvml only when
the host lacks it, leaves nothing behind."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remediation.hostside import PROBE_PATH, bundle, bundle_program, probe_source, pynvml_packed, pynvml_source

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
    assert list(tmpdir.iterdir()) == []  # the embedded pynvml was served from memory: nothing was written


def test_bundle_writes_nothing_on_the_host(tmp_path: Path) -> None:
    """The audit is read-only on the host: the embedded pynvml is not written anywhere. TMPDIR, HOME and the
    working directory all point at one watched directory, which must stay untouched (not even an entry made and
    removed, which would move its mtime)."""
    watched = tmp_path / "watched"
    watched.mkdir()
    before = os.stat(watched).st_mtime_ns
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", "-", "--root", "/nonexistent"],
        input=bundle(),
        capture_output=True,
        timeout=60,
        cwd=watched,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(watched), "TEMP": str(watched), "TMP": str(watched),
             "HOME": str(watched)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["nvml"]["error_class"] != "other"
    assert list(watched.iterdir()) == [] and os.stat(watched).st_mtime_ns == before


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


@pytest.mark.parametrize("version", ["3.8", "3.9", "3.10", "3.12"])
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


#: Modules the probe's own run must not import: each costs every host of every audit 1-15 ms of CPU, and none is
#: needed to print the facts (importlib.abc pulls importlib.resources, pathlib, tempfile and typing in with it).
HEAVY_ON_THE_HOST = {"importlib.abc", "importlib.resources", "typing", "traceback", "socket", "base64", "gpuprobe.prom"}


def test_the_probe_start_imports_nothing_it_does_not_need() -> None:
    # pynvml is left out (include_pynvml=False): what it imports is the host's pynvml's business, not the probe's.
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", "-X", "importtime", "-", "--skip-nvml", "--root", "/nonexistent"],
        input=bundle(include_pynvml=False),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["schema"] == "gpufleet.facts/1"
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line}
    assert {"gpuprobe.collect", "gpuprobe.packages", "subprocess"} <= imported  # the measure itself works
    assert imported.isdisjoint(HEAVY_ON_THE_HOST), sorted(imported & HEAVY_ON_THE_HOST)


def test_the_timer_mode_still_imports_what_it_needs(tmp_path: Path) -> None:
    # --prom-out renders through gpuprobe.prom and writes through tempfile, both imported only on that path.
    prom = tmp_path / "out" / "gpu.prom"
    facts = tmp_path / "out" / "facts.json"
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", "-", "--skip-nvml", "--root", "/nonexistent", "--prom-out", str(prom),
         "--json-out", str(facts), "--host-label", "gpu-9"],
        input=bundle(include_pynvml=False),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b""
    assert 'host="gpu-9"' in prom.read_text()
    assert json.loads(facts.read_text())["schema"] == "gpufleet.facts/1"
    assert oct(facts.stat().st_mode & 0o777) == "0o600"


def test_a_failing_section_still_carries_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    # traceback is imported only when a section fails: the entry in errors still names where it failed.
    # the module, not the package's re-exported function of the same name
    collect_module = importlib.import_module("remediation.hostside.gpuprobe.collect")

    def broken(*_args: object) -> None:
        raise RuntimeError("the system section broke")

    monkeypatch.setattr(collect_module, "collect_system", broken)
    doc = collect_module.collect({"skip_nvml": True, "root": "/nonexistent"})
    (entry,) = [e for e in doc["errors"] if e["section"] == "system"]
    assert entry["error"] == "RuntimeError: the system section broke"
    assert "in broken" in entry["trace"] and "Traceback" in entry["trace"]
    assert doc["system"] is None and doc["packages"] is not None  # the other sections went on


_SERVE = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); from gpuprobe.nvml import serve_pynvml;"
    " served = serve_pynvml(sys.stdin.read()); import pynvml;"
    " print(json.dumps([served, pynvml.__file__, hasattr(pynvml, 'nvmlInit')]))"
)


@pytest.mark.parametrize("isolated", [True, False])
def test_the_modules_copy_of_pynvml_is_used_only_where_the_host_has_none(isolated: bool, tmp_path: Path) -> None:
    """What the gpu_facts module does with the controller's pynvml its action plugin sends (pynvml_packed)."""
    packed = pynvml_packed()
    assert packed is not None
    python = [SYSTEM_PYTHON, "-I", "-S"] if isolated else [sys.executable]
    proc = subprocess.run([*python, "-c", _SERVE, str(PROBE_PATH.parent)], input=packed, capture_output=True,
                          text=True, timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    served, origin, complete = json.loads(proc.stdout)
    assert complete
    if isolated:  # no pynvml of its own: the sent copy, from memory
        assert (served, origin) == (True, "<pynvml from the controller>")
        assert list(tmp_path.iterdir()) == []
    else:  # its own wins
        assert served is False and origin == importlib.util.find_spec("pynvml").origin  # type: ignore[union-attr]
