"""What runs on GPU hosts (every module of remediation/hostside/ but its ``__init__``) runs with what the hosts have:
Ubuntu 20.04's python3.8, its standard library and pynvml. Ruff lints the package with 3.8 as the target
(pyproject.toml, per-file-target-version); these tests hold each program to the same without ruff."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

HOSTSIDE = Path(__file__).resolve().parents[2] / "remediation" / "hostside"
PROGRAMS = sorted(p for p in HOSTSIDE.glob("*.py") if p.name != "__init__.py")
# In this interpreter's standard library but not in 3.8's.
NEWER_THAN_38 = {"graphlib", "zoneinfo", "tomllib"}
PYTHON38 = sorted(Path.home().glob(".pyenv/versions/3.8.*/bin/python3.8"))
# Optional imports a program may try (inside ``try``, used only when the host has them): the load gate's matmul burst
# runs on the host's own CUDA Python stack where there is one, and falls back to what the host has otherwise.
OPTIONAL = {"gpuload.py": {"torch", "cupy"}}


def _imported(tree: ast.AST) -> set[str]:
    """Top-level names of every module the program imports, at any depth (a lazy ``import pynvml`` included)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"relative import at line {node.lineno}: a host program is one file"
            names.add(node.module.split(".")[0])
    return names


def test_the_programs_are_there() -> None:
    assert {p.name for p in PROGRAMS} >= {"gpuprobe.py", "hostlease.py", "sampler.py"}


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_python38_syntax(program: Path) -> None:
    source = program.read_text(encoding="utf-8")
    ast.parse(source, filename=str(program), feature_version=(3, 8))
    # annotations are type comments: nothing that 3.8 would evaluate differently
    assert not any(line.startswith("from __future__") for line in source.splitlines())


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_imports_only_the_standard_library_and_pynvml(program: Path) -> None:
    imported = _imported(ast.parse(program.read_text(encoding="utf-8")))
    assert imported - sys.stdlib_module_names - {"pynvml"} - OPTIONAL.get(program.name, set()) == set()
    assert imported & NEWER_THAN_38 == set()


@pytest.mark.skipif(not PYTHON38, reason="no python3.8 under ~/.pyenv/versions (the syntax checks above still run)")
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_loads_under_python38_alone(program: Path) -> None:
    """Module level run by a real 3.8 without site-packages (its annotations, its imports); ``main`` not called."""
    check = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='hostside_check')"
    proc = subprocess.run([str(PYTHON38[-1]), "-I", "-S", "-c", check, str(program)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
