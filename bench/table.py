"""The benches' figures as one markdown table, each against its target.

    .venv/bin/python bench/table.py FILE.json [FILE.json ...]

Reads the files the benches write with ``--json PATH`` (a flat object: metric name -> ``{"value": median, "runs":
[...], "unit": ...}``; later files override earlier ones metric by metric) and prints one table: metric | median |
runs | target | met?. Known metrics come first, in a fixed order (a size ``@N`` ascending), then any other metric,
by name, without a target. A file that cannot be read or is not of that shape is one line on stderr and exit 2.

Targets: ``audit_over_pssh@N`` <= 0.5 at every size; 1,000 hosts audited in 60 s or less (``audit_s@1000`` <= 60,
``hosts_per_min@N`` >= 1,000 at N >= 1,000); controller CPU <= 6 ms per host and <= 0.4 s fixed; ``lab_up_s@100``
< 5, ``lab_up_s@1000`` < 30; ``lab_pss_mib_per_host@N`` <= 1.7; ``kernel_update_over_plain`` <= 1.0;
``harden_over_plain`` <= 0.95.
"""

from __future__ import annotations

import json
import math
import operator
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Known metric names (without ``@N``), in the table's order.
ORDER = (
    "audit_s", "pssh_s", "audit_over_pssh", "hosts_per_min", "controller_cpu_ms_per_host", "controller_cpu_fixed_s",
    "lab_up_s", "lab_pss_mib_per_host", "harden_first_s", "harden_plain_s", "harden_over_plain", "kernel_update_s",
    "kernel_update_plain_s", "kernel_update_over_plain",
)

Compare = Callable[[float, float], bool]
SIGNS: dict[str, Compare] = {"<=": operator.le, "<": operator.lt, ">=": operator.ge}


@dataclass(frozen=True)
class Target:
    sign: str  # one of SIGNS
    bound: float

    def met(self, value: float) -> bool:
        return SIGNS[self.sign](value, self.bound)

    def __str__(self) -> str:
        return f"{self.sign} {_num(self.bound)}"


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    runs: tuple[float, ...]
    unit: str


def target(name: str) -> Target | None:
    """The target of metric ``name`` (``base`` or ``base@N``), or None where there is none."""
    base, _, size = name.partition("@")
    n = int(size) if size.isdigit() else None
    fixed = {
        "controller_cpu_ms_per_host": Target("<=", 6.0),
        "controller_cpu_fixed_s": Target("<=", 0.4),
        "kernel_update_over_plain": Target("<=", 1.0),
        "harden_over_plain": Target("<=", 0.95),
    }
    if not size and base in fixed:
        return fixed[base]
    if n is None:
        return None
    if base == "audit_over_pssh":
        return Target("<=", 0.5)
    if base == "lab_pss_mib_per_host":
        return Target("<=", 1.7)
    if base == "audit_s" and n == 1000:
        return Target("<=", 60.0)
    if base == "hosts_per_min" and n >= 1000:
        return Target(">=", 1000.0)
    if base == "lab_up_s" and n in (100, 1000):
        return Target("<", 5.0 if n == 100 else 30.0)
    return None


def _num(value: float) -> str:
    """A figure as the README writes it: three significant digits, no exponent, no trailing zeros."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} is {value!r}, not a number")
    return float(value)


def parse(data: object, source: str) -> list[Metric]:
    """The metrics of one file's object; ValueError naming the file and the metric when its shape is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: not a JSON object of metric name -> {{value, runs, unit}}")
    out = []
    for name, entry in data.items():
        where = f"{source}: {name}"
        if not isinstance(entry, dict) or "value" not in entry:
            raise ValueError(f"{where}: not an object with a value")
        runs = entry.get("runs", [])
        if not isinstance(runs, list):
            raise ValueError(f"{where}: runs is not a list")
        unit = entry.get("unit", "")
        out.append(Metric(name, _number(entry["value"], f"{where}: value"),
                          tuple(_number(r, f"{where}: a run") for r in runs), unit if isinstance(unit, str) else ""))
    return out


def _key(name: str) -> tuple[int, str, int]:
    base, _, size = name.partition("@")
    rank = ORDER.index(base) if base in ORDER else len(ORDER)
    return rank, base, int(size) if size.isdigit() else -1


def render(metrics: Sequence[Metric]) -> str:
    """One markdown table of ``metrics`` (the last of a name wins), known metrics first, each with its target."""
    by_name: dict[str, Metric] = {m.name: m for m in metrics}
    lines = ["| metric | median | runs | target | met? |", "|---|---|---|---|---|"]
    for name in sorted(by_name, key=_key):
        m = by_name[name]
        unit = f" {m.unit}" if m.unit else ""
        runs = ", ".join(_num(r) for r in m.runs) or "-"
        goal = target(name)
        met = "-" if goal is None else ("yes" if goal.met(m.value) else "**no**")
        lines.append(f"| {name} | {_num(m.value)}{unit} | {runs} | {goal or '-'} | {met} |")
    return "\n".join(lines)


def load(paths: Sequence[Path]) -> list[Metric]:
    metrics: list[Metric] = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None
        metrics += parse(data, str(path))
    return metrics


USAGE = "usage: bench/table.py FILE.json [FILE.json ...]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        print(__doc__.split("\n\n", 2)[2].strip())
        return 0
    if not args:
        print(f"error: no file given; {USAGE}", file=sys.stderr)
        return 2
    try:
        metrics = load([Path(a) for a in args])
    except ValueError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(render(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
