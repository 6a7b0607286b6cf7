"""Crash consistency of the rollout engine: ``kill -9`` of the controller at each phase of a batch of three.

A driver restore runs in a controller process of its own (``python -c``, the working tree's code and collection);
the test kills it with SIGKILL at one phase of its batch, found by polling the hosts' own files (or, before the
apply, the run's ``before_batch`` hook): no handler runs, no undo, no release. Then, as the next run would:

- the dead run's fleet lock and host leases are taken over (its pid is gone from this controller), not refused;
- a dry-run plan finds every host unchanged (no journal, or an undone one: the host as it was, planned again),
  finished (its journal says so) or left alone, blocked by its ``running`` journal with one line naming the undo
  command; no host differs from before in anything (package, hold, module, boot entry) its journal does not list;
- the undo command that line names brings every blocked host back to its state before the run.

Killed after the reboot request, the hosts come back running the restored driver while their journals still say
``running`` (the run died before it marked them): the next run has nothing to do there, and still leaves them alone
with the journal's line (the engine never reports a host with an unfinished journal as unchanged).

Phases: after the leases are taken (before the apply), mid-apply (DKMS hangs in the headers' hook), mid-undo (the
role's rescue undo hangs in its apt removal), after the reboot request (every host went down), mid-gate (every
journal says ``applied``: the health gate runs).

As on a real controller, SIGKILL does not stop what the playbook already started: ansible-runner's child ignores
SIGHUP, so the orphaned ``ansible-playbook`` finishes the task in flight (its host-side step too) and dies at its
next output (its terminal is gone). The checks run once the orphan is gone and the hosts answer; its step was
recorded in the journal before it began (write-ahead), so a host it changed is never without a record.

One 3-host lab (generic flavour, Secure Boot off) on 127.0.97.N, broken once (``kernel-upgrade``); each phase
leaves the hosts as they were (undone, rebooted where the restored module was loaded), or clears them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.host.audit import AuditOptions
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore
from remediation.rollout.journal import JOURNAL_PATH
from remediation.rollout.lock import fleet_lock, host_leases
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
HOSTS = ("gpu-1", "gpu-2", "gpu-3")
LEASE = "/var/lib/gpufleet/rollout.lease"
DKMS_HANGING = "/var/tmp/dkms-hanging"
DKMS_FAILED = "/var/tmp/dkms-failed"
UNDO_HANGING = "/var/tmp/undo-hanging"
APT_HOOK = "/etc/apt/apt.conf.d/99crash-undo-hangs"
HANG_S = 15  # how long a hanging step sleeps on the host before it goes on (then fails)
REBOOT_TIMEOUT = 30

# The controller: the driver restore on the lab's fleet, batch of three; ``before_batch`` marks the moment the
# leases are held and the apply has not begun (and, for that phase, holds the run there until it is killed).
_CONTROLLER = r"""
import sys, time
from pathlib import Path
from remediation.host.audit import AuditOptions
from remediation.transport.inventory import load
from remediation.restore.flow import RestoreHooks, RestoreOptions, driver_restore
from remediation.transport.runner import collections_first

root, inventory, state, marks = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
hold, reboot_timeout = sys.argv[5], int(sys.argv[6])

def before_batch(names):
    (marks / "batch").write_text(" ".join(names))
    if hold == "hold":
        time.sleep(600)

options = RestoreOptions(allow_reboot=True, reboot_timeout=reboot_timeout, apt_lock_timeout=10, state_dir=state,
                         batch=3, max_failures=3)
with collections_first([root / "collections"]):
    result = driver_restore(load(inventory, "gpu"), inventory, AuditOptions(nvml_timeout=5, timeout=30), options,
                            hooks=RestoreHooks(before_batch=before_batch))
print("ended:", result.stopped, result.stop_detail, flush=True)
for o in result.outcomes:
    print("  ", o.host, o.status, o.where, o.detail, flush=True)
