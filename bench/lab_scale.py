"""Benchmark: ``lab.up`` of a fresh lab (base image cached) at several sizes, up to the lab's 1,000 hosts.

    .venv/bin/python bench/lab_scale.py [--sizes 100,1000] [--repeat 3] [--json PATH] [--smoke]

For each size and run: ``lab.down --purge``, then ``lab.up`` of that many new hosts, timed from the call to every
sshd listening and the inventory written; then the memory of the hosts (PSS per host, ``pss_per_host`` of
``bench/audit_vs_pssh.py``) and the CPU seconds that start used (this process, the supervisor and every host
process with its reaped children: a figure that a busy machine disturbs less than the wall time). Prints medians;
``--json`` writes them as ``{"lab_up_s@100": {"value": median, "runs": [...], "unit": "s"}, ...}``.
``--smoke``: a handful of hosts, one run, no timing claims; exits 0 when the lab came up and went down.
Needs root and the cached base image (``GPULAB_CACHE_DIR`` or ``.lab/cache``); set ``GPULAB_NET`` when another
checkout runs labs at the same time. Not a test: figures go into the README.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.audit_vs_pssh import pss_per_host  # noqa: E402
from lab.config import MAX_HOSTS, LabConfig, test_prefix  # noqa: E402
from lab.control import Lab  # noqa: E402
from lab.errors import LabError  # noqa: E402

#: 127.0.200 .. 127.0.203 hold 1,000 hosts (254 per /24); no test, Molecule scenario or other bench uses them.
PREFIX = "127.0.200"
SMOKE_HOSTS = 5
TICKS = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int | str) -> float:
    """utime + stime + the reaped children's (cutime + cstime) of one process, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICKS


def lab_cpu(lab: Lab) -> float:
    """CPU seconds of the supervisor (with the children it reaped) and of every process inside a host of ``lab``."""
    state = str(lab.paths.state)
    total = 0.0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if state not in str((proc / "root").readlink()):
                continue
        except OSError:
            continue
        total += _proc_cpu(proc.name)
    sup = lab.supervisor_pid()
    return total + (_proc_cpu(sup) if sup else 0.0)


def _own_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def make_lab(tmp: Path) -> Lab:
    mapping: dict[str, object] = {
        "state_dir": str(tmp / "state"),
        "address_prefix": test_prefix(PREFIX),
        "inventory_path": str(tmp / "hosts.yml"),
        "flavour": "generic",
        "ready_timeout": 300.0,
    }
    if not os.environ.get("GPULAB_CACHE_DIR"):
        mapping["cache_dir"] = str(ROOT / ".lab/cache")
    return Lab(LabConfig.from_mapping(mapping, root=ROOT))


def _busy_share(window: float) -> float:
    """The share of the machine's CPU time that was busy over ``window`` seconds (/proc/stat, all CPUs)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), sum(v) - v[3] - v[4]
    t0, b0 = sample()
    time.sleep(window)
    t1, b1 = sample()
    return (b1 - b0) / max(1, t1 - t0)


def settle(limit: float = 60.0, quiet: float = 0.1) -> None:
    """Wait (at most ``limit`` s) until the machine is quiet: a lab's stop leaves the kernel tearing down its hosts'
    mount namespaces, and the purge's files being written back, for seconds after ``lab.down`` returns. A start
    timed during that is timed against it (runs of one size varied by a quarter)."""
    deadline = time.monotonic() + limit
    while _busy_share(0.5) > quiet and time.monotonic() < deadline:
        pass


def one_run(lab: Lab, n: int) -> tuple[float, float, float]:
    """(lab.up seconds, PSS MiB per host, CPU seconds of the start) for a fresh lab of ``n`` hosts."""
    lab.down(purge=True)
    os.sync()
    settle()
    cpu0 = _own_cpu()
    t0 = time.monotonic()
    lab.up(n)
    seconds = time.monotonic() - t0
    cpu = _own_cpu() - cpu0 + lab_cpu(lab)
    running = sum(1 for s in lab.status() if s.ssh)
    if running != n:
        raise SystemExit(f"lab_scale: {running} of {n} hosts listen on port 22 after lab.up")
    return seconds, pss_per_host(lab, n), cpu


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(not 1 <= s <= MAX_HOSTS for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: give host counts from 1 to {MAX_HOSTS}, e.g. 100,1000")
    return sizes


def _repeat(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--repeat {text!r}: give a whole number of runs, 1 or more")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=_sizes, default="100,1000", help="host counts, comma-separated")
    ap.add_argument("--repeat", type=_repeat, default=3, help="runs per size (medians are reported)")
    ap.add_argument("--json", type=Path, help="write the medians and runs to this file")
    ap.add_argument("--smoke", action="store_true", help=f"{SMOKE_HOSTS} hosts, one run, no timing claims")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("lab_scale: the lab needs root (overlay mounts, namespaces): run it as root", file=sys.stderr)
        return 2
    sizes, repeat = ([SMOKE_HOSTS], 1) if args.smoke else (args.sizes, args.repeat)
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-scale-"))
    lab = make_lab(tmp)
    results: dict[str, dict[str, object]] = {}
    try:
        for n in sizes:
            runs = [one_run(lab, n) for _ in range(repeat)]
            for key, unit, values in (
                (f"lab_up_s@{n}", "s", [r[0] for r in runs]),
                (f"lab_pss_mib_per_host@{n}", "MiB", [r[1] for r in runs]),
                (f"lab_up_cpu_s@{n}", "s", [r[2] for r in runs]),
            ):
                results[key] = {"value": round(statistics.median(values), 3), "runs": [round(v, 3) for v in values],
                                "unit": unit}
            if args.smoke:
                print(f"smoke: {n} hosts came up and answered; lab_scale works (no timing claims)")
            else:
                print(
                    f"{n:5d} hosts: lab.up {results[f'lab_up_s@{n}']['value']} s,"
                    f" {results[f'lab_pss_mib_per_host@{n}']['value']} MiB PSS per host,"
                    f" {results[f'lab_up_cpu_s@{n}']['value']} CPU s (medians of {repeat})",
                    flush=True,
                )
    except LabError as exc:
        print(f"lab_scale: {exc}", file=sys.stderr)
        return 1
    finally:
        lab.down(purge=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
