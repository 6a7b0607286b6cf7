"""Benchmark: the fleet audit against Debian's parallel-ssh running the same probe, at the same parallelism.

    .venv/bin/python bench/audit_vs_pssh.py [--sizes 30,100,200] [--repeat 3] [--json PATH] [--stock-image] [--smoke]

For each size: ``lab.up`` time and memory per host, then (alternating, ``--repeat`` times each) the whole
``run_audit`` (fan-out + probe + parsing + checks) and ``parallel-ssh -p N -I`` (N the audit's own concurrency)
sending the same probe bundle on stdin to every host (output discarded). Prints medians, the ratio audit/pssh and
the growth 30 -> 100.

Each audit runs in a fresh controller process (``python -c``: imports, inventory, ``run_audit``), its concurrency
chosen from the machine as ``invoke audit``'s is; the audit time is ``run_audit``'s own (as before), the controller
CPU is that process's user + sys with its children (``getrusage``). Over the sizes, CPU = fixed + per host x hosts
(least squares on the medians): ``controller_cpu_ms_per_host`` is the slope, ``controller_cpu_fixed_s`` the
intercept (imports, inventory, known_hosts, the bundle). ``--json PATH`` writes every figure as
``{"audit_s@30": {"value": median, "runs": [...], "unit": "s"}, ...}``. ``--smoke``: 2 hosts, one run, no figures
claimed, gpu-2 without pynvml (both of the probe's paths); exit 0 when the audit probed every host. Sizes above the
lab's maximum are skipped with a line. ``--stock-image``: every host's image has no pynvml, as a stock Azure Ubuntu
image has none, so both the audit and parallel-ssh run the copy of pynvml the bundle carries (compiled on every run).
Not a test: figures go into the README.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.config import LabConfig, test_prefix  # noqa: E402
from lab.control import Lab  # noqa: E402
from lab.errors import LabError  # noqa: E402
from remediation.host.audit import AuditOptions, probe_command  # noqa: E402
from remediation.hostside import bundle  # noqa: E402
from remediation.transport.fanout import auto_concurrency  # noqa: E402
from remediation.transport.inventory import load  # noqa: E402


def pss_per_host(lab: Lab, hosts: int) -> float:
    total = 0
    state = str(lab.paths.state)
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if state not in str((proc / "root").readlink()):
                continue
            m = re.search(r"^Pss:\s+(\d+)", (proc / "smaps_rollup").read_text(), re.M)
        except OSError:
            continue
        if m:
            total += int(m.group(1))
    return total / 1024 / hosts


def time_pssh(lab: Lab, names: list[str], probe: bytes, options: AuditOptions) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        hosts_file = Path(tmp) / "hosts"
        hosts_file.write_text("".join(f"{n}\n" for n in names))
        out = Path(tmp) / "out"
        cmd = [
            "parallel-ssh",
            "-h",
            str(hosts_file),
            # The audit's own parallelism (auto_concurrency: every host at once up to 64 a core), so the two are
            # compared at the same width; -p 1000 also runs parallel-ssh out of its own limits (8 hosts failed).
            "-p",
            str(auto_concurrency(len(names))),
            "-t",
            "120",
            "-I",
            "-x",
            f"-F {lab.paths.ssh_config}",
            "-o",
            str(out),
            # The same escalation the fan-out adds for a non-root login (azureuser): sudo -n in front.
            "sudo -n " + probe_command(options),
        ]
        for _attempt in range(2):
            t0 = time.monotonic()
            proc = subprocess.run(cmd, input=probe, capture_output=True, check=False)
            elapsed = time.monotonic() - t0
            if proc.returncode >= 0:
                break
            # Killed by a signal from outside (seen once on the contended machine, -31): one more try, said aloud.
            print(f"parallel-ssh killed by signal {-proc.returncode}; running it again", flush=True)
        if proc.returncode != 0:
            raise SystemExit(f"parallel-ssh failed: {proc.stdout.decode()[-500:]} {proc.stderr.decode()[-500:]}")
        return elapsed


#: One audit in a fresh controller process: what `invoke audit` pays (imports, inventory, known_hosts, the run).
_CHILD = """
import json, resource, sys, time
t0 = time.monotonic()
from remediation.host.audit import AuditOptions, run_audit
from remediation.transport.inventory import load
hosts = load(sys.argv[1], "gpu")
t1 = time.monotonic()
result = run_audit(hosts, AuditOptions(nvml_timeout=10, timeout=120))
t2 = time.monotonic()
# Healthy lab hosts: a host not probed, or whose NVML did not answer (e.g. no pynvml reached it), fails the bench.
bad = {h.host: h.error if not h.probed or h.facts is None else "NVML " + h.facts.nvml.error_class
       for h in result.hosts if not h.probed or h.facts is None or h.facts.nvml.failed}