"""


@dataclass
class Run:
    """One controller process and where its output goes."""

    proc: subprocess.Popen[bytes]
    log: Path
    marks: Path
    state: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("crash"), "127.0.97", 3, flavour="generic", secure_boot=False)
    try:
        yield lab
    finally:
        lab.down(purge=True)


@pytest.fixture(scope="module")
def baseline(fleet: Any) -> dict[str, Any]:
    """Every host broken once (S1: unattended-upgrades moved it to a kernel without the NVIDIA module): its state
    and the module it runs (none that NVML accepts)."""
    for h in HOSTS:
        inject(fleet, h, "kernel-upgrade")
    return {"state": {h: _state(fleet, h) for h in HOSTS}, "loaded": {h: _loaded(fleet, h) for h in HOSTS}}


@pytest.fixture
def before(fleet: Any, baseline: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every host broken as the module left it (no fault of a phase, no unfinished journal): the state before the
    run. A host that still runs the module an undone run built is rebooted; one that differs otherwise (a phase that
    failed half-way) is cleared and broken again."""
    _settle(fleet, [])
    for h in HOSTS:
        _unfault(fleet, h)
        if _state(fleet, h) != baseline["state"][h] or _journal_status(fleet, h) not in ("none", "undone"):
            fleet.clear(h)
            inject(fleet, h, "kernel-upgrade")
            baseline["state"][h], baseline["loaded"][h] = _state(fleet, h), _loaded(fleet, h)
        elif _loaded(fleet, h) != baseline["loaded"][h]:
            fleet.reboot(h, wait=True, timeout=120)
            assert _loaded(fleet, h) == baseline["loaded"][h], h
    return dict(baseline["state"])


def _loaded(lab: Any, host: str) -> str:
    """The NVIDIA module the host runs (the lab's record of it)."""
    path = lab.host_path(host, "/run/gpulab/module")
    return path.read_text().strip() if path.exists() else ""


