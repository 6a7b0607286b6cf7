"""Benchmark: the closed loop (``invoke remediate --yes``) against the same faults fixed by hand with the existing
tasks, on 30 lab hosts with 6 faults of different kinds (issue 26's figures).

    .venv/bin/python bench/remediate.py [--hosts 30] [--runs 3] [--part loop|hand|both] [--smoke]

``--smoke`` (tests/bench/test_bench_smoke.py, so the bench never rots): the loop alone on 8 hosts (the fewest the
fleet allows), the same goals; its seconds mean nothing.

The fleet, built the same way for each part (fresh hosts each time, as ``bench/harden.py`` builds its lab): N generic
lab hosts, **hardened first** (every host but the two that are meant to stay unhardened): a fresh lab host has the
three harden findings (GPU-KRN-002/003/004, ``auto`` by default), so an unhardened fleet would give the loop N
fixable hosts: the figures would measure ``harden`` on N hosts, not the loop, and would hide what is measured here,
that the loop touches only the hosts that have something to fix. The hardening and the faults are
set up before the clock starts; then one warm-up audit (what the schedule's previous audit left: a host that has been
audited once has the audit's own traces, e.g. sudo's lecture marker, a compiled pynvml). On six distinct hosts,
spread over the fleet, one fault each:

=====================  ==========================================================  ===========================
host                   fault (``lab.faults``)                                      expected
=====================  ==========================================================  ===========================
kernel-upgrade         unattended-upgrades installed a new kernel, host rebooted:  fixed: driver restore with
                       the booted kernel has no NVIDIA module (GPU-DRV-001)        a reboot (the window allows)
unhardened             left out of the hardening: GPU-KRN-002/003/004              fixed: ``harden``
apt-lock               unhardened, and a process holds the dpkg lock (GPU-APT-001)  blocked (transient), untouched
gpu-job                driver-mismatch (GPU-DRV-002, a reboot) with a training job  blocked (protected work),
                       holding /dev/nvidia0                                        untouched, not rebooted
xid-79                 a GPU fell off the bus (GPU-HW-001)                         escalated, untouched
ecc                    uncorrected ECC errors, a row pending remap (GPU-HW-003/4/5) escalated, untouched
=====================  ==========================================================  ===========================

The policy (``remediate.policy.gpu``): the defaults, plus ``GPU-DRV-002: auto`` (so that the job is what stops its
reboot, not the level), and a maintenance window open now (every day, from an hour ago to three hours on, UTC): the
reboots the policy allows are those of the hosts whose ``auto`` decision ends in a reboot and that the loop acted on.
No IMDS endpoint (Scheduled Events not asked: not Azure), no webhook (packets only), no Alertmanager; the other
guards at their defaults (at most 1 host in flight, the breaker at 50 %; four hosts have a critical finding, which is
why ``--hosts`` is at least 8), the gate under load at its default (5 s on the lab NVML's load hook).

Part A, the loop: ``remediation.remediate.api.act`` with ``--yes`` semantics (``confirm=None``), run again as a
schedule would while the previous run fixed something, at most ``--runs`` times. After each run a fresh audit (not
timed) says whether every fixable host is healthy (probed, NVML answers, no warning or critical finding). Figures:
the loop's wall time until the run after which they were (the sum of the runs' times; the interval between two
scheduled runs is not in it); hosts touched that had nothing to fix, from the outcomes (acted on) and independently
from the hosts (a file of the host's overlay upper directory added, changed or removed, or a new boot id, other than
the audit's own read traces); reboots (boot id changes, and the lab supervisor's boot count) against those the
policy allowed; the escalations (which must be exactly the hardware hosts).

Part B, by hand, on fresh hosts with the same faults, what an engineer does with the existing tasks' functions:
``run_audit`` on the fleet, ``harden`` on the hosts with a harden finding, ``driver_restore`` on the hosts with a
finding the driver restore fixes (``allow_reboot`` as the loop's policy allowed: the window is open), then a re-audit.
Its time is machine time only: the person's reading of the audit between the steps is not in it.

Goals (exit 1 when the loop misses one): every fixable host healthy; no host that had nothing to fix touched (by
either measure), nor any of the four hosts the loop must leave alone; reboots only on the hosts the policy allowed,
no more than it allowed; the escalated hosts exactly the hardware ones. Part B's figures are printed for comparison.
Not a test: figures go into the README.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.config import LabConfig, test_prefix  # noqa: E402
from lab.control import Lab  # noqa: E402
from lab.faults import inject  # noqa: E402
from remediation.config import RemediateSettings  # noqa: E402
from remediation.host.audit import AuditOptions, AuditResult, run_audit  # noqa: E402
from remediation.host.harden import REMEDIES, harden  # noqa: E402
from remediation.remediate import api as remediate  # noqa: E402
from remediation.remediate.policy import ACTIONS, Action  # noqa: E402
from remediation.restore.flow import HostStatus as RestoreStatus  # noqa: E402
from remediation.restore.flow import RestoreOptions, driver_restore  # noqa: E402
from remediation.transport.inventory import Host, load  # noqa: E402
from remediation.transport.runner import collections_first  # noqa: E402

T = TypeVar("T")

#: The six faults, in the order of the hosts they go to (spread over the fleet).
KINDS = ("kernel-upgrade", "unhardened", "apt-lock", "gpu-job", "xid-79", "ecc")
FIXABLE = ("kernel-upgrade", "unhardened")  # what the loop can fix now
HARDWARE = ("xid-79", "ecc")  # escalated, never acted on
#: Files a read-only audit leaves on a host the first time (opening dpkg's locks to test them creates the files,
#: sudo's lecture marker, the host's Python caching pynvml's bytecode): not a change made to the host.
READ_TRACES = ("home/azureuser/.sudo_as_admin_successful", "var/lib/dpkg/lock", "var/lib/dpkg/lock-frontend")
#: The findings the driver restore fixes (its own rules), and harden's.
DRIVER_FINDINGS = frozenset(i for i, s in ACTIONS.items() if s.action in (Action.DRIVER_RESTORE, Action.REBOOT))
HARDEN_FINDINGS = frozenset(REMEDIES)
REBOOT_TIMEOUT = 120  # a lab host boots in about a second; every wait stays bounded


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


@dataclass(frozen=True)
class HostSnap:
    boot_id: str | None
    boots: int
    files: Mapping[str, tuple[int, int]]  # path in the overlay's upper dir -> (size, mtime ns)


@dataclass
class Figures:
    name: str
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)
    fixable_healthy: list[str] = field(default_factory=list)
    acted_on: set[str] = field(default_factory=set)  # what the tool says it changed
    changed: dict[str, list[str]] = field(default_factory=dict)  # host -> what changed on it (the hosts' view)
    reboots: dict[str, int] = field(default_factory=dict)  # host -> new boot ids
    allowed_reboots: set[str] = field(default_factory=set)
    escalated: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Fleet:
    lab: Lab
    hosts: list[Host]
    inventory: str
    faults: dict[str, str]  # kind -> host
    tmp: Path

    @property
    def faulty(self) -> set[str]:
        return set(self.faults.values())

    @property
    def healthy(self) -> list[str]:
        return [h.name for h in self.hosts if h.name not in self.faulty]

    def kind(self, *kinds: str) -> list[str]:
        return [self.faults[k] for k in kinds]


def _lab(tmp: Path) -> Lab:
    settings = {
        "state_dir": str(tmp / "state"),
        "address_prefix": test_prefix("127.0.63"),
        "inventory_path": str(tmp / "hosts.yml"),
        "flavour": "generic",
    }
    if not os.environ.get("GPULAB_CACHE_DIR"):
        settings["cache_dir"] = str(ROOT / ".lab/cache")
    return Lab(LabConfig.from_mapping(settings, root=ROOT))


def fault_hosts(n: int) -> dict[str, str]:
    """The six faults on six hosts spread evenly over gpu-1 .. gpu-n."""
    return {kind: f"gpu-{1 + k * n // len(KINDS)}" for k, kind in enumerate(KINDS)}


def build_fleet(n: int, options: AuditOptions) -> Fleet:
    """Fresh hosts, hardened but for two, and the six faults (not timed)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-remediate-"))
    lab = _lab(tmp)
    inv = str(lab.cfg.inventory_path)
    faults = fault_hosts(n)
    try:
        lab.up(n)
        # before the hardening, which would stop them (it holds the kernel and the driver packages)
        inject(lab, faults["kernel-upgrade"], "kernel-upgrade")
        inject(lab, faults["gpu-job"], "driver-mismatch")
        hosts = load(inv, "gpu")
        left = {faults["unhardened"], faults["apt-lock"]}
        r = harden([h for h in hosts if h.name not in left], inv, options, diff=False)
        assert not r.not_converged, f"setup: harden did not converge on {r.not_converged}"
        inject(lab, faults["apt-lock"], "apt-lock")
        inject(lab, faults["gpu-job"], "gpu-job")
        inject(lab, faults["xid-79"], "xid-79")
        inject(lab, faults["ecc"], "ecc")
        run_audit(hosts, options)  # the schedule's previous audit: its read traces are not the loop's changes
    except BaseException:
        lab.down(purge=True)
        raise
    return Fleet(lab, hosts, inv, faults, tmp)


