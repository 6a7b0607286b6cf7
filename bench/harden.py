"""Benchmark: `harden` and `kernel-update` on 30 lab hosts, against the floor (`ansible all -m ping`), the audit and
plain ansible-playbook runs.

    .venv/bin/python bench/harden.py [--hosts 30] [--part harden|kernel-update|all] [--repeat N] [--json PATH]
    .venv/bin/python bench/harden.py --smoke   # 3 hosts, one run of each part: it works (exit 0), no timing claims

In one run, on fresh hosts each time:
1. ``ansible all -m ping`` (the floor: what any Ansible contact with the fleet costs);
2. ``harden`` (audit, plan, apply through ansible-runner, re-audit) on all-unhardened hosts;
3. ``harden`` again with nothing to change (must not pay for Ansible: audit only);
4. the same roles as a plain ``ansible-playbook playbooks/harden.yml`` run on fresh unhardened hosts;
5. the audit alone, for the ratio of 3. to it.
Targets: 3. <= 1.5x 5.; 2. <= 0.95x 4. Not a test: figures go into the README.

``--part kernel-update``, on fresh generic hosts (6.5.0-44 booted, 6.5.0-45 offered by the lab's security pocket):
6. ``kernel-update --check`` (audit, what apt offers each host, the plan) against 7. the audit alone (target <= 1.5x);
8. the full rolling update (install, gate 1, trial boot, gate 2, promote, hold) in 25 % batches against 9. plain
   ``ansible-playbook playbooks/kernel_update.yml`` doing the same steps with ``kernel_update_batch=25%`` on fresh
   hosts (target <= 1.0x).
``--repeat N`` runs each part N times (fresh hosts each time) and reports medians; ``--json PATH`` writes the figures
as a flat dict ``{"harden_first_s": {"value": median, "runs": [...], "unit": "s"}, ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
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
from remediation.host.audit import AuditOptions, run_audit  # noqa: E402
from remediation.host.harden import harden  # noqa: E402
from remediation.kernelupdate.flow import KernelUpdateOptions, kernel_update  # noqa: E402
from remediation.rollout.engine import StopReason  # noqa: E402
from remediation.transport.inventory import load  # noqa: E402
from remediation.transport.runner import collections_first  # noqa: E402


def timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=30)
    ap.add_argument("--part", choices=("harden", "kernel-update", "all"), default="all")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each part (medians are reported)")
    ap.add_argument("--json", type=Path, help="write the figures to this file as JSON")
    ap.add_argument("--smoke", action="store_true", help="3 hosts, one run: checks the benchmark works, no figures")
    args = ap.parse_args()
    if args.hosts < 1 or args.repeat < 1:
        print(f"--hosts {args.hosts} and --repeat {args.repeat} must be at least 1", file=sys.stderr)
        raise SystemExit(2)
    n, repeat = (3, 1) if args.smoke else (args.hosts, args.repeat)
    runs: dict[str, list[float]] = {}
    with collections_first([ROOT / "collections"]):  # the working tree's playbooks, as `invoke` here runs them
        for _ in range(repeat):
            if args.part in ("harden", "all"):
                for key, value in bench_harden(n).items():
                    runs.setdefault(key, []).append(value)
            if args.part in ("kernel-update", "all"):
                for key, value in bench_kernel_update(n).items():
                    runs.setdefault(key, []).append(value)
    figures = _figures(runs)
    if args.smoke:
        print(f"smoke: {n} hosts, every part ran and converged (a smoke run's timings are no figures)")
    else:
        _print(n, figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


RATIOS = {
    "harden_over_plain": ("harden_first_s", "harden_plain_s"),
    "harden_again_over_audit": ("harden_again_s", "harden_audit_s"),
    "kernel_update_over_plain": ("kernel_update_s", "kernel_update_plain_s"),
    "kernel_check_over_audit": ("kernel_check_s", "kernel_audit_s"),
}


def _figures(runs: dict[str, list[float]]) -> dict[str, dict[str, object]]:
    """Each timing's median and runs, and the median of each run's ratio (flow over plain playbook, ...)."""
    out: dict[str, dict[str, object]] = {}
    for key, values in runs.items():
        out[key] = {"value": round(statistics.median(values), 2), "runs": [round(v, 2) for v in values], "unit": "s"}
    for key, (num, den) in RATIOS.items():
        if num in runs and den in runs:
            pairs = [a / b for a, b in zip(runs[num], runs[den], strict=True)]
            out[key] = {"value": round(statistics.median(pairs), 3), "runs": [round(v, 3) for v in pairs],
                        "unit": "x"}
    return out


def _print(n: int, f: dict[str, dict[str, object]]) -> None:
    def v(key: str) -> object:
        return f[key]["value"] if key in f else "-"

    if "harden_first_s" in f:
        print("| hosts | ansible -m ping | harden (first) | harden (no change) | audit | plain ansible-playbook |")
        print("|---|---|---|---|---|---|")
        print(f"| {n} | {v('harden_ping_s')} s | {v('harden_first_s')} s | {v('harden_again_s')} s |"
              f" {v('harden_audit_s')} s | {v('harden_plain_s')} s |")
        print(f"\nno-change harden / audit: {v('harden_again_over_audit')}x (target <= 1.5x)")
        print(f"first harden / plain ansible-playbook: {v('harden_over_plain')}x (target <= 0.95x),"
              f" runs {f['harden_over_plain']['runs']}\n")
    if "kernel_update_s" in f:
        print("| hosts | audit | kernel-update --check | kernel-update, 25 % batches | plain ansible-playbook, 25 % |")
        print("|---|---|---|---|---|")
        print(f"| {n} | {v('kernel_audit_s')} s | {v('kernel_check_s')} s | {v('kernel_update_s')} s |"
              f" {v('kernel_update_plain_s')} s |")
        print(f"\nkernel-update --check / audit: {v('kernel_check_over_audit')}x (target <= 1.5x)")
        print(f"kernel-update / plain ansible-playbook: {v('kernel_update_over_plain')}x (target <= 1.0x),"
              f" runs {f['kernel_update_over_plain']['runs']}")


def _lab(tmp: Path) -> Lab:
    settings = {
        "state_dir": str(tmp / "state"),
        "address_prefix": test_prefix("127.0.61"),
        "inventory_path": str(tmp / "hosts.yml"),
        "flavour": "generic",
    }
    if not os.environ.get("GPULAB_CACHE_DIR"):
        settings["cache_dir"] = str(ROOT / ".lab/cache")
    return Lab(LabConfig.from_mapping(settings, root=ROOT))


def bench_kernel_update(n: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-kernel-"))
    lab = _lab(tmp)
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    inv = str(lab.cfg.inventory_path)
    options = AuditOptions(concurrency=n)
    quarter = max(1, n // 4)  # what Ansible's serial: 25% gives (rounded down): the same batches on both sides
    try:
        lab.up(n)
        hosts = load(inv, "gpu")
        audit, _ = timed(lambda: run_audit(hosts, options))
        check, rc = timed(lambda: kernel_update(hosts, inv, options, KernelUpdateOptions(dry_run=True, state_dir=tmp)))
        assert rc.stopped is StopReason.PREVIEW and all(p.changes_host for p in rc.plan), [p.reason for p in rc.plan]
        full, rf = timed(lambda: kernel_update(hosts, inv, options, KernelUpdateOptions(
            allow_reboot=True, batch=quarter, max_failures=n, reboot_timeout=120, state_dir=tmp)))
        assert rf.exit_code == 0, [(o.host, o.status, o.detail) for o in rf.outcomes if not o.ok]
        lab.down(purge=True)
        lab.up(n)
        plain, proc = timed(
            lambda: subprocess.run(
                [str(venv_bin / "ansible-playbook"), "-i", inv, str(ROOT / "playbooks/kernel_update.yml"), "-f", str(n),
                 "-e", "kernel_update_batch=25%", "-e", "gpu_kernel_update_allow_reboot=true",
                 "-e", "gpu_kernel_update_reboot_timeout=120"],
                env=env, capture_output=True, text=True, check=False,
            )
        )
        assert proc.returncode == 0, proc.stdout[-2000:]
    finally:
        lab.down(purge=True)
    return {"kernel_audit_s": audit, "kernel_check_s": check, "kernel_update_s": full, "kernel_update_plain_s": plain}


def bench_harden(n: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-harden-"))
    lab = _lab(tmp)
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    inv = str(lab.cfg.inventory_path)
    options = AuditOptions(concurrency=n)
    try:
        lab.up(n)
        hosts = load(inv, "gpu")
        ping, _ = timed(
            lambda: subprocess.run(
                [str(venv_bin / "ansible"), "gpu", "-i", inv, "-m", "ansible.builtin.ping", "-f", str(n)],
                env=env, capture_output=True, check=True,
            )
        )
        first, r1 = timed(lambda: harden(hosts, inv, options, diff=False))
        assert r1.exit_code == 0 and len(r1.plan.to_change) == n, r1.not_converged
        again, r2 = timed(lambda: harden(hosts, inv, options, diff=False))
        assert r2.stopped == "nothing to do" and r2.exit_code == 0
        audit, _ = timed(lambda: run_audit(hosts, options))
        lab.down(purge=True)
        lab.up(n)
        plain, proc = timed(
            lambda: subprocess.run(
                [str(venv_bin / "ansible-playbook"), "-i", inv, str(ROOT / "playbooks/harden.yml"), "-f", str(n)],
                env=env, capture_output=True, text=True, check=False,
            )
        )
        assert proc.returncode == 0, proc.stdout[-2000:]
    finally:
        lab.down(purge=True)
    return {"harden_ping_s": ping, "harden_first_s": first, "harden_again_s": again, "harden_audit_s": audit,
            "harden_plain_s": plain}


if __name__ == "__main__":
    main()