def _out(lab: Any, host: str, command: str) -> str:
    proc = ssh(lab, host, command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


_STATE = {  # what a restore may touch on a host, one command each
    "packages": "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' | awk '$2 ~ /^i/ {print $1}' | sort",
    "held": "apt-mark showhold | sort",
    "grub_default": "grep ^GRUB_DEFAULT= /etc/default/grub",
    "grubenv": "grep -E '^(saved_entry|next_entry)=' /boot/grub/grubenv || true",
    "nvidia_modules": "find /lib/modules -name 'nvidia*.ko*' | sort",
}


def _state(lab: Any, host: str) -> dict[str, str]:
    """Packages with files, holds, the boot default and any one-shot, the NVIDIA modules on disk (one SSH call)."""
    text = _out(lab, host, "; echo '@@'; ".join(f"( {command} )" for command in _STATE.values()))
    parts = [part.strip() for part in text.split("@@")]
    assert len(parts) == len(_STATE), text[-2000:]
    return dict(zip(_STATE, parts, strict=True))


def _journal(lab: Any, host: str) -> dict[str, Any] | None:
    """The restore journal on ``host`` read from the controller's side (None: none, unreadable, host down)."""
    try:
        return dict(json.loads(lab.host_path(host, JOURNAL_PATH).read_text()))
    except Exception:  # the host is down: no init process to read it through
        return None


def _journal_status(lab: Any, host: str) -> str:
    return str((_journal(lab, host) or {"status": "none"}).get("status", "running"))


def _lease(lab: Any, host: str) -> dict[str, Any]:
    try:
        return dict(json.loads(lab.host_path(host, LEASE).read_text()))
    except Exception:  # none, unreadable, or the host is down (no init process to read it through)
        return {}


def _boot_id(lab: Any, host: str) -> str | None:
    try:
        return lab.boot_id(host)  # type: ignore[no-any-return]
    except Exception:  # down: no init process to read it from
        return None


# --- faults that hold a phase long enough to kill the controller there -------------------------------------------


def _dkms_hangs(lab: Any, host: str) -> None:
    """DKMS (called by the headers' postinst hook) touches DKMS_HANGING, sleeps, then fails: the apply hangs."""
    _wrap_dkms(lab, host, f"if [ ! -e {DKMS_HANGING} ]; then touch {DKMS_HANGING}; sleep {HANG_S}; fi")


def _undo_hangs(lab: Any, host: str) -> None:
    """DKMS fails at once, so the role's rescue undoes the run; the first apt run after that (the undo's removal of
    the headers) touches UNDO_HANGING and sleeps first (an apt hook)."""
    _wrap_dkms(lab, host, f"touch {DKMS_FAILED}")
    lab.host_path(host, APT_HOOK).write_text(
        f'DPkg::Pre-Invoke {{"if [ -e {DKMS_FAILED} ] && [ ! -e {UNDO_HANGING} ]; then touch {UNDO_HANGING};'
        f' sleep {HANG_S}; fi";}};\n'
    )


def _wrap_dkms(lab: Any, host: str, first: str) -> None:
    assert ssh(lab, host, "mv /usr/sbin/dkms /usr/sbin/dkms.real").returncode == 0
    wrapper = lab.host_path(host, "/usr/sbin/dkms")
    wrapper.write_text(
        f'#!/bin/sh\ncase "$1" in install|build|autoinstall)\n    {first}\n'
        "    echo 'Error! Bad return status for module build'; exit 10 ;;\nesac\n"
        'exec /usr/sbin/dkms.real "$@"\n'
    )
    wrapper.chmod(0o755)


def _unfault(lab: Any, host: str) -> None:
    proc = ssh(lab, host, f"if [ -e /usr/sbin/dkms.real ]; then mv -f /usr/sbin/dkms.real /usr/sbin/dkms; fi;"
                          f" rm -f {APT_HOOK} {DKMS_HANGING} {DKMS_FAILED} {UNDO_HANGING}")
    assert proc.returncode == 0, proc.stderr


# --- the controller, and its kill -------------------------------------------------------------------------------


def _start(lab: Any, tmp: Path, *, hold: bool = False) -> Run:
    marks = tmp / "marks"
    marks.mkdir()
    log = tmp / "controller.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CONTROLLER, str(ROOT), str(lab.cfg.inventory_path), str(tmp / "state"),
             str(marks), "hold" if hold else "go", str(REBOOT_TIMEOUT)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    return Run(proc, log, marks, tmp / "state")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        out[int(entry)] = (ppid, cmdline)
    return out


def _playbooks_of(pid: int) -> list[int]:
    """The ``ansible-playbook`` processes (and workers) below ``pid``."""
    procs = _processes()
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, cmdline) in procs.items():
            if ppid == parent:
                todo.append(child)
                if "ansible-playbook" in cmdline:
                    found.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_when(run: Run, phase: str, reached: Callable[[Run], bool], lab: Any,
               timeout: float = 300) -> tuple[str, list[int]]:
    """SIGKILL the controller once ``reached(run)``; returns its run id (read from its lease on gpu-1, taken before
    any phase) and its orphaned playbook processes."""
    deadline = time.monotonic() + timeout
    run_id = None
    while run_id is None or not reached(run):
        assert run.proc.poll() is None, f"the controller ended before {phase}:\n{run.output()}"
        assert time.monotonic() < deadline, f"{phase} not reached in {timeout:.0f} s:\n{run.output()}"
        if run_id is None and (lease := _lease(lab, "gpu-1")).get("pid") == run.proc.pid:
            run_id = str(lease["run_id"])
        time.sleep(0.2)
    orphans = _playbooks_of(run.proc.pid)
    assert run.proc.poll() is None, f"the controller ended at {phase}:\n{run.output()}"
    run.proc.send_signal(signal.SIGKILL)  # no handler, no undo, no release
    run.proc.wait(timeout=30)
    return run_id, orphans


def _settle(lab: Any, orphans: list[int], timeout: float = 240) -> None:
    """Wait for the dead run's orphaned playbook to end (the task it had in flight finishes first) and for every
    host to answer."""
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in orphans):
        assert time.monotonic() < deadline, f"the dead run's playbook is still running after {timeout:.0f} s"
        time.sleep(0.5)
    for h in HOSTS:
        while ssh(lab, h, "true", timeout=20).returncode != 0:
            assert time.monotonic() < deadline, f"{h} does not answer"
            time.sleep(1)


