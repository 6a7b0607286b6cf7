"""The load gate's host program against the lab's NVML stand-in (built here, loaded by the real pynvml in a child
process): the load hook reports utilisation while the program runs, a ``fail_under_load`` GPU is lost only then,
the hook's file is gone afterwards and an expired one is ignored; the controller's verdict of each document."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from remediation.remediate.loadgate import LoadMode, LoadResult, judge

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "remediation" / "hostside" / "gpuload.py"
VERSION = "535.183.01"

# gcc and pynvml are installed by ./run (the lab's Debian packages, the project's dependencies): no skip without them.
pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("lab_native_build", REPO / "lab" / "native" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return Path(build.build_native(tmp_path_factory.mktemp("native"), VERSION)["nvml"]).parent


def state(tmp: Path, gpus: str) -> Path:
    (tmp / "hw").mkdir(parents=True, exist_ok=True)
    (tmp / "module").write_text(VERSION + "\n")
    (tmp / "hw" / "gpus").write_text(gpus)
    return tmp


def env(lib_dir: Path, state_dir: Path) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": str(lib_dir), "GPULAB_STATE_DIR": str(state_dir),
            "PYTHONNOUSERSITE": "1"}


def load(lib_dir: Path, state_dir: Path, seconds: float = 1.0) -> dict[str, Any]:
    # -S: no site-packages but pynvml's directory, so torch/cupy of this interpreter cannot be picked up
    import pynvml

    code = ("import sys, runpy; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:];"
            " runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(Path(pynvml.__file__).parent), str(PROGRAM),
                           "--seconds", str(seconds), "--interval", "0.2"],
                          env=env(lib_dir, state_dir), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def utilisation(lib_dir: Path, state_dir: Path) -> list[Any]:
    code = ("import pynvml; pynvml.nvmlInit(); out = []\n"
            "for i in range(pynvml.nvmlDeviceGetCount()):\n"
            "    try: out.append(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i)).gpu)\n"
            "    except pynvml.NVMLError as e: out.append(str(e))\n"
            "print(out)")
    proc = subprocess.run([sys.executable, "-c", code], env=env(lib_dir, state_dir), capture_output=True, text=True,
                          timeout=30, check=True)
    return eval(proc.stdout)  # noqa: S307 - our own child's repr of a list of ints and strings


def test_the_lab_hook_loads_the_gpus_and_the_gate_passes(lib_dir: Path, tmp_path: Path) -> None:
    sd = state(tmp_path, "gpu_count=2\n")
    doc = load(lib_dir, sd)
    assert doc["tool"] == "lab" and doc["nvml_error"] is None
    assert all(s["util_gpu"] == 100 for g in doc["gpus"] for s in g["samples"]) and doc["gpus"][1]["samples"]
    assert not (sd / "load").exists()  # removed after the load
    assert utilisation(lib_dir, sd) == [0, 0]  # idle again
    verdict = judge("gpu-1", doc, LoadMode.WHEN_AVAILABLE)
    assert verdict.result is LoadResult.PASSED, verdict.why


def test_a_gpu_that_fails_under_load_is_lost_only_while_loaded(lib_dir: Path, tmp_path: Path) -> None:
    sd = state(tmp_path, "gpu_count=2\ngpu.1.fail_under_load=1\n")
    assert utilisation(lib_dir, sd) == [0, 0]  # idle: healthy
    doc = load(lib_dir, sd)
    assert all(s["error"] == "GPU is lost" for s in doc["gpus"][1]["samples"])
    verdict = judge("gpu-1", doc, LoadMode.WHEN_AVAILABLE)
    assert verdict.passed is False and verdict.why.startswith("load gate: GPU 1: NVML failed under load (GPU is lost")
    (sd / "load").write_text(f"until={int(time.time()) + 60}\nutil_gpu=70\n")  # the hook on, by hand
    assert utilisation(lib_dir, sd) == [70, "GPU is lost"]
    (sd / "load").write_text(f"until={int(time.time()) - 1}\n")  # a crashed writer's file: expired, ignored
    assert utilisation(lib_dir, sd) == [0, 0]


def test_without_the_lab_hook_or_a_cuda_stack_there_is_no_load_tool(tmp_path: Path) -> None:
    sd = state(tmp_path, "gpu_count=1\n")
    empty = tmp_path / "nolib"
    empty.mkdir()
    doc = load(empty, sd)  # no libnvidia-ml.so.1 at all: NVML fails first
    assert doc["tool"] is None and "no lab NVML load hook" in doc["tool_note"]
    assert doc["nvml_error"] and judge("h", doc, LoadMode.WHEN_AVAILABLE).passed is False
