"""``train.monitor`` on lab hosts (127.0.39.N, 2 hosts of their own): NVML sampled over SSH to CSV; and the
demo's S2 scene on the same lab.

The sampler travels the audit's way (one SSH round trip per chunk, host keys verified) and reads the lab's NVML
through the real pynvml. The ``memory-full`` fault must show in the CSV; a host that cannot be reached exits 3.
"""

from __future__ import annotations

import io
import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.train.monitor import FIELDS, monitor, parse_csv
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    the_lab = make_lab(tmp_path_factory.mktemp("monitor-lab"), "127.0.39", 2)
    try:
        yield the_lab
    finally:
        the_lab.down(purge=True)


def _host(lab: Any, name: str) -> Any:
    return next(h for h in load(lab.cfg.inventory_path, "gpu") if h.name == name)


def test_demo_scene_shows_what_it_should(lab: Any) -> None:
    from rich.console import Console

    from demo import SceneContext
    from demo.train import SCENE

    out = io.StringIO()
    ctx = SceneContext(console=Console(file=out, width=140), root=ROOT, lab=lab, hosts=2)
    assert SCENE.run(ctx), out.getvalue()[-4000:]
    text = out.getvalue()
    assert "DOES NOT FIT" in text and "TRAIN-OOM-004" in text and "gradient_accumulation_steps=" in text
    assert lab.faults("gpu-1") == []  # the scene cleared the host it broke


def test_samples_in_chunks_keep_their_spacing(lab: Any) -> None:
    out = io.StringIO()
    chunks: list[int] = []
    result = monitor(_host(lab, "gpu-1"), interval=0.5, count=4, out=out, max_seconds=60, chunk_seconds=1.0,
                     on_chunk=lambda rows: chunks.append(len(rows)))
    assert result.ok, result.error
    text = out.getvalue()
    assert text.splitlines()[0] == ",".join(FIELDS)
    rows = parse_csv(text)
    gpus = sorted({r.gpu for r in rows})
    assert gpus and all(g is not None for g in gpus)
    assert len(rows) == 4 * len(gpus) and result.chunks == 2 and len(chunks) == 2
    assert all(r.host == "gpu-1" and not r.error for r in rows)
    first = [r for r in rows if r.gpu == gpus[0]]
    assert all(r.memory_total_mib and r.memory_used_mib is not None and r.memory_free_mib is not None for r in first)
    assert all(r.memory_used_mib + r.memory_free_mib == r.memory_total_mib for r in first)  # type: ignore[operator]
    times = [r.epoch for r in first]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.4 < g < 0.75 for g in gaps), gaps  # across the SSH round trip between chunks too


def test_memory_full_fault_shows_in_the_csv(lab: Any, tmp_path: Path) -> None:
    before = io.StringIO()
    assert monitor(_host(lab, "gpu-1"), interval=0.2, count=1, out=before, max_seconds=60).ok
    used_before = next(r for r in parse_csv(before.getvalue()) if r.gpu == 0).memory_used_mib
    inject(lab, "gpu-1", "memory-full")
    csv_path = tmp_path / "gpu_memory.csv"
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "invoke"), "train.monitor", "--host", "gpu-1", "--inventory",
         str(lab.cfg.inventory_path), "--interval", "0.5", "--count", "2", "--out", str(csv_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = csv_path.read_text()
    assert text.count(",".join(FIELDS)) == 1
    gpu0 = [r for r in parse_csv(text) if r.gpu == 0]
    assert len(gpu0) == 2
    for row in gpu0:
        assert row.memory_used_mib is not None and row.memory_total_mib is not None
        assert row.memory_used_mib >= 0.96 * row.memory_total_mib > 20 * (used_before or 1)
        assert row.utilization_gpu_pct == 98
    # a second run appends rows, not a second header
    again = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "invoke"), "train.monitor", "--host", "gpu-1", "--inventory",
         str(lab.cfg.inventory_path), "--interval", "0.2", "--count", "1", "--out", str(csv_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert again.returncode == 0 and csv_path.read_text().count(",".join(FIELDS)) == 1
    assert len([r for r in parse_csv(csv_path.read_text()) if r.gpu == 0]) == 3


def test_plan_reads_capacity_from_the_host(lab: Any) -> None:
    """--from-host: the capacity is the audit's NVML memory total of that host's GPUs."""
    import json

    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "invoke"), "train.plan", "--from-host", "gpu-1", "--inventory",
         str(lab.cfg.inventory_path), "--model", "Llama-2-7b", "--method", "lora", "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    from remediation.core.skus import SIZES

    assert doc["gpu"]["capacity_bytes"] == SIZES[lab.spec("gpu-1")["sku"]].gpu.memory_mib * 1024**2
    assert doc["gpu"]["source"].startswith("gpu-1: ") and "NVML" in doc["gpu"]["source"]
    assert doc["fits"] is True


def test_unreachable_host_exits_3_and_bad_input_2(lab: Any) -> None:
    inject(lab, "gpu-2", "unreachable")
    base = [str(ROOT / ".venv" / "bin" / "invoke"), "train.monitor", "--inventory", str(lab.cfg.inventory_path)]
    proc = subprocess.run([*base, "--host", "gpu-2", "--interval", "0.2", "--count", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "gpu-2: unreachable" in proc.stderr
    bad = subprocess.run([*base, "--host", "gpu-1", "--interval", "1", "--count", "100000"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "monitor_max_seconds" in bad.stderr and bad.stderr.count("\n") == 1
    none = subprocess.run([*base, "--host", "gpu-9"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert none.returncode == 2 and "gpu-9" in none.stderr
