"""The library stands alone: nothing under ``remediation/`` imports the lab, the tasks, the demo or the tests (not
even for type checking), and the lab's exception lives in the lab."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

OUTSIDE = ("lab", "commands", "demo", "tests", "tasks", "bench")


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    names: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
    return names


def test_the_library_imports_nothing_outside_it() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted((ROOT / "remediation").rglob("*.py"))
        for line, name in _imported(ast.parse(path.read_text(), str(path)))
        if name.split(".")[0] in OUTSIDE
    ]
    assert offenders == [], "remediation/ must not import these (move the code to where it belongs):\n" + "\n".join(
        offenders
    )


def test_lab_error_is_the_labs() -> None:
    import remediation.core.errors
    from lab.errors import LabError
    from remediation.core.errors import RemediationError
    from remediation.core.exitcodes import ExitCode

    assert not hasattr(remediation.core.errors, "LabError")
    assert LabError.__module__ == "lab.errors"
    assert issubclass(LabError, RemediationError) and LabError.exit_code == ExitCode.BAD_INPUT


#: What each lower layer of ``remediation/`` may import from the library (besides itself). The layers above
#: (host, rollout and its adapters, azure, k8s, aoai, train, report) build on these; nothing below reaches up.
LOWER_LAYERS = {
    "core": {"hostside"},
    "transport": {"core", "hostside"},
}


def test_lower_layers_do_not_reach_up() -> None:
    offenders = []
    for layer, allowed in LOWER_LAYERS.items():
        for path in sorted((ROOT / "remediation" / layer).rglob("*.py")):
            for line, name in _imported(ast.parse(path.read_text(), str(path))):
                parts = name.split(".")
                if parts[0] == "remediation" and len(parts) > 1 and parts[1] not in allowed | {layer}:
                    offenders.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert offenders == [], "a lower layer imports a higher one (move the code down, or the import up):\n" + "\n".join(
        offenders
    )


#: The areas; the tasks reach each through its one entry module, ``remediation.<area>.api``.
AREAS = ("host", "restore", "kernelupdate", "azure", "k8s", "aoai", "train", "remediate")


def test_the_tasks_call_each_area_through_its_entry_module() -> None:
    offenders = []
    for path in [*sorted((ROOT / "commands").glob("*.py")), ROOT / "tasks.py"]:
        for line, name in _imported(ast.parse(path.read_text(), str(path))):
            parts = name.split(".")
            if parts[0] == "remediation" and len(parts) > 1 and parts[1] in AREAS and parts[2:] != ["api"]:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert offenders == [], "import these from the area's api module (add the name there):\n" + "\n".join(offenders)


def test_every_name_an_entry_module_exports_resolves() -> None:
    import importlib

    for area in AREAS:
        api = importlib.import_module(f"remediation.{area}.api")
        for name in api.__all__:
            assert getattr(api, name) is not None, (area, name)  # a name exported from the wrong module raises
        with pytest.raises(AttributeError):
            api.no_such_name  # noqa: B018
