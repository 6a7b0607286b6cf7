"""Benchmark: the fleet audit against Debian's parallel-ssh running the same probe, on 30 and 100 lab hosts.

    .venv/bin/python bench/audit_vs_pssh.py [--sizes 30,100] [--repeat 3]

For each size: ``lab.up`` time and memory per host, then (alternating, ``--repeat`` times each) the whole
``run_audit`` (fan-out + probe + parsing + checks) and ``parallel-ssh -p N -I`` sending the same probe bundle
on stdin to every host (output discarded). Prints medians, the ratio audit/pssh and the growth 30 -> 100.
Not a test: figures go into the README.
"""

from __future__ import annotations

import argparse
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
from remediation.host.audit import AuditOptions, probe_command, run_audit  # noqa: E402
from remediation.hostside import bundle  # noqa: E402
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
            "-p",
            str(len(names)),
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
        t0 = time.monotonic()
        proc = subprocess.run(cmd, input=probe, capture_output=True, check=False)
        elapsed = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"parallel-ssh failed: {proc.stdout.decode()[-500:]} {proc.stderr.decode()[-500:]}")
        return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="30,100")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    options = AuditOptions(concurrency=max(sizes), nvml_timeout=10, timeout=120)
    probe = bundle()
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    lab = Lab(
        LabConfig.from_mapping(
            {
                "state_dir": str(tmp / "state"),
                "address_prefix": test_prefix("127.0.60"),
                "inventory_path": str(tmp / "hosts.yml"),
                "flavour": "generic",
                **(
                    {"cache_dir": str(ROOT / ".lab/cache")}
                    if not __import__("os").environ.get("GPULAB_CACHE_DIR")
                    else {}
                ),
            },
            root=ROOT,
        )
    )
    try:
        for n in sizes:
            lab.down(purge=True)
            up = lab.up(n)
            memory = pss_per_host(lab, n)
            hosts = load(lab.cfg.inventory_path, "gpu")
            audit_times, pssh_times = [], []
            for _ in range(args.repeat):
                t0 = time.monotonic()
                result = run_audit(hosts, options)
                audit_times.append(time.monotonic() - t0)
                bad = [h.host for h in result.hosts if not h.probed]
                if bad:
                    raise SystemExit(f"audit could not probe {bad}")
                pssh_times.append(time_pssh(lab, [h.name for h in hosts], probe, options))
            a, p = statistics.median(audit_times), statistics.median(pssh_times)
            rows.append((n, up.seconds, memory, a, p))
            print(
                f"{n:>4} hosts: lab.up {up.seconds:.2f} s, {memory:.2f} MiB/host; audit {a:.2f} s,"
                f" parallel-ssh {p:.2f} s, ratio {a / p:.2f}",
                flush=True,
            )
    finally:
        lab.down(purge=True)
    print("\n| hosts | lab.up | memory/host | audit (median) | parallel-ssh (median) | audit / pssh |")
    print("|---|---|---|---|---|---|")
    for n, up_s, mem, a, p in rows:
        print(f"| {n} | {up_s:.2f} s | {mem:.2f} MiB | {a:.2f} s | {p:.2f} s | {a / p:.2f} |")
    if len(rows) >= 2:
        print(f"\naudit growth {rows[0][0]} -> {rows[-1][0]} hosts: {rows[-1][3] / rows[0][3]:.2f}x")


if __name__ == "__main__":
    main()
