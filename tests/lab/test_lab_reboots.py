"""Reboot requests on lab hosts are never lost, one host or many at once, idle or loaded (issue: lost reboots).

A 10-host lab of its own (127.0.47.N). Each round reboots every host at once through the path Ansible's
``reboot`` action uses: ``shutdown -r 0 "<message>"`` sent by Ansible over SSH on a terminal (``raw``, which is
the action's low-level command), and the reboot action itself. Every host must show a new boot id within a few
seconds of the command returning; a lost request fails the round at once, naming the host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab

HOSTS = 10
ROUNDS = 3  # rounds of raw `shutdown -r` (30 reboots); the reboot action runs ACTION_ROUNDS (20 more)
ACTION_ROUNDS = 2
NEW_BOOT_WITHIN_S = 8.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_lab()
    the_lab = make_lab(tmp_path_factory.mktemp("reboots"), "127.0.47", HOSTS)
    try:
        yield the_lab
    finally:
        the_lab.down(purge=True)


def _ansible(lab, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""), "ANSIBLE_FORCE_COLOR": "0"}
    cmd = [str(Path(venv_bin) / "ansible"), "gpu", "-i", str(lab.cfg.inventory_path), "-f", str(HOSTS), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _wait_all_rebooted(lab, before: dict[str, str | None]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Seconds each host took to show a new boot id; fails naming every host that did not within the limit."""
    start = time.monotonic()
    took: dict[str, float] = {}
    while time.monotonic() - start < NEW_BOOT_WITHIN_S and len(took) < len(before):
        for host, old in before.items():
            if host not in took:
                new = lab.boot_id(host)
                if new and new != old:
                    took[host] = time.monotonic() - start
        time.sleep(0.05)
    lost = sorted(set(before) - set(took))
    assert not lost, f"reboot requested but not done within {NEW_BOOT_WITHIN_S:.0f} s on {', '.join(lost)}"
    return took


def _boot_ids(lab) -> dict[str, str | None]:  # type: ignore[no-untyped-def]
    return {f"gpu-{i}": lab.boot_id(f"gpu-{i}") for i in range(1, HOSTS + 1)}


def _wait_ssh(lab) -> None:  # type: ignore[no-untyped-def]
    for i in range(1, HOSTS + 1):
        lab.wait_rebooted(f"gpu-{i}", None, timeout=30)  # boot id present and sshd answering


def test_shutdown_r_from_ansible_on_every_host_at_once_always_reboots(lab) -> None:  # type: ignore[no-untyped-def]
    for round_ in range(ROUNDS):
        before = _boot_ids(lab)
        r = _ansible(lab, "-m", "ansible.builtin.raw", "-a", f'shutdown -r 0 "round {round_}: reboot initiated"')
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        _wait_all_rebooted(lab, before)
        _wait_ssh(lab)


def test_ansible_reboot_action_on_every_host_at_once_returns_quickly(lab) -> None:  # type: ignore[no-untyped-def]
    for _ in range(ACTION_ROUNDS):
        before = _boot_ids(lab)
        started = time.monotonic()
        r = _ansible(lab, "-m", "ansible.builtin.reboot", "-a", "reboot_timeout=30")
        assert r.returncode == 0, "a host did not reboot:\n" + r.stdout[-3000:] + r.stderr[-2000:]
        assert time.monotonic() - started < 60
        after = _boot_ids(lab)
        assert all(after[h] != before[h] for h in before), {h for h in before if after[h] == before[h]}
