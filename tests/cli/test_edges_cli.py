"""The program's edges through the real CLI: bad config, bad stdin, bad numbers, empty groups, closed pipes.

Each case runs ``python -m invoke`` (or ``python -m commands.cli``, the ``gpufleet`` console script) in a
subprocess and asserts the exit code and that stderr is one line, never a traceback. No case reaches a host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]
GPUFLEET = [sys.executable, "-m", "commands.cli"]
SMI = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
    "driver is installed and running.\n"
)


def cli(
    argv: list[str], stdin: bytes | None = b"", cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        argv, cwd=cwd, input=stdin, capture_output=True, timeout=120, check=False, env={**os.environ, **(env or {})}
    )
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode())


def one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --- stdin and files ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["stdin", "file"])
def test_binary_input_under_a_strict_locale_is_decoded_with_replacement(where: str, tmp_path: Path) -> None:
    data = b"\xff\xfe\x00garbage " + SMI.encode() + b"\x80\x81\n"
    strict = {"PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    if where == "stdin":
        r = cli([*INVOKE, "diagnose", "-", "--format", "json"], stdin=data, env=strict)
    else:
        path = tmp_path / "field.txt"
        path.write_bytes(data)
        r = cli([*INVOKE, "diagnose", str(path), "--format", "json"], env=strict)
    assert r.returncode == 1, r.stderr  # a finding, not a crash
    assert r.stderr == ""
    assert [f["id"] for f in json.loads(r.stdout)["findings"]] == ["GPU-DRV-001"]


def test_piped_text_without_a_file_is_read_by_gpufleet() -> None:
    r = cli([*GPUFLEET, "diagnose", "--format", "json"], stdin=SMI.encode())
    assert r.returncode == 1 and r.stderr == "", r.stderr
    assert json.loads(r.stdout)["kind"] == "nvml"


def test_a_closed_pipe_ends_quietly() -> None:
    """``invoke diagnose - --format json | head -1``: the reader goes away after one line (the writer may or may not
    have written everything into the pipe's buffer by then: no traceback either way)."""
    reader = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert reader.stdin is not None and reader.stdout is not None
    writer = subprocess.Popen(
        [*INVOKE, "diagnose", "-", "--format", "json"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
    )
    reader.stdin.close()
    _out, err = writer.communicate(input=(SMI * 3000).encode(), timeout=120)
    first = reader.stdout.read()
    reader.wait(timeout=30)
    assert first == b"{\n"
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert writer.returncode in (1, 141)  # its finding, or 128 + SIGPIPE when the pipe closed first


def test_a_pipe_closed_before_the_first_write_is_exit_141() -> None:
    """The deterministic form: the reader has already gone when the task writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run(
            [*INVOKE, "diagnose", "-", "--format", "json"],
            cwd=ROOT,
            input=SMI.encode(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert b"Traceback" not in r.stderr and r.stderr == b"", r.stderr.decode()
    assert r.returncode == 141  # 128 + SIGPIPE, as a shell reports it


def test_a_closed_pipe_on_the_task_list_ends_quietly() -> None:
    r = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m commands.cli --list | head -n 1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in r.stderr and r.stdout.startswith("Available tasks")
    assert r.returncode in (0, 141)


# --- config files ---------------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's entry (tasks.py, commands/) whose invoke.yaml each test writes."""
    shutil.copy(ROOT / "tasks.py", tmp_path / "tasks.py")
    shutil.copytree(ROOT / "commands", tmp_path / "commands", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize("program", ["invoke", "gpufleet"])
@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("audit:\n  timeout: [1\n", ("not valid YAML", "line 3")),
        ("fleets: 5\n", ("setting fleets must be a mapping",)),
        ("audit: 5\n", ("setting audit must be a mapping",)),
        ("audit:\n", ("setting audit must be a mapping",)),
        ("- audit\n", ("must be a mapping of sections",)),
        ("audit:\n  timeout: -5\n", ("audit.timeout", "above 0")),
        ("audit:\n  concurrency: lots\n", ("audit.concurrency", "number")),
        ("fleets:\n  gpu: [a]\n", ("fleets.gpu must be a mapping",)),
    ],
)
def test_a_broken_project_config_is_one_line_and_exit_2(
    program: str, text: str, needles: tuple[str, ...], project: Path
) -> None:
    (project / "invoke.yaml").write_text(text)
    argv = INVOKE if program == "invoke" else GPUFLEET
    r = cli([*argv, "audit", "--inventory", str(project / "none.yml")], cwd=project)
    assert r.returncode == 2
    one_error_line(r, *needles, str(project / "invoke.yaml"))


@pytest.mark.parametrize("program", ["invoke", "gpufleet"])
def test_the_project_config_is_read_from_a_subdirectory_and_relative_paths_are_under_the_project(
    program: str, project: Path
) -> None:
    (project / "invoke.yaml").write_text("k8s:\n  templates_dir: mine\n")
    (project / "sub").mkdir()
    r = cli([*(INVOKE if program == "invoke" else GPUFLEET), "k8s.render", "training-job"], cwd=project / "sub")
    assert r.returncode == 2
    one_error_line(r, f"no template 'training-job' in {project / 'mine'}")


def test_outside_any_project_gpufleet_uses_the_packages_templates(tmp_path: Path) -> None:
    r = cli([*GPUFLEET, "k8s.render", "nope"], cwd=tmp_path)
    assert r.returncode == 2
    templates = ROOT / "remediation" / "templates" / "k8s"
    one_error_line(r, f"no template 'nope' in {templates} (templates: audit-cronjob, inference, training-job)")


def test_gpufleet_lists_what_invoke_lists() -> None:
    ours, theirs = cli([*GPUFLEET, "--list"]), cli([*INVOKE, "--list"])
    assert ours.returncode == theirs.returncode == 0, ours.stderr + theirs.stderr
    assert ours.stdout == theirs.stdout


@pytest.mark.parametrize(("text", "needle"), [("fleets: 5\n", "fleets"), ("audit: 5\n", "audit")])
def test_a_wrong_shape_in_a_runtime_config_file(text: str, needle: str, tmp_path: Path) -> None:
    runtime = tmp_path / "site.yaml"
    runtime.write_text(text)
    r = cli([*GPUFLEET, "-f", str(runtime), "audit"])
    assert r.returncode == 2
    one_error_line(r, f"setting {needle} must be a mapping", str(runtime))


def test_a_broken_user_config_is_one_line_under_gpufleet(tmp_path: Path) -> None:
    (tmp_path / ".invoke.yaml").write_text("audit: [\n")
    r = cli([*GPUFLEET, "--list"], env={"HOME": str(tmp_path)})
    assert r.returncode == 2
    one_error_line(r, "not valid YAML", str(tmp_path / ".invoke.yaml"))


@pytest.mark.parametrize("argv", [["audit", "--bogus"], ["audit", "--timeout"], ["no-such-task"]])
def test_invokes_parse_errors_are_exit_2_under_gpufleet(argv: list[str]) -> None:
    r = cli([*GPUFLEET, *argv])
    assert r.returncode == 2
    one_error_line(r)


# --- numbers and hosts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["audit", "--timeout", "0"],
        ["audit", "--timeout", "-5"],
        ["audit", "--timeout", "nan"],
        ["audit", "--timeout", "soon"],
        ["audit", "--concurrency", "0"],
        ["audit", "--concurrency", "2.5"],
        ["driver-restore", "--check", "--batch", "0"],
        ["driver-restore", "--check", "--reboot-timeout", "-5"],
        ["kernel-update", "--check", "--batch", "0"],
        ["kernel-update", "--check", "--reboot-timeout", "0"],
    ],
)
def test_numbers_at_or_below_zero_are_refused_before_any_host(flags: list[str], tmp_path: Path) -> None:
    r = cli([*INVOKE, *flags, "--inventory", str(tmp_path / "no-inventory.yml")])
    assert r.returncode == 2 and r.stdout == ""
    line = one_error_line(r, flags[-2])
    assert "inventory" not in line  # refused before the inventory is even read


EMPTY = (
    "all:\n  children:\n    gpu:\n      hosts: {}\n"
    "    other:\n      hosts:\n        x1:\n          ansible_host: 127.14.250.250\n"
)


@pytest.mark.parametrize(
    "task", [["audit"], ["harden", "--check"], ["driver-restore", "--check"], ["kernel-update", "--check"]]
)
def test_an_empty_group_is_exit_2_not_every_host_probed(task: list[str], tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(EMPTY)
    r = cli([*INVOKE, *task, "--inventory", str(inventory)])
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r, f"no hosts in group gpu of inventory {inventory}")
