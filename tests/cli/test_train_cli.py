"""``invoke train.*`` as on-call types it (issue 24, S2): the real program in a subprocess. Every bad number or size
is one line naming the flag and exit 2 (never Invoke's traceback, whose exit 1 reads "does not fit"); a ZeRO stage
with one GPU is refused; a GPU or model name read as another is named in the table and the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_edges_cli import one_error_line as edges_one_error_line

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]
OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; 77.42 GiB "
    "already allocated; 1.08 GiB free; 78.50 GiB reserved in total by PyTorch)\n"
)


def invoke(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INVOKE, *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    return edges_one_error_line(r, *needles)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--batch", "abc"), ("--seq-len", "2k"), ("--grad-accum", "1.5"), ("--gpus", "two"), ("--zero-stage", "x"),
     ("--lora-r", "sixteen"), ("--lora-dropout", "much")],
)
@pytest.mark.parametrize("task", ["train.plan", "train.diagnose-oom"])
def test_a_bad_number_is_one_line_naming_the_flag(task: str, flag: str, value: str) -> None:
    extra = ["-"] if task == "train.diagnose-oom" else []
    r = invoke(task, *extra, "--model", "Llama-2-7b", flag, value, stdin=OOM)
    one_error_line(r, f"{flag} '{value}'", "give a")


@pytest.mark.parametrize(("flag", "value"), [("--interval", "abc"), ("--count", "2.5"), ("--duration", "inf")])
def test_monitor_numbers_name_the_flag(flag: str, value: str) -> None:
    one_error_line(invoke("train.monitor", "--host", "gpu-1", flag, value), f"{flag} '{value}'")


def test_good_numbers_still_plan() -> None:
    r = invoke("train.plan", "--model", "GPT-2", "--gpu", "H100-80GB", "--batch", "4", "--seq-len", "512",
               "--grad-accum", "2", "--lora-r", "8", "--lora-dropout", "0.1", "--method", "lora", "--format", "json")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["job"]
    assert (job["batch"], job["seq_len"], job["gradient_accumulation_steps"], job["lora_r"]) == (4, 512, 2, 8)


def test_gpu_memory_without_a_unit_is_refused() -> None:
    line = one_error_line(invoke("train.plan", "--model", "Llama-2-7b", "--gpu-memory", "80"))
    assert line == "error: --gpu-memory 80: give a unit, e.g. 80GB (or 80GiB)"
    for size, expected in (("80GB", 80 * 10**9), ("80GiB", 80 * 1024**3), ("80G", 80 * 10**9)):
        r = invoke("train.plan", "--model", "GPT-2", "--gpu-memory", size, "--format", "json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["gpu"]["capacity_bytes"] == expected


def test_zero_stage_without_gpus_is_refused() -> None:
    one_error_line(invoke("train.plan", "--model", "Llama-2-13b", "--zero-stage", "3"), "--zero-stage 3",
                   "--gpus")
    r = invoke("train.plan", "--model", "Llama-2-13b", "--regime", "mixed", "--gpus", "8", "--zero-stage", "3",
               "--gpu", "A100-80GB", "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    assert json.loads(r.stdout)["job"]["zero_stage"] == 3


def test_substituted_names_are_noted_in_table_and_json() -> None:
    args = ["train.plan", "--model", "Llama-3.1-8B", "--gpu", "A100", "--method", "lora"]
    table = invoke(*args)
    assert table.returncode == 0, table.stderr
    flat = " ".join(table.stdout.split())
    assert "note: --model Llama-3.1-8B is planned as the built-in Llama-3-8B" in flat
    assert "note: --gpu A100 is planned as A100-80GB" in flat
    notes = json.loads(invoke(*args, "--format", "json").stdout)["notes"]
    assert any(n.startswith("--model Llama-3.1-8B is planned as") for n in notes)
    assert any(n.startswith("--gpu A100 is planned as A100-80GB") for n in notes)


def test_runbook_regime_oom_is_model_states_through_the_cli() -> None:
    r = invoke("train.diagnose-oom", "-", "--model", "Llama-2-7b", "--regime", "bf16-fp32-states", "--format",
               "json", stdin=OOM)
    assert r.returncode == 1, r.stderr
    assert [f["id"] for f in json.loads(r.stdout)["findings"]] == ["TRAIN-OOM-001", "TRAIN-OOM-005"]