# --- the next run ------------------------------------------------------------------------------------------------


def _next_run_takes_over(lab: Any, run: Run, dead: str) -> None:
    """The dead run's fleet lock and host leases: taken over (its pid is gone from this controller), not refused."""
    stale: list[str] = []
    with fleet_lock(run.state, "gpu", ["gpu-1"], on_stale=lambda info, why: stale.append(why)):
        pass
    assert stale and f"pid {run.proc.pid} is not running" in stale[0], stale
    inventory = lab.cfg.inventory_path
    with host_leases(load(inventory, "gpu"), run_id="the-next-run", fleet="gpu", change="driver-restore") as leases:
        assert sorted(leases.held) == list(HOSTS), leases
        assert sorted(leases.took_over) == list(HOSTS), leases
        assert {s.get("run_id") for s in leases.took_over.values()} == {dead}, leases.took_over
    assert not any(_lease(lab, h) for h in HOSTS)  # released at the end of the block


def _plan_finds_no_host_changed_without_record(lab: Any, tmp: Path, before: dict[str, Any], dead: str,
                                               expected: frozenset[str]) -> Any:
    """The next run's dry-run plan (returned): each host unchanged, finished, or blocked by its journal in one line
    naming the undo; no host differs from ``before`` without a journal of the dead run."""
    inventory = lab.cfg.inventory_path
    plan = driver_restore(load(inventory, "gpu"), inventory, AUDIT,
                          RestoreOptions(dry_run=True, state_dir=tmp / "next", batch=3, allow_reboot=True))
    for host in HOSTS:
        o, journal, state = plan.outcome(host), _journal(lab, host), _state(lab, host)
        status = (journal or {"status": "none"}).get("status", "running")
        assert status in expected, (host, status, journal)
        if journal is not None:
            assert journal["run_id"] == dead, (host, journal)
            assert _unrecorded(journal, before[host], state) == [], (host, journal, state, before[host])
        if status in ("none", "undone"):  # unchanged: as before, planned again
            assert state == before[host], (host, status, state, before[host])
            assert o.status is HostStatus.PLANNED, (host, o)
        elif status == "running":  # blocked by its journal: one line naming it and the undo
            assert o.status is HostStatus.LEFT_ALONE, (host, o, state)
            assert "\n" not in o.detail and JOURNAL_PATH in o.detail and dead in o.detail, o.detail
            assert "nvidia_driver_restore_operation=undo" in o.detail and f"--limit {host}" in o.detail, o.detail
        else:  # finished: the journal says so, the host is restored
            assert status == "applied", (host, status)
            assert o.status is HostStatus.HEALTHY, (host, o)
    return plan


