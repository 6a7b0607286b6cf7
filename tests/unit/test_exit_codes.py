"""One exit-code enum: its numbers never change, the README's table is rendered from it, and no task or library
module ends with a bare number any more."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from remediation.core.exitcodes import ExitCode, markdown_table
from tests.conftest import ROOT

BEGIN, END = "<!-- exit-codes:begin -->\n", "<!-- exit-codes:end -->"

#: The numbers are the interface (cron, CI, AWX read them): renumbering a member is a breaking change.
DOCUMENTED = {
    "OK": 0,
    "FINDINGS": 1,
    "BAD_INPUT": 2,
    "UNREACHABLE": 3,
    "LOCK_HELD": 4,
    "CONTACT_SUPPORT": 5,
    "INTERRUPTED": 130,
    "BROKEN_PIPE": 141,
}


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md needs one exit-codes:begin/end pair"
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def test_readme_table_is_the_rendered_enum() -> None:
    assert _readme_block() == markdown_table(), (
        "README.md's exit-code table drifted from remediation/core/exitcodes.py: paste the output of "
        "`python -m remediation.core.exitcodes` between the exit-codes markers"
    )


def test_module_prints_the_table() -> None:
    proc = subprocess.run([sys.executable, "-m", "remediation.core.exitcodes"], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert proc.stdout == markdown_table()


def test_numbers_are_unique_and_unchanged() -> None:
    assert {name: int(code) for name, code in ExitCode.__members__.items()} == DOCUMENTED
    numbers = [int(code) for code in ExitCode.__members__.values()]
    assert len(numbers) == len(set(numbers)), "two exit codes share a number"


@pytest.mark.parametrize("code", list(ExitCode), ids=lambda c: c.name)
def test_every_code_has_a_one_line_meaning(code: ExitCode) -> None:
    assert code.meaning.strip() and "\n" not in code.meaning
    assert "|" not in code.meaning, "a | would split the README's table row"
    assert f"| {int(code)} | `{code.name}` | {code.meaning} |" in markdown_table()


def test_error_families_keep_their_codes() -> None:
    from remediation.azure.errors import ArmError, AzureInputError, ContactSupportError, QuotaRequestFailed
    from remediation.core.errors import RemediationError, UsageError
    from remediation.k8s.errors import K8sApiError
    from remediation.rollout.errors import LockHeldError

    assert RemediationError.exit_code == UsageError.exit_code == AzureInputError.exit_code == 2
    assert (QuotaRequestFailed.exit_code, ArmError.exit_code, K8sApiError.exit_code) == (1, 3, 3)
    assert (LockHeldError.exit_code, ContactSupportError.exit_code) == (4, 5)


# --- no bare numbers --------------------------------------------------------------------------------------------

#: Calls whose argument is an exit status: invoke's ``Exit(message, code)``, ``sys.exit(code)``, ``SystemExit(code)``.
_EXIT_CALLS = {"Exit": ("code", 1), "exit": ("code", 0), "SystemExit": ("code", 0)}


def _sources() -> Iterator[Path]:
    for top in ("commands", "remediation"):
        yield from sorted((ROOT / top).rglob("*.py"))


def _bare_ints(node: ast.AST | None) -> Iterator[ast.Constant]:
    """Integer literals that are the value itself (through ``a if c else b``), not an argument of a call."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        yield node
    elif isinstance(node, ast.IfExp):
        yield from _bare_ints(node.body)
        yield from _bare_ints(node.orelse)


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "sys":
        return func.attr  # sys.exit
    return None


def _exit_name(name: str) -> bool:
    """``exit_code``, ``EXIT_CLEAN``, ``BROKEN_PIPE_EXIT``, ``unreachable_exit``: a name that holds an exit status."""
    name = name.lower()
    return name == "exit_code" or name.startswith("exit_") or name.endswith("_exit")


def _offences(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in _EXIT_CALLS:
            name = _call_name(node)
            keyword, position = _EXIT_CALLS[name or ""]
            values = [k.value for k in node.keywords if k.arg == keyword]
            if len(node.args) > position:
                values.append(node.args[position])
            for value in values:
                for lit in _bare_ints(value):
                    yield lit.lineno, f"{name}(... {lit.value} ...)"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and _exit_name(target.id):
                    for lit in _bare_ints(node.value):
                        yield lit.lineno, f"{target.id} = {lit.value}"
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("exit_code"):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return):
                    for lit in _bare_ints(ret.value):
                        yield lit.lineno, f"{node.name}() returns {lit.value}"


def test_the_scan_sees_bare_numbers() -> None:
    source = (
        "raise Exit(code=3)\nraise Exit('bad', 2)\nsys.exit(141)\nraise SystemExit(1 if x else 0)\n"
        "class E:\n    exit_code = 4\n    unreachable_exit: int = 3\n"
        "BROKEN_PIPE_EXIT = 141\nEXIT_CLEAN = 0\nretries = 0\n"
        "def exit_code(self) -> int:\n    return 1\n"
        "raise Exit(code=ExitCode.OK)\nsys.exit(main())\n"
    )
    assert sorted(line for line, _ in _offences(ast.parse(source))) == [1, 2, 3, 4, 4, 6, 7, 8, 9, 12]


def test_no_bare_exit_numbers_in_commands_or_the_library() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _sources()
        for line, what in _offences(ast.parse(path.read_text(), str(path)))
    ]
    assert offenders == [], "use remediation.core.exitcodes.ExitCode instead of a bare number:\n" + "\n".join(offenders)
