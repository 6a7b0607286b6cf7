"""``invoke diagnose`` as on-call runs it: the real CLI in a subprocess, every form the README documents."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVOKE = ROOT / ".venv" / "bin" / "invoke"
SMI = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
    "driver is installed and running.\n"
)
UU_LOG = ROOT / "tests" / "fixtures" / "field" / "unattended-upgrades-kernel.log"


def run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INVOKE), "diagnose", *args],
        cwd=ROOT,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def smi_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("diag") / "nvidia-smi.txt"
    path.write_text(SMI)
    return path


def test_positional_file(smi_file: Path) -> None:
    r = run([str(smi_file)])
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith("kind: nvml") and "GPU-DRV-001" in r.stdout
    assert r.stderr == ""


def test_dash_reads_stdin() -> None:
    r = run(["-"], stdin=SMI)
    assert r.returncode == 1, r.stderr
    assert "GPU-DRV-001" in r.stdout


def test_format_json_is_one_document(smi_file: Path) -> None:
    r = run([str(smi_file), "--format", "json"])
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert set(doc) == {"kind", "facts", "findings"} and doc["kind"] == "nvml"
    assert [f["id"] for f in doc["findings"]] == ["GPU-DRV-001"]
    assert set(doc["findings"][0]) == {"id", "scenario", "severity", "summary", "evidence", "remedy"}


def test_unattended_upgrades_log_file() -> None:
    r = run([str(UU_LOG), "--format", "json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["kind"] == "unattended-upgrades-log"
    assert doc["facts"]["kernel_packages"] == ["linux-image-generic"]


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_file_is_exit_2_with_one_line(what: str, tmp_path: Path) -> None:
    path = tmp_path / "no-such-file.txt" if what == "missing" else tmp_path
    r = run([str(path)])
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0]


@pytest.mark.parametrize("where", ["file", "stdin"])
def test_empty_input_is_exit_2_with_one_line(where: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    r = run([str(empty)]) if where == "file" else run(["-"], stdin="")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "nothing to diagnose" in lines[0]
    assert (str(empty) if where == "file" else "<stdin>") in lines[0]


def test_unknown_text_is_exit_0() -> None:
    r = run(["-", "--format", "json"], stdin="hello, nothing about GPUs here\n")
    assert r.returncode == 0
    assert json.loads(r.stdout) == {"kind": "unknown", "facts": {}, "findings": []}


def test_every_diagnose_line_of_the_readme_runs(smi_file: Path) -> None:
    """The README's commands, as written (nvidia-smi replaced by the sample's text, FILE by a sample)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Diagnose field text") :]
    block = section[section.index("```sh") + len("```sh") : section.index("```", section.index("```sh") + 5)]
    commands = [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]
    commands = [c for c in commands if "invoke diagnose" in c]
    assert any(re.search(r"\| invoke diagnose -$", c) for c in commands)
    assert any("invoke diagnose FILE" in c for c in commands)
    env = {**os.environ, "PATH": f"{INVOKE.parent}:{os.environ['PATH']}"}
    for command in commands:
        command = command.replace("nvidia-smi 2>&1", f"cat {smi_file} 2>&1").replace("FILE", str(smi_file))
        command = command.replace("/var/log/unattended-upgrades/unattended-upgrades.log", str(UU_LOG))
        r = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert r.stderr == "", (command, r.stderr)


# --- brief by default, the runbook with --explain, critical first (issue 24) -------------------------------------

OOM = ROOT / "tests" / "fixtures" / "real-gpu-h200" / "torch-oom.txt"

# One kernel log (one kind): an application Xid (GPU-HW-005, warning) before RmInitAdapter failing (GPU-HW-007,
# critical), in dmesg's format; the rules list the warning first.
WARNING_THEN_CRITICAL = """\
[  100.000000] NVRM: Xid (PCI:0000:00:1e): 13, pid=1234, name=python, Graphics Exception: ESR 0x404490=0x80000001
[  120.000000] NVRM: GPU 0000:00:1e.0: RmInitAdapter failed! (0x26:0x56:1482)
[  120.000001] NVRM: GPU 0000:00:1e.0: rm_init_adapter failed, device minor number 0
"""


def _headers(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if re.match(r"\[(CRITICAL|WARNING|INFO)\] ", line)]


def test_brief_by_default_one_oom_is_a_few_lines_with_the_one_command() -> None:
    r = run([str(OOM)])
    assert r.returncode == 1 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) <= 12, r.stdout
    assert lines[0] == "kind: oom" and "[CRITICAL] TRAIN-OOM-001" in r.stdout
    runs = [line for line in lines if line.startswith("  run: ")]
    assert runs == ["  run: invoke train.plan --model <model> --gpu <gpu> --batch <batch> --seq-len <seq-len>"]
    assert "Resolution:" not in r.stdout and "runbook" not in r.stdout.split("--explain")[0]
    assert "{" not in r.stdout and "--explain" in lines[-1]
    assert all(len(line) <= 250 for line in lines)  # no evidence line of 500 characters


def test_explain_prints_the_runbook() -> None:
    r = run([str(OOM), "--explain"])
    assert r.returncode == 1 and r.stderr == ""
    for section in ("Symptoms:", "Diagnosis:", "Root cause:", "Resolution:", "Prevention:"):
        assert section in r.stdout
    assert "gradient_accumulation_steps" in r.stdout  # the resolution's text
    assert "remedy: invoke train.plan --model <model> --gpu <gpu>" in r.stdout
    assert len(r.stdout.splitlines()) > 20


def test_json_is_the_same_with_or_without_explain() -> None:
    plain, explained = run([str(OOM), "--format", "json"]), run([str(OOM), "--format", "json", "--explain"])
    assert json.loads(plain.stdout) == json.loads(explained.stdout)
    assert json.loads(plain.stdout)["findings"][0]["remedy"].startswith("invoke train.plan --model <model>")


@pytest.mark.parametrize("extra", [[], ["--explain"]])
def test_a_single_kind_paste_lists_the_critical_finding_first(extra: list[str]) -> None:
    r = run(["-", *extra], stdin=WARNING_THEN_CRITICAL)
    assert r.returncode == 1 and r.stdout.startswith("kind: kernel-log")
    assert _headers(r.stdout) == ["GPU-HW-007", "GPU-HW-005"]
    doc = json.loads(run(["-", "--format", "json"], stdin=WARNING_THEN_CRITICAL).stdout)
    got = [(f["id"], f["severity"]) for f in doc["findings"]]
    assert got == [("GPU-HW-007", "critical"), ("GPU-HW-005", "warning")]


def test_brief_commands_have_no_template_left() -> None:
    r = run(["-"], stdin=SMI)
    assert "  run: invoke driver-restore --limit <host>" in r.stdout
    assert "{host}" not in r.stdout
