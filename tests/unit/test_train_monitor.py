"""The GPU memory sampler and its bundle, without a host: the real sampler with the real pynvml on this controller
(no NVIDIA driver here: NVML does not initialise), the CSV contract, the monitor's bounds."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from remediation.hostside import sampler
from remediation.train import monitor as monitor_mod
from remediation.train.errors import TrainError
from remediation.train.monitor import FIELDS, bundle, monitor, parse_csv
from remediation.transport.inventory import Host

REPO = Path(__file__).resolve().parents[2]


def test_the_sampler_and_the_monitor_agree_on_the_columns() -> None:
    assert tuple(sampler.FIELDS) == FIELDS


def test_bundle_runs_the_sampler_without_nvml_driver(tmp_path: Path) -> None:
    """This controller has no libnvidia-ml: every sample is a row with the NVML error, and the exit status is 3."""
    program = bundle()
    assert b"gpumemlog" in program
    proc = subprocess.run(
        [sys.executable, "-I", "-", "--interval", "0.1", "--count", "2", "--host-label", "ctl"],
        input=program, capture_output=True, timeout=60, check=False,
    )
    assert proc.returncode == 3
    text = proc.stdout.decode()
    assert text.splitlines()[0] == ",".join(FIELDS)
    rows = parse_csv(text)
    assert len(rows) == 2 and all(r.host == "ctl" and r.gpu is None and r.error for r in rows)
    assert rows[1].epoch - rows[0].epoch == pytest.approx(0.1, abs=0.05)


def test_sampler_appends_and_rotates(tmp_path: Path) -> None:
    out = tmp_path / "gpu_memory.csv"
    run = [sys.executable, str(REPO / "remediation" / "hostside" / "sampler.py"), "--interval", "0.1", "--count", "1",
           "--out", str(out)]
    for _ in range(2):
        subprocess.run(run, capture_output=True, timeout=60, check=False)
    lines = out.read_text().splitlines()
    assert lines[0] == ",".join(FIELDS) and len(lines) == 3 and lines.count(lines[0]) == 1
    subprocess.run([*run, "--max-bytes", "10"], capture_output=True, timeout=60, check=False)
    assert (tmp_path / "gpu_memory.csv.1").read_text().splitlines() == lines
    assert len(out.read_text().splitlines()) == 2


def test_sampler_refuses_unbounded_runs() -> None:
    assert sampler.main(["--interval", "0", "--count", "1"]) == 2
    assert sampler.main(["--interval", "1", "--count", "0"]) == 2


def test_parse_csv_skips_what_is_not_a_row() -> None:
    text = (",".join(FIELDS) + "\nnoise\n2026-01-01T00:00:00.000Z,h,0,10,70,80,5,\n"
            "2026-01-01T00:00:05.000Z,h,,,,,,NVML: GPU is lost\n1,2,3\n")
    rows = parse_csv(text)
    assert [(r.gpu, r.memory_used_mib, r.error) for r in rows] == [(0, 10, ""), (None, None, "NVML: GPU is lost")]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"interval": 0.01, "count": 1}, "--interval"),
        ({"interval": 5, "count": 0}, "--count 0"),
        ({"interval": 5, "count": 10_000}, "monitor_max_seconds"),
    ],
)
def test_monitor_bounds(kw: dict[str, float], message: str) -> None:
    host = Host("gpu-1", "127.0.0.1")
    with pytest.raises(TrainError, match=message):
        monitor(host, out=io.StringIO(), max_seconds=3600, **kw)  # type: ignore[arg-type]
    assert monitor_mod.SAMPLER_PATH.exists()
