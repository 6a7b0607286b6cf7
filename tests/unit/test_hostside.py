"""What runs on GPU hosts (every module of remediation/hostside/ but its ``__init__``, and every module of the probe's
package remediation/hostside/gpuprobe/) runs with what the hosts have: Ubuntu 20.04's python3.8, its standard library
and pynvml. Ruff lints the package with 3.8 as the target (pyproject.toml, per-file-target-version); these tests hold
each program to the same without ruff."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

HOSTSIDE = Path(__file__).resolve().parents[2] / "remediation" / "hostside"
# Host programs of one file each.
PROGRAMS = sorted(p for p in HOSTSIDE.glob("*.py") if p.name != "__init__.py")
# The probe: a package whose modules import each other (relatively) and nothing else of the project.
PROBE = HOSTSIDE / "gpuprobe"
PROBE_MODULES = sorted(PROBE.glob("*.py"))
HOST_FILES = PROGRAMS + PROBE_MODULES
# In this interpreter's standard library but not in 3.8's.
NEWER_THAN_38 = {"graphlib", "zoneinfo", "tomllib"}
PYTHON38 = sorted(Path.home().glob(".pyenv/versions/3.8.*/bin/python3.8"))
# Optional imports a program may try (inside ``try``, used only when the host has them): the load gate's matmul burst
# runs on the host's own CUDA Python stack where there is one, and falls back to what the host has otherwise.
OPTIONAL = {"gpuload.py": {"torch", "cupy"}}


def _label(path: Path) -> str:
    return str(path.relative_to(HOSTSIDE))


def _imported(tree: ast.AST, package: Path | None = None) -> set[str]:
    """Top-level names of every module the program imports, at any depth (a lazy ``import pynvml`` included).

    A relative import is allowed only in the probe's package (``package``), one level up at most and only of a
    module of that package; it is not counted."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert package is not None, f"relative import at line {node.lineno}: a host program is one file"
                assert node.level == 1 and node.module, f"line {node.lineno}: only `from .module import ...`"
                assert (package / f"{node.module.split('.')[0]}.py").is_file(), f"line {node.lineno}: {node.module}"
                continue
            assert node.module
            names.add(node.module.split(".")[0])
    return names


def test_the_programs_are_there() -> None:
    assert {p.name for p in PROGRAMS} >= {"hostlease.py", "sampler.py"}
    assert not (HOSTSIDE / "gpuprobe.py").exists()  # the probe is the package, one copy
    assert {p.name for p in PROBE_MODULES} >= {
        "__init__.py", "__main__.py", "common.py", "nvml.py", "collect.py", "prom.py", "cli.py"}


@pytest.mark.parametrize("program", HOST_FILES, ids=_label)
def test_python38_syntax(program: Path) -> None:
    source = program.read_text(encoding="utf-8")
    ast.parse(source, filename=str(program), feature_version=(3, 8))
    # annotations are type comments: nothing that 3.8 would evaluate differently
    assert not any(line.startswith("from __future__") for line in source.splitlines())


@pytest.mark.parametrize("program", HOST_FILES, ids=_label)
def test_imports_only_the_standard_library_and_pynvml(program: Path) -> None:
    package = PROBE if program.parent == PROBE else None
    imported = _imported(ast.parse(program.read_text(encoding="utf-8")), package)
    if program.name == "__main__.py" and package is not None:
        imported -= {"gpuprobe"}  # `python3 DIR/gpuprobe`: the package by its own name (see __main__.py)
    assert imported - sys.stdlib_module_names - {"pynvml"} - OPTIONAL.get(program.name, set()) == set()
    assert imported & NEWER_THAN_38 == set()


@pytest.mark.skipif(not PYTHON38, reason="no python3.8 under ~/.pyenv/versions (the syntax checks above still run)")
@pytest.mark.parametrize("program", PROGRAMS, ids=_label)
def test_loads_under_python38_alone(program: Path) -> None:
    """Module level run by a real 3.8 without site-packages (its annotations, its imports); ``main`` not called."""
    check = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='hostside_check')"
    proc = subprocess.run([str(PYTHON38[-1]), "-I", "-S", "-c", check, str(program)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not PYTHON38, reason="no python3.8 under ~/.pyenv/versions (the syntax checks above still run)")
@pytest.mark.parametrize("module", [p for p in PROBE_MODULES if p.name != "__main__.py"], ids=_label)
def test_probe_module_loads_under_python38_alone(module: Path) -> None:
    """Each module of the probe's package imported by a real 3.8 without site-packages, as ``gpuprobe.<module>`` with
    only the package's parent directory on sys.path (how the timer's host sees it)."""
    name = "gpuprobe" if module.stem == "__init__" else f"gpuprobe.{module.stem}"
    check = (
        "import importlib, sys; sys.path[:0] = [sys.argv[1]]; m = importlib.import_module(sys.argv[2]);"
        "assert m.__file__ == sys.argv[3], m.__file__"
    )
    proc = subprocess.run([str(PYTHON38[-1]), "-I", "-S", "-c", check, str(HOSTSIDE), name, str(module)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not PYTHON38, reason="no python3.8 under ~/.pyenv/versions (the syntax checks above still run)")
@pytest.mark.parametrize("how", ["directory", "-m"])
def test_probe_runs_under_python38_as_the_timer_runs_it(how: str, tmp_path: Path) -> None:
    """``python3.8 DIR/gpuprobe`` (the timer role's command line) and ``python3.8 -m gpuprobe`` with DIR on the path:
    one facts document on stdout."""
    # -m: the working directory is sys.path[0] (-I would leave it out; -E -s -S keep the rest as isolated)
    argv = [str(PYTHON38[-1]), "-I", "-S", str(PROBE)] if how == "directory" else [
        str(PYTHON38[-1]), "-E", "-s", "-S", "-m", "gpuprobe"]
    argv += ["--skip-nvml", "--root", str(tmp_path), "--kernel-release", "6.5.0-45-generic"]
    proc = subprocess.run(argv, cwd=HOSTSIDE, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert '"schema": "gpufleet.facts/1"' in proc.stdout