def snapshot(lab: Lab, names: Sequence[str]) -> dict[str, HostSnap]:
    """Per host: its boot id, the supervisor's boot count and every file of its overlay's upper directory (what the
    host has changed from the base image, whoever changed it)."""
    status = {s.name: s for s in lab.status()}
    out = {}
    for name in names:
        upper = lab.paths.host(name) / "upper"
        files: dict[str, tuple[int, int]] = {}
        for d, _dirs, fs in os.walk(upper):
            for f in fs:
                p = os.path.join(d, f)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                files[os.path.relpath(p, upper)] = (st.st_size, st.st_mtime_ns)
        out[name] = HostSnap(status[name].boot_id, status[name].boots, files)
    return out


def compare(before: Mapping[str, HostSnap], after: Mapping[str, HostSnap], fig: Figures) -> None:
    """What changed on each host (files of the upper dir, the boot), and the reboots (boot id changes)."""
    for name, b in before.items():
        a = after[name]
        paths = sorted(p for p in set(b.files) | set(a.files)
                       if b.files.get(p) != a.files.get(p) and p not in READ_TRACES and "/__pycache__/" not in p)
        booted = a.boot_id != b.boot_id or a.boots != b.boots
        if booted:
            fig.reboots[name] = max(a.boots - b.boots, 1)
            paths.insert(0, f"boot id {b.boot_id} -> {a.boot_id} (boots {b.boots} -> {a.boots})")
        if paths:
            fig.changed[name] = paths


