"""Every bench still runs: each ``bench/*.py`` as a subprocess with ``--smoke`` (a few hosts or requests, one round),
exit 0 and its figures' names in what it prints (and, for a bench that writes ``--json``, in its file, which
``bench/table.py`` renders). No timing assertion: the figures of a smoke run mean nothing.

Every file of ``bench/`` is a case (a new bench is one without being listed); :data:`FIGURES` says what each prints.
Benches that start lab hosts skip without root, as the lab tests do; they run on ``GPULAB_NET``'s prefixes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_lab

#: Not benches: helpers of bench/ that the benches' figures go through.
NOT_BENCHES = frozenset({"table.py"})
BENCHES = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name not in NOT_BENCHES)


@dataclass(frozen=True)
class Figures:
    printed: tuple[str, ...]  # text the smoke run prints: the table's header and the figures' names
    metrics: tuple[str, ...] = ()  # metric names (without @N) in its --json file (bench/table.py's format)
    lab: bool = False  # starts lab hosts


FIGURES = {
    "aoai_burst.py": Figures(("| run | goodput | 429 answers | p50 | p99 | succeeded | failed | lost |",
                              "| scaled: ours (+10 %) |", "| scaled: ours (-10 %) |", "| scaled: openai-python |",
                              "| 86400: ours (told 120,000) |", "| 86400: openai-python |")),
    "audit_vs_pssh.py": Figures(("hosts: lab.up", "parallel-ssh", "ratio", "controller CPU",
                                 "smoke: the audit probed every host"),
                                ("audit_s", "pssh_s", "audit_over_pssh", "controller_cpu_s"), lab=True),
    "harden.py": Figures(("smoke: 3 hosts, every part ran and converged",),
                         ("harden_first_s", "harden_plain_s", "harden_over_plain", "kernel_update_s",
                          "kernel_update_plain_s", "kernel_update_over_plain"), lab=True),
    "lab_scale.py": Figures((), ("lab_up_s", "lab_pss_mib_per_host"), lab=True),
    "remediate.py": Figures(("| hosts | side | time to every fixable host healthy |", "| 8 | loop (",
                             "escalated (hardware hosts)"), lab=True),
    "train_calibration.py": Figures(("| point | job | measured | planner | error |", "ACTIVATION_SCALE",
                                     "leave-one-out: median absolute error")),
}


def test_every_bench_is_listed() -> None:
    assert set(BENCHES) - set(FIGURES) == set(), "add the new bench's figures to FIGURES"


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_smoke(bench: str, tmp_path: Path) -> None:
    figures = FIGURES[bench]
    if figures.lab:
        require_lab()
    argv = [sys.executable, str(ROOT / "bench" / bench), "--smoke"]
    out_json = tmp_path / "figures.json"
    if figures.metrics:
        argv += ["--json", str(out_json)]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
                       check=False)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for text in figures.printed:
        assert text in r.stdout, (text, r.stdout[-3000:])
    if figures.metrics:
        data = json.loads(out_json.read_text())
        names = {name.partition("@")[0] for name in data}
        assert set(figures.metrics) <= names, sorted(names)
        table = subprocess.run([sys.executable, str(ROOT / "bench" / "table.py"), str(out_json)], capture_output=True,
                               text=True, timeout=60, check=False)
        assert table.returncode == 0, table.stderr
        rows = table.stdout.splitlines()[2:]
        assert sorted(row.split("|")[1].strip() for row in rows) == sorted(data), table.stdout
