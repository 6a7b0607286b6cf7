"""Change screens, undo records and locks on lab hosts (issue 20, items 4, 6, 7).

- host text with Rich markup in it (a cordon marker, DKMS's output) prints as itself on the real CLI's screen and
  the incident report is written;
- a journal a previous run left ``running`` keeps the next restore off the host (the flow's plan and the role both
  refuse it, with one line naming the journal and the undo command) and the host is unchanged; that command works;
- a host that could not be leased (unreachable when the leases were taken) is never changed later in the run.

One 3-host lab for the module (127.0.91.N).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.host.audit import AuditOptions
from remediation.restore.flow import HostStatus, RestoreOptions, driver_restore
from remediation.restore.rules import Action
from remediation.rollout.journal import JOURNAL_PATH, JOURNAL_SCHEMA
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab
AUDIT = AuditOptions(nvml_timeout=5, timeout=30)
MARKER = "maintenance by ops [/] see ticket [bold]x"
DKMS_SAYS = "Error! [/] bad [bold]return[/bold] status [red]"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("rollout"), "127.0.91", 3)
    try:
        yield lab
    finally:
        lab.down(purge=True)


def _dpkg(lab: Any, host: str) -> str:
    return str(lab.host_path(host, "/var/lib/dpkg/status").read_text())


def _flat(text: str) -> str:
    """Screen text without table borders and line breaks (a long cell wraps)."""
    return re.sub(r"\s+", " ", re.sub(r"[│┃|]", " ", text))


def test_host_markup_prints_literally_on_the_screen_and_the_report_is_written(fleet: Any, tmp_path: Path) -> None:
    for host in ("gpu-1", "gpu-2"):
        inject(fleet, host, "kernel-upgrade")
    try:
        marker = fleet.host_path("gpu-1", "/etc/gpufleet/cordoned")
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(MARKER + "\n")
        assert ssh(fleet, "gpu-2", "mv /usr/sbin/dkms /usr/sbin/dkms.real").returncode == 0
        wrapper = fleet.host_path("gpu-2", "/usr/sbin/dkms")
        wrapper.write_text(
            '#!/bin/sh\ncase "$1" in install|build|autoinstall)\n'
            f"    echo {shlex.quote(DKMS_SAYS)}; echo {shlex.quote(DKMS_SAYS)} >&2; exit 10 ;;\n"
            'esac\nexec /usr/sbin/dkms.real "$@"\n'
        )
        wrapper.chmod(0o755)
        report = tmp_path / "report.md"
        r = subprocess.run(
            [sys.executable, "-m", "invoke", "driver-restore", "--inventory", str(fleet.cfg.inventory_path),
             "--limit", "gpu-1,gpu-2", "--yes", "--allow-reboot", "--reboot-timeout", "15", "--report", str(report)],
            capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
            env={**os.environ, "INVOKE_DRIVER_RESTORE_STATE_DIR": str(tmp_path)},
        )
        screen = _flat(r.stdout)
        assert r.returncode == 1, r.stdout[-3000:] + r.stderr
        assert "MarkupError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert MARKER in screen, r.stdout  # the plan and the before/after table: the cordon marker as it is
        assert "Error! [/] bad [bold]return[/bold] status" in screen, r.stdout  # host output as it is
        assert f"incident report: {report}" in r.stdout
        text = report.read_text()
        assert "## gpu-2" in text and "## gpu-1" in text
    finally:
        ssh(fleet, "gpu-2", "test -e /usr/sbin/dkms.real && mv /usr/sbin/dkms.real /usr/sbin/dkms")
        for host in ("gpu-1", "gpu-2"):
            fleet.clear(host)


def _running_journal(lab: Any, host: str) -> str:
    doc = {"schema": JOURNAL_SCHEMA, "run_id": "20261204T000000Z-dead01", "host": host, "action": "rebuild",
           "started_at": "2026-12-04T00:00:00Z", "changes": [], "undone": [], "status": "running"}
    path = lab.host_path(host, JOURNAL_PATH)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2) + "\n"
    path.write_text(text)
    return text


def test_a_running_journal_blocks_the_next_restore_and_its_undo_command_works(fleet: Any, tmp_path: Path) -> None:
    host = "gpu-3"
    inject(fleet, host, "kernel-upgrade")
    try:
        journal = _running_journal(fleet, host)
        dpkg, boot = _dpkg(fleet, host), fleet.boot_id(host)
        inv = fleet.cfg.inventory_path
        result = driver_restore(load(inv, "gpu", host), inv, AUDIT, RestoreOptions(
            allow_reboot=True, reboot_timeout=15, apt_lock_timeout=3, state_dir=tmp_path))
        o = result.outcome(host)
        assert o.status is HostStatus.LEFT_ALONE and o.decision.action is Action.REBUILD, o
        assert result.exit_code == 1 and result.stopped == "nothing to do"
        assert "\n" not in o.detail and JOURNAL_PATH in o.detail and "still 'running'" in o.detail
        undo = re.search(r"`(ansible-playbook [^`]+)`", o.detail)
        assert undo is not None and "nvidia_driver_restore_operation=undo" in undo.group(1), o.detail
        assert _dpkg(fleet, host) == dpkg and fleet.boot_id(host) == boot
        assert fleet.host_path(host, JOURNAL_PATH).read_text() == journal  # kept, not overwritten

        # The role refuses it too (someone running the playbook by hand): the host fails, nothing changes.
        play = subprocess.run(
            [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inv), "playbooks/driver_restore.yml", "--limit",
             host, "-e", "nvidia_driver_restore_allow_reboot=true"],
            capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
        )
        assert play.returncode != 0, play.stdout[-3000:]
        assert "still 'running'" in play.stdout and JOURNAL_PATH in play.stdout, play.stdout[-3000:]
        assert _dpkg(fleet, host) == dpkg and fleet.boot_id(host) == boot
        assert fleet.host_path(host, JOURNAL_PATH).read_text() == journal

        # The printed undo command finishes the journal; the host can then be planned again.
        done = subprocess.run(
            [str(ROOT / ".venv/bin") + "/" + undo.group(1).split(" ", 1)[0], *shlex.split(undo.group(1))[1:]],
            capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:]
        assert json.loads(fleet.host_path(host, JOURNAL_PATH).read_text())["status"] == "undone"
        plan = driver_restore(load(inv, "gpu", host), inv, AUDIT, RestoreOptions(dry_run=True, state_dir=tmp_path))
        assert plan.stopped == "preview" and plan.outcome(host).decision.changes_host, plan.outcome(host)
    finally:
        fleet.clear(host)


def test_a_host_that_could_not_be_leased_is_never_changed(fleet: Any, tmp_path: Path) -> None:
    host = "gpu-2"
    inject(fleet, host, "kernel-upgrade")
    try:
        dpkg, boot = _dpkg(fleet, host), fleet.boot_id(host)
        inv = fleet.cfg.inventory_path
        # The fleet as the leases see it: gpu-2 does not answer then (a port nothing listens on); it answers again
        # for the audit and would for the apply.
        lease_hosts = [dataclasses.replace(h, port=9) if h.name == host else h for h in load(inv, "gpu")]
        result = driver_restore(load(inv, "gpu", host), inv, AUDIT, RestoreOptions(
            allow_reboot=True, reboot_timeout=15, apt_lock_timeout=3, state_dir=tmp_path), lease_hosts=lease_hosts)
        o = result.outcome(host)
        assert result.leases is not None and host in result.leases.unreachable
        assert o.status is HostStatus.LEFT_ALONE and o.where == "not leased", o
        assert "unreachable when the run took its leases" in o.detail
        assert result.exit_code == 1
        assert _dpkg(fleet, host) == dpkg and fleet.boot_id(host) == boot
    finally:
        fleet.clear(host)


def test_a_running_kernel_update_journal_blocks_the_kernel_update_too(fleet: Any, tmp_path: Path) -> None:
    from remediation.kernelupdate.flow import JOURNAL_PATH as KERNEL_JOURNAL
    from remediation.kernelupdate.flow import KernelStatus, KernelUpdateOptions, kernel_update

    host = "gpu-1"
    inv = fleet.cfg.inventory_path
    doc = {"schema": JOURNAL_SCHEMA, "run_id": "20261204T000000Z-dead02", "host": host, "action": "kernel-update",
           "started_at": "2026-12-04T00:00:00Z", "changes": [], "undone": [], "status": "running"}
    path = fleet.host_path(host, KERNEL_JOURNAL)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc) + "\n")
    try:
        kernel, dpkg = fleet.boot_id(host), _dpkg(fleet, host)
        result = kernel_update(load(inv, "gpu", host), inv, AUDIT, KernelUpdateOptions(
            allow_reboot=True, reboot_timeout=30, state_dir=tmp_path))
        o = result.outcome(host)
        assert o.status is KernelStatus.LEFT_ALONE and o.plan.action == "update", o
        assert KERNEL_JOURNAL in o.detail and "gpu_kernel_update_operation=undo" in o.detail
        play = subprocess.run(
            [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inv), "playbooks/kernel_update.yml", "--limit",
             host, "-e", "gpu_kernel_update_allow_reboot=true"],
            capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
        )
        assert play.returncode != 0 and "still 'running'" in play.stdout, play.stdout[-3000:]
        assert fleet.boot_id(host) == kernel and _dpkg(fleet, host) == dpkg
        assert json.loads(path.read_text()) == doc  # kept, not overwritten
    finally:
        fleet.clear(host)