def fixable_healthy(fleet: Fleet, audit: AuditResult) -> list[str]:
    return [h for h in fleet.kind(*FIXABLE) if audit.host(h).healthy]


def settings(state: Path) -> RemediateSettings:
    """The loop's settings: defaults, ``GPU-DRV-002: auto`` and a maintenance window open now (UTC)."""
    now = _dt.datetime.now(_dt.UTC)
    start, end = now - _dt.timedelta(hours=1), now + _dt.timedelta(hours=3)
    window = {"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "start": start.strftime("%H:%M"),
              "end": end.strftime("%H:%M"), "zone": "UTC"}
    policy = {"gpu": {"levels": {"GPU-DRV-002": "auto"}, "windows": [window]}}
    return RemediateSettings(state_dir=str(state), imds_endpoint="", webhook_url="", policy=policy)


def bench_loop(n: int, runs: int, options: AuditOptions) -> Figures:
    from remediation.remediate.act import HostStatus

    fleet = build_fleet(n, options)
    fig = Figures("loop")
    try:
        names = [h.name for h in fleet.hosts]
        state = fleet.tmp / "remediate-state"
        cfg = settings(state)
        restore = RestoreOptions(state_dir=fleet.tmp / "restore", reboot_timeout=REBOOT_TIMEOUT)
        before = snapshot(fleet.lab, names)
        healthy_at: float | None = None
        for i in range(1, runs + 1):
            secs, result = timed(lambda: remediate.act(
                fleet.hosts, fleet.inventory, options, cfg, fleet="gpu", state_dir=state, restore_options=restore,
                fleet_size=len(fleet.hosts), confirm=None))
            fig.seconds += secs
            out = result.outcomes
            by = {s: sorted(h for h, o in out.items() if o.status is s) for s in HostStatus}
            plans = {h.host: h for h in result.plan.hosts}
            acted = {h for h, o in out.items() if o.status in (HostStatus.FIXED, HostStatus.FAILED)}
            fig.acted_on |= acted
            fig.allowed_reboots |= {h for h in acted if any(d.reboot for d in plans[h].auto)}
            fig.escalated |= {e.host for e in result.escalations}
            check = run_audit(fleet.hosts, options)  # not timed: the benchmark's own look
            fig.fixable_healthy = fixable_healthy(fleet, check)
            done = len(fig.fixable_healthy) == len(FIXABLE)
            if done and healthy_at is None:
                healthy_at = fig.seconds
            summary = ", ".join(f"{s.value} {len(v)}" for s, v in by.items() if v)
            why = {h: out[h].why for h in fleet.kind("apt-lock", "gpu-job") if h in out}
            fig.steps.append(f"run {i}: {secs:.1f} s, exit {result.exit_code}, {summary}"
                             + (f"; halted: {result.halted}" if result.halted else "")
                             + (f"; fixed: {', '.join(by[HostStatus.FIXED])}" if by[HostStatus.FIXED] else "")
                             + "".join(f"; {h}: {w[:110]}" for h, w in why.items()))
            if not by[HostStatus.FIXED] and not by[HostStatus.FAILED]:
                break  # the schedule's run changed nothing: nothing fixable left for it
        compare(before, snapshot(fleet.lab, names), fig)
        fig.seconds = healthy_at if healthy_at is not None else fig.seconds
    finally:
        fleet.lab.down(purge=True)
    fig.name = f"loop ({len(fig.steps)} runs)"
    return fig


