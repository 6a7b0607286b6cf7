"""bench/table.py: the benches' JSON figures as one markdown table, each against its target."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_table", ROOT / "bench" / "table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


table = _table()


def entry(value: float, runs: list[float], unit: str) -> dict[str, object]:
    return {"value": value, "runs": runs, "unit": unit}


AUDIT = {
    "audit_s@100": entry(3.2, [3.1, 3.2, 3.6], "s"),
    "audit_s@30": entry(1.5, [1.5, 1.4, 1.7], "s"),
    "audit_s@1000": entry(61.0, [61.0], "s"),
    "pssh_s@100": entry(6.0, [6.0, 5.9, 6.3], "s"),
    "audit_over_pssh@30": entry(0.45, [0.45], "x"),
    "audit_over_pssh@100": entry(0.53, [0.53], "x"),
    "hosts_per_min@1000": entry(983.6, [983.6], "hosts/min"),
    "controller_cpu_ms_per_host": entry(5.9, [5.9, 6.1], "ms"),
    "controller_cpu_fixed_s": entry(0.41, [0.41], "s"),
}
OTHER = {
    "lab_up_s@100": entry(4.9, [4.9], "s"),
    "lab_up_s@1000": entry(30.0, [30.0], "s"),
    "lab_up_s@30": entry(1.2, [1.2], "s"),
    "lab_pss_mib_per_host@100": entry(1.7, [1.7], "MiB"),
    "harden_over_plain": entry(0.95, [0.95], "x"),
    "kernel_update_over_plain": entry(1.04, [1.04], "x"),
    "a_new_figure": entry(12, [], ""),
}


def rows(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    assert lines[:2] == ["| metric | median | runs | target | met? |", "|---|---|---|---|---|"]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, line
        out[cells[0]] = cells[1:]
    return out


def test_one_table_of_every_metric_in_order_with_its_target(tmp_path: Path) -> None:
    first, second = tmp_path / "audit.json", tmp_path / "other.json"
    first.write_text(json.dumps(AUDIT))
    second.write_text(json.dumps(OTHER))
    text = table.render(table.load([first, second]))
    got = rows(text)
    assert list(got) == [
        "audit_s@30", "audit_s@100", "audit_s@1000", "pssh_s@100", "audit_over_pssh@30", "audit_over_pssh@100",
        "hosts_per_min@1000", "controller_cpu_ms_per_host", "controller_cpu_fixed_s", "lab_up_s@30",
        "lab_up_s@100", "lab_up_s@1000", "lab_pss_mib_per_host@100", "harden_over_plain",
        "kernel_update_over_plain", "a_new_figure",
    ]
    assert got["audit_s@100"] == ["3.2 s", "3.1, 3.2, 3.6", "-", "-"]  # no target below 1,000 hosts
    assert got["audit_s@1000"] == ["61 s", "61", "<= 60", "**no**"]
    assert got["audit_over_pssh@30"][2:] == ["<= 0.5", "yes"]
    assert got["audit_over_pssh@100"][2:] == ["<= 0.5", "**no**"]
    assert got["hosts_per_min@1000"] == ["984 hosts/min", "984", ">= 1000", "**no**"]
    assert got["controller_cpu_ms_per_host"][2:] == ["<= 6", "yes"]  # the median, not the worst run
    assert got["controller_cpu_fixed_s"][2:] == ["<= 0.4", "**no**"]
    assert got["lab_up_s@100"][2:] == ["< 5", "yes"]
    assert got["lab_up_s@1000"][2:] == ["< 30", "**no**"]  # strictly under
    assert got["lab_up_s@30"][2:] == ["-", "-"]
    assert got["lab_pss_mib_per_host@100"][2:] == ["<= 1.7", "yes"]
    assert got["harden_over_plain"][2:] == ["<= 0.95", "yes"]
    assert got["kernel_update_over_plain"][2:] == ["<= 1", "**no**"]
    assert got["a_new_figure"] == ["12", "-", "-", "-"]


def test_a_later_file_overrides_a_metric_of_an_earlier_one(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"harden_over_plain": entry(1.2, [1.2], "x")}))
    second.write_text(json.dumps({"harden_over_plain": entry(0.9, [0.9, 0.8], "x")}))
    assert rows(table.render(table.load([first, second])))["harden_over_plain"] == ["0.9 x", "0.9, 0.8", "<= 0.95",
                                                                                    "yes"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "not a JSON object of metric name"),
        ('{"audit_s@30": 1.5}', "audit_s@30: not an object with a value"),
        ('{"audit_s@30": {"value": "fast"}}', "audit_s@30: value is 'fast', not a number"),
        ('{"audit_s@30": {"value": 1, "runs": [1, null]}}', "audit_s@30: a run is None, not a number"),
        ("{not json", "is not JSON"),
    ],
)
def test_a_file_of_the_wrong_shape_is_one_line_and_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "figures.json"
    path.write_text(content)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "table.py"), str(path)], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr


def test_a_missing_file_and_no_file_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert table.main([str(tmp_path / "none.json")]) == 2
    assert table.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"error: cannot read {tmp_path / 'none.json'}: No such file or directory",
                                "error: no file given; usage: bench/table.py FILE.json [FILE.json ...]"]
