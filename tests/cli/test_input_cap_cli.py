"""Issue 20 item 2: every task that reads pasted text or a log refuses input over the cap: exit 2, one line naming
the input, its size, the cap and the fix, through the real Invoke CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.services import k8s_scenarios as scenarios
from remediation.core.parsers import MAX_INPUT_BYTES, MAX_INPUT_ENV

ROOT = Path(__file__).resolve().parents[2]
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
CAP = 4096  # a small cap for the tasks, so the test writes kilobytes, not megabytes


def invoke(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=ROOT,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def assert_refused(r: subprocess.CompletedProcess[str], name: str, cap: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {name}: ") and f"over the {cap} input cap" in lines[0]
    assert re.search(r"[0-9.]+ [KM]iB is over", lines[0]) and "tail -c" in lines[0] and MAX_INPUT_ENV in lines[0]
    assert r.stdout == ""


def test_diagnose_refuses_a_file_over_the_default_cap(tmp_path: Path) -> None:
    big = tmp_path / "huge.log"
    big.write_text(("NVRM: Xid (PCI:0000:00:1e): 79, GPU has fallen off the bus.\n" * 200_000)[: MAX_INPUT_BYTES + 10])
    assert_refused(invoke(["diagnose", str(big)]), str(big), "8.0 MiB")


@pytest.fixture
def oversized(tmp_path: Path) -> Path:
    path = tmp_path / "paste.txt"
    path.write_text((OOM + "\n") * (CAP // len(OOM) + 2))
    return path


def test_just_under_the_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.txt"
    path.write_text((OOM + "\n") * (CAP // (len(OOM) + 1) - 1))
    r = invoke(["train.diagnose-oom", str(path)], {MAX_INPUT_ENV: str(CAP)})
    assert r.returncode == 1, r.stderr  # 1: an OOM diagnosed


@pytest.mark.parametrize(
    "task",
    [["diagnose"], ["train.diagnose-oom"], ["aoai.diagnose"], ["k8s.diagnose-pending", "--events"]],
)
def test_each_paste_task_refuses_over_the_cap(task: list[str], oversized: Path) -> None:
    assert_refused(invoke([*task, str(oversized)], {MAX_INPUT_ENV: str(CAP)}), str(oversized), "4.0 KiB")


def test_diagnose_latency_refuses_a_log_over_the_cap(tmp_path: Path) -> None:
    directory = scenarios.write_snapshot(scenarios.latency_snapshot(), tmp_path / "snap")
    log = tmp_path / "server.log"
    log.write_text("INFO 12-04 08:00:00 Loading model weights\n" * 200)
    r = invoke(["k8s.diagnose-latency", str(directory), "--logs", str(log)], {MAX_INPUT_ENV: str(CAP)})
    assert_refused(r, str(log), "4.0 KiB")


def test_a_bad_cap_setting_is_named() -> None:
    r = invoke(["diagnose", "-"], {MAX_INPUT_ENV: "lots"})
    assert r.returncode == 2 and MAX_INPUT_ENV in r.stderr and len(r.stderr.strip().splitlines()) == 1