def bench_hand(n: int, options: AuditOptions) -> Figures:
    fleet = build_fleet(n, options)
    fig = Figures("by hand")
    try:
        names = [h.name for h in fleet.hosts]
        by_name = {h.name: h for h in fleet.hosts}
        before = snapshot(fleet.lab, names)
        t0 = time.monotonic()
        secs, audit = timed(lambda: run_audit(fleet.hosts, options))
        fig.steps.append(f"audit: {secs:.1f} s")
        to_harden = [h.host for h in audit.hosts if any(f.id in HARDEN_FINDINGS for f in h.findings)]
        to_restore = [h.host for h in audit.hosts if any(f.id in DRIVER_FINDINGS for f in h.findings)]
        if to_harden:
            secs, hr = timed(lambda: harden([by_name[h] for h in to_harden], fleet.inventory, options, diff=False))
            fig.acted_on |= set(hr.plan.to_change)  # blocked hosts are not in it
            fig.steps.append(f"harden {','.join(to_harden)}: {secs:.1f} s, exit {int(hr.exit_code)}, "
                             f"changed {','.join(hr.plan.to_change)}; blocked: "
                             + "; ".join(f"{b.host}: {(b.blocked or '')[:80]}" for b in hr.plan.blocked))
        if to_restore:
            opts = RestoreOptions(allow_reboot=True, state_dir=fleet.tmp / "restore", reboot_timeout=REBOOT_TIMEOUT)
            secs, rr = timed(lambda: driver_restore([by_name[h] for h in to_restore], fleet.inventory, options, opts))
            outcomes = {h: rr.outcome(h) for h in to_restore}
            changed = {h for h, o in outcomes.items()
                       if o.status in (RestoreStatus.RESTORED, RestoreStatus.REBOOT_REQUIRED, RestoreStatus.FAILED)}
            fig.acted_on |= changed
            fig.allowed_reboots |= changed  # allow_reboot as the policy's open window allowed
            fig.steps.append(f"driver-restore {','.join(to_restore)}: {secs:.1f} s; "
                             + "; ".join(f"{h}: {o.status.value} {(o.where or o.decision.blocked or '')[:100]}"
                                         for h, o in outcomes.items()))
        secs, again = timed(lambda: run_audit(fleet.hosts, options))
        fig.steps.append(f"re-audit: {secs:.1f} s")
        fig.seconds = time.monotonic() - t0
        fig.fixable_healthy = fixable_healthy(fleet, again)
        fig.escalated = {h.host for h in again.hosts if any(f.id.startswith("GPU-HW-") for f in h.findings)}
        compare(before, snapshot(fleet.lab, names), fig)
    finally:
        fleet.lab.down(purge=True)
    return fig