def _unrecorded(journal: dict[str, Any], before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs on a host from ``before`` that its journal does not list (packages, holds, modules, boot)."""
    changes = journal.get("changes") or []
    listed = {p for c in changes for p in c.get("packages") or []}
    built = tuple(str(c["path"]) for c in changes if c.get("kind") == "module_built" and c.get("path"))
    kinds = {c.get("kind") for c in changes}

    def diff(key: str) -> set[str]:
        return set(after[key].split()) ^ set(before[key].split())

    out = [f"package {p}" for p in sorted(diff("packages") - listed)]
    out += [f"hold {p}" for p in sorted(diff("held") - listed)]
    out += [f"module {m}" for m in sorted(diff("nvidia_modules")) if not m.startswith(built)]
    if after["grub_default"] != before["grub_default"] and "grub_default" not in kinds:
        out.append(after["grub_default"])
    if after["grubenv"] != before["grubenv"] and "kernel_default" not in kinds:
        out.append(after["grubenv"])
    return out


def _undo_as_the_line_says(lab: Any, plan: Any, hosts: list[str], before: dict[str, Any]) -> None:
    """Run the undo command the plan's line names (one run for all these hosts: the same run id) and check each is
    as before the dead run, its journal undone."""
    commands = {h: re.search(r"`(ansible-playbook [^`]+)`", plan.outcome(h).detail) for h in hosts}
    assert all(commands.values()), {h: plan.outcome(h).detail for h in hosts}
    argv = shlex.split(commands[hosts[0]].group(1))  # type: ignore[union-attr]
    limit = argv.index("--limit") + 1
    for h in hosts:
        assert shlex.split(commands[h].group(1)) == [*argv[:limit], h, *argv[limit + 1:]], commands  # type: ignore[union-attr]
    argv[limit] = ",".join(hosts)
    done = subprocess.run([str(ROOT / ".venv/bin" / argv[0]), *argv[1:]], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:]
    for h in hosts:
        assert _journal_status(lab, h) == "undone", (h, _journal(lab, h))
        assert _state(lab, h) == before[h], h


# --- the phases --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """Where in the batch the controller is killed: the fault that holds the batch there, the sign (on the hosts,
    or the controller's ``before_batch`` hook) that it is there, and the journal states the hosts may be left in."""

    name: str
    reached: Callable[[Any, Run, dict[str, str | None]], bool]  # (lab, run, boot ids before the run)
    left: frozenset[str]
    fault: Callable[[Any, str], None] | None = None
    hold: bool = False  # the controller waits in before_batch until it is killed
    applying: bool | None = True  # the playbook runs when the controller is killed (None: it may have ended)


def _on_every_host(test: Callable[[Any, str], bool]) -> Callable[[Any, Run, dict[str, str | None]], bool]:
    return lambda lab, _run, _boots: all(test(lab, h) for h in HOSTS)


PHASES = [
    Phase("after-lease", lambda lab, run, _boots: (run.marks / "batch").exists() and all(
        _lease(lab, h).get("pid") == run.proc.pid for h in HOSTS), frozenset({"none"}), hold=True, applying=False),
    Phase("mid-apply", _on_every_host(lambda lab, h: lab.host_path(h, DKMS_HANGING).exists()),
          frozenset({"running", "undone"}), fault=_dkms_hangs),
    Phase("mid-undo", _on_every_host(lambda lab, h: lab.host_path(h, UNDO_HANGING).exists()),
          frozenset({"running", "undone"}), fault=_undo_hangs),
    Phase("after-reboot-request", lambda lab, _run, boots: all(_boot_id(lab, h) != boots[h] for h in HOSTS),
          frozenset({"running", "applied"})),
    Phase("mid-gate", _on_every_host(lambda lab, h: _journal_status(lab, h) == "applied"), frozenset({"applied"}),
          applying=None),
]


@pytest.mark.parametrize("phase", PHASES, ids=[p.name for p in PHASES])
def test_a_controller_killed_at_a_phase_of_the_batch_leaves_no_host_changed_without_a_record(
    fleet: Any, tmp_path: Path, before: dict[str, Any], phase: Phase
) -> None:
    boots = {h: _boot_id(fleet, h) for h in HOSTS}
    if phase.fault is not None:
        for h in HOSTS:
            phase.fault(fleet, h)
    run = _start(fleet, tmp_path, hold=phase.hold)
    try:
        dead, orphans = _kill_when(run, phase.name, lambda r: phase.reached(fleet, r, boots), fleet)
    finally:
        if run.proc.poll() is None:  # the phase was not reached: stop that run before the next test's hosts
            left = _playbooks_of(run.proc.pid)
            run.proc.kill()
            run.proc.wait(timeout=30)
            _settle(fleet, left)
    assert phase.applying is None or bool(orphans) is phase.applying, (orphans, run.output())
    _settle(fleet, orphans)
    for h in HOSTS:
        _unfault(fleet, h)
    _next_run_takes_over(fleet, run, dead)
    plan = _plan_finds_no_host_changed_without_record(fleet, tmp_path, before, dead, phase.left)
    blocked = [h for h in HOSTS if plan.outcome(h).status is HostStatus.LEFT_ALONE]
    if blocked:
        _undo_as_the_line_says(fleet, plan, blocked, before)