print(json.dumps({"audit_s": t2 - t1, "process_s": t2 - t0, "bad": bad}))
"""


def time_audit(inventory: Path) -> tuple[float, float, float]:
    """(run_audit seconds, whole controller process seconds, its CPU seconds with its children) of one audit."""
    before = os.times()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(inventory)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"audit failed: {proc.stderr[-800:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["bad"]:
        reasons: dict[str, list[str]] = {}
        for host, error in out["bad"].items():
            reasons.setdefault(str(error), []).append(host)
        raise SystemExit(
            f"audit could not probe {len(out['bad'])} hosts: "
            + "; ".join(f"{len(hosts)} x {error!r} (e.g. {hosts[0]})" for error, hosts in reasons.items())
        )
    # os.times' children figures count the child and every grandchild it waited for (ssh, ProxyCommand, ...).
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return out["audit_s"], out["process_s"], cpu


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through ``points``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def figure(runs: list[float], unit: str) -> dict[str, object]:
    return {"value": round(statistics.median(runs), 4), "runs": [round(r, 4) for r in runs], "unit": unit}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="30,100")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="PATH", help="write every figure to PATH as one flat JSON object")
    ap.add_argument("--smoke", action="store_true", help="2 hosts, one run, no figures claimed: does it still work")
    ap.add_argument("--stock-image", action="store_true",
                    help="hosts without pynvml (a stock Azure Ubuntu image): the probe runs the bundle's copy")
    args = ap.parse_args()
    try:
        sizes = [2] if args.smoke else [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes {args.sizes!r}: give host counts separated by commas (30,100,200)")
    repeat = 1 if args.smoke else args.repeat
    if repeat < 1 or any(n < 1 for n in sizes):
        ap.error("--repeat and every --sizes entry must be at least 1")
    options = AuditOptions(nvml_timeout=10, timeout=120)
    probe = bundle()
    rows = []
    figures: dict[str, dict[str, object]] = {}
    cpu_points: list[tuple[int, float]] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    lab = Lab(
        LabConfig.from_mapping(
            {
                "state_dir": str(tmp / "state"),
                "address_prefix": test_prefix("127.0.60"),
                "inventory_path": str(tmp / "hosts.yml"),
                "flavour": "generic",
                "pynvml": not args.stock_image,
                **({"host_overrides": {"gpu-2": {"pynvml": False}}} if args.smoke else {}),
                **({"cache_dir": str(ROOT / ".lab/cache")} if not os.environ.get("GPULAB_CACHE_DIR") else {}),
            },
            root=ROOT,
        )
    )
    try:
        for n in sizes:
            lab.down(purge=True)
            try:
                up = lab.up(n)
            except LabError as exc:
                print(f"{n:>4} hosts: skipped, the lab refuses them ({exc})", flush=True)
                continue
            memory = pss_per_host(lab, n)
            hosts = load(lab.cfg.inventory_path, "gpu")
            audit_times, process_times, cpu_times, pssh_times = [], [], [], []
            for _ in range(repeat):
                a, whole, cpu = time_audit(lab.cfg.inventory_path)
                audit_times.append(a)
                process_times.append(whole)
                cpu_times.append(cpu)
                pssh_times.append(time_pssh(lab, [h.name for h in hosts], probe, options))
            a, p = statistics.median(audit_times), statistics.median(pssh_times)
            cpu_points.append((n, statistics.median(cpu_times)))
            rows.append((n, up.seconds, memory, a, p, statistics.median(cpu_times)))
            figures[f"audit_s@{n}"] = figure(audit_times, "s")
            figures[f"audit_process_s@{n}"] = figure(process_times, "s")
            figures[f"pssh_s@{n}"] = figure(pssh_times, "s")
            ratios = [x / y for x, y in zip(audit_times, pssh_times, strict=True)]
            figures[f"audit_over_pssh@{n}"] = figure(ratios, "ratio")
            figures[f"hosts_per_min@{n}"] = figure([n * 60 / x for x in audit_times], "hosts/min")
            figures[f"controller_cpu_s@{n}"] = figure(cpu_times, "s")
            if args.json:  # after every size: a run cut short still leaves its figures
                Path(args.json).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
            print(
                f"{n:>4} hosts: lab.up {up.seconds:.2f} s, {memory:.2f} MiB/host; audit {a:.2f} s"
                f" (concurrency {auto_concurrency(n)}), parallel-ssh {p:.2f} s, ratio {a / p:.2f},"
                f" controller CPU {statistics.median(cpu_times):.2f} s",
                flush=True,
            )
    finally:
        lab.down(purge=True)
    if args.smoke:
        print("smoke: the audit probed every host and parallel-ssh ran the same probe (no figures claimed)")
        return
    if args.stock_image:
        print("\nevery host a stock image: no pynvml of its own, the probe ran the bundle's copy")
    print("\n| hosts | lab.up | memory/host | audit (median) | parallel-ssh (median) | audit / pssh | controller CPU |")
    print("|---|---|---|---|---|---|---|")
    for n, up_s, mem, a, p, cpu in rows:
        print(f"| {n} | {up_s:.2f} s | {mem:.2f} MiB | {a:.2f} s | {p:.2f} s | {a / p:.2f} | {cpu:.2f} s |")
    if len(rows) >= 2:
        print(f"\naudit growth {rows[0][0]} -> {rows[-1][0]} hosts: {rows[-1][3] / rows[0][3]:.2f}x")
        slope, intercept = fit(cpu_points)
        runs = [slope * 1000]
        figures["controller_cpu_ms_per_host"] = {"value": round(slope * 1000, 3), "runs": runs, "unit": "ms"}
        figures["controller_cpu_fixed_s"] = {"value": round(intercept, 3), "runs": [intercept], "unit": "s"}
        print(f"controller CPU: {slope * 1000:.1f} ms per host + {intercept:.2f} s fixed (least squares over sizes)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