def goals(fig: Figures, faults: Mapping[str, str]) -> list[str]:
    """The goals the loop must meet; each missed one as a line."""
    healthy = {h for h in fig.changed if h not in faults.values()}
    acted_healthy = {h for h in fig.acted_on if h not in faults.values()}
    leave_alone = {faults[k] for k in KINDS if k not in FIXABLE}
    missed = []
    if len(fig.fixable_healthy) != len(FIXABLE):
        missed.append(f"fixable hosts healthy: {', '.join(fig.fixable_healthy) or 'none'} of "
                      f"{', '.join(faults[k] for k in FIXABLE)}")
    if healthy or acted_healthy:
        missed.append(f"hosts with nothing to fix touched: acted on {sorted(acted_healthy)}, changed "
                      + "; ".join(f"{h}: {', '.join(fig.changed[h][:4])}" for h in sorted(healthy)))
    left = leave_alone & (set(fig.changed) | fig.acted_on)
    if left:
        missed.append("hosts to leave alone changed: "
                      + "; ".join(f"{h}: {', '.join(fig.changed.get(h, ['acted on'])[:4])}" for h in sorted(left)))
    extra = set(fig.reboots) - fig.allowed_reboots
    if extra or sum(fig.reboots.values()) > len(fig.allowed_reboots):
        missed.append(f"reboots beyond the policy's: {dict(sorted(fig.reboots.items()))}, allowed "
                      f"{sorted(fig.allowed_reboots)}")
    hardware = {faults[k] for k in HARDWARE}
    if fig.escalated != hardware:
        missed.append(f"escalated {sorted(fig.escalated)}, the hardware hosts are {sorted(hardware)}")
    return missed


def report(n: int, faults: Mapping[str, str], figs: Sequence[Figures]) -> None:
    nothing = n - len(faults)
    print("\nfaults: " + ", ".join(f"{h} {k}" for k, h in faults.items()))
    for f in figs:
        print(f"\n{f.name}:")
        for s in f.steps:
            print(f"  {s}")
        for h in sorted(f.changed):
            print(f"  changed on {h}: {'; '.join(f.changed[h][:6])}" + (" ..." if len(f.changed[h]) > 6 else ""))
    print()
    print("| hosts | side | time to every fixable host healthy | fixable hosts healthy | hosts touched that had "
          "nothing to fix (acted on / changed on the host) | faulted hosts to leave alone changed | reboots "
          "(boot id changes) / allowed | escalated (hardware hosts) |")
    print("|---|---|---|---|---|---|---|---|")
    leave_alone = {faults[k] for k in KINDS if k not in FIXABLE}
    for f in figs:
        acted = len({h for h in f.acted_on if h not in faults.values()})
        changed = len({h for h in f.changed if h not in faults.values()})
        alone = len(leave_alone & (set(f.changed) | f.acted_on))
        print(f"| {n} | {f.name} | {f.seconds:.1f} s | {len(f.fixable_healthy)}/{len(FIXABLE)} | "
              f"{acted} / {changed} of {nothing} | {alone} of {len(leave_alone)} | {sum(f.reboots.values())} / "
              f"{len(f.allowed_reboots)} | {len(f.escalated)} ({', '.join(sorted(f.escalated))}) |")
    if len(figs) == 2 and figs[1].seconds:
        print(f"\nloop / by hand: {figs[0].seconds / figs[1].seconds:.2f}x (by hand: machine time only, "
              "a person's reading between the steps not included)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3, help="scheduled runs of the loop at most")
    ap.add_argument("--part", choices=("loop", "hand", "both"), default="both")
    ap.add_argument("--smoke", action="store_true", help="the loop alone on 8 hosts (that the bench still runs)")
    args = ap.parse_args()
    if args.smoke:
        args.hosts, args.part = 8, "loop"
    if args.hosts < 8:
        ap.error("--hosts must be at least 8: six faulted hosts, and four critical ones must stay within the "
                 "breaker's 50 %")
    # every probe bounded: NVML calls 5 s, the whole probe 60 s per host
    options = AuditOptions(concurrency=args.hosts, nvml_timeout=5.0, timeout=60.0)
    figs: list[Figures] = []
    with collections_first([ROOT / "collections"]):  # the working tree's playbooks, as `invoke` here runs them
        if args.part in ("loop", "both"):
            figs.append(bench_loop(args.hosts, args.runs, options))
        if args.part in ("hand", "both"):
            figs.append(bench_hand(args.hosts, options))
    faults = fault_hosts(args.hosts)
    report(args.hosts, faults, figs)
    missed = goals(figs[0], faults) if args.part in ("loop", "both") else []
    for line in missed:
        print(f"GOAL MISSED: {line}")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
