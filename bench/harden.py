"""Benchmark: `harden` on 30 lab hosts, against the floor (`ansible all -m ping`) and a plain ansible-playbook run.

    .venv/bin/python bench/harden.py [--hosts 30]

In one run, on fresh hosts each time:
1. ``ansible all -m ping`` (the floor: what any Ansible contact with the fleet costs);
2. ``harden`` (audit, plan, apply through ansible-runner, re-audit) on all-unhardened hosts;
3. ``harden`` again with nothing to change (must not pay for Ansible: audit only);
4. the same roles as a plain ``ansible-playbook playbooks/harden.yml`` run on fresh unhardened hosts;
5. the audit alone, for the ratio of 3. to it.
Targets: 3. <= 1.5x 5.; 2. <= 4. Not a test: figures go into the README.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.config import LabConfig, test_prefix  # noqa: E402
from lab.control import Lab  # noqa: E402
from remediation.audit import AuditOptions, run_audit  # noqa: E402
from remediation.harden import harden  # noqa: E402
from remediation.inventory import load  # noqa: E402


def timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=30)
    args = ap.parse_args()
    n = args.hosts
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-harden-"))
    settings = {
        "state_dir": str(tmp / "state"),
        "address_prefix": test_prefix("127.0.61"),
        "inventory_path": str(tmp / "hosts.yml"),
        "flavour": "generic",
    }
    if not os.environ.get("GPULAB_CACHE_DIR"):
        settings["cache_dir"] = str(ROOT / ".lab/cache")
    lab = Lab(LabConfig.from_mapping(settings, root=ROOT))
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
    print("| hosts | ansible -m ping | harden (first) | harden (no change) | audit | plain ansible-playbook |")
    print("|---|---|---|---|---|---|")
    print(f"| {n} | {ping:.1f} s | {first:.1f} s | {again:.1f} s | {audit:.1f} s | {plain:.1f} s |")
    print(f"\nno-change harden / audit: {again / audit:.2f}x (target <= 1.5x)")
    print(f"first harden / plain ansible-playbook: {first / plain:.2f}x (target <= 1.0x)")


if __name__ == "__main__":
    main()
