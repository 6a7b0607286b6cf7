"""The fan-out connects the way Ansible (ssh) does, on real lab hosts: agent, encrypted keys, the system
known_hosts file, ProxyJump / ProxyCommand through a bastion; host keys checked strictly at every hop.

Three lab hosts: gpu-1 is the bastion (its sshd logs at DEBUG1, so each ``direct-tcpip`` channel it opens is
on record), gpu-2 is reached only through it (or through gpu-1 then gpu-3, a chain), gpu-3 directly. Every
host accepts one ed25519 key encrypted with a passphrase; a real ``ssh-agent`` started here holds it (added
with ``ssh-add`` and ``SSH_ASKPASS``).
Which known_hosts file holds which key: the inventory's ``UserKnownHostsFile`` only gpu-2's; the system-style
file only gpu-1's (the bastion) and gpu-3's. The fan-out tests point ``remediation.transport.fanout.GLOBAL_KNOWN_HOSTS``
at that file; the Ansible test bind-mounts it as ``/etc/ssh/ssh_known_hosts`` in a private mount namespace,
where ssh(1) and the fan-out read it under its real name (the machine's own file is never written).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import remediation.transport.fanout as fanout
from remediation.core.errors import FanoutError
from remediation.transport.fanout import Status, fan_out
from remediation.transport.inventory import load
from remediation.transport.runner import HostState, run_playbook
from remediation.transport.sshauth import PASSPHRASE_FILE_ENV
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

PASSPHRASE = "fleet key passphrase 3f9c"  # noqa: S105 - the test key's own passphrase
BASTION_LOG = "/var/log/sshd-debug.log"
PLAYBOOK = """\
- name: Reach every host the way the inventory says
  hosts: all
  gather_facts: false
  tasks:
    - name: Ask the host its name
      ansible.builtin.command: hostname
      changed_when: false
      register: seen
    - name: Check it is the host the inventory means
      ansible.builtin.assert:
        that: seen.stdout == expected
"""


@dataclass(frozen=True)
class Fleet:
    lab: Any
    tmp: Path
    key: Path
    agent_sock: str
    addr: dict[str, str]  # lab host -> address
    key_line: dict[str, str]  # lab host -> "ssh-ed25519 AAAA..."
    inv_known: Path
    system_known: Path
    inventory: Path


def remote(lab: Any, host: str, command: str) -> str:
    proc = ssh(lab, host, command)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def known_line(names: str, key_line: str) -> str:
    return f"{names} {key_line}\n"


def write_inventory(path: Path, fleet_addr: dict[str, str], key: Path, inv_known: Path, system_known: Path) -> Path:
    bastion = f"azureuser@{fleet_addr['gpu-1']}"
    strict = f"-o UserKnownHostsFile={inv_known} -o StrictHostKeyChecking=yes"
    hosts = {
        # -J in the common args, the encrypted key named as Ansible names keys: the agent holds it.
        "via-bastion": {"ansible_host": fleet_addr["gpu-2"], "ansible_ssh_private_key_file": str(key),
                        "ansible_ssh_common_args": f"{strict} -o IdentitiesOnly=yes -J {bastion}",
                        "expected": "gpu-2"},
        # ProxyJump in the extra args, no key file: agent keys only.
        "via-bastion-extra": {"ansible_host": fleet_addr["gpu-2"], "ansible_ssh_common_args": strict,
                              "ansible_ssh_extra_args": f"-o ProxyJump=ssh://{bastion}:22", "expected": "gpu-2"},
        # A chain: gpu-1, then gpu-3 (reached through gpu-1), then the target through gpu-3.
        "via-two-bastions": {"ansible_host": fleet_addr["gpu-2"], "ansible_ssh_common_args": strict,
                             "ansible_ssh_extra_args": f"-J {bastion},azureuser@{fleet_addr['gpu-3']}",
                             "expected": "gpu-2"},
        # ProxyCommand: ssh itself reaches the bastion (checking its key in the system-style file).
        "via-proxycommand": {
            "ansible_host": fleet_addr["gpu-2"], "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": (
                f"{strict} -o IdentitiesOnly=yes -o 'ProxyCommand=ssh -o UserKnownHostsFile={system_known}"
                f" -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o BatchMode=yes -W %h:%p {bastion}'"
            ),
            "expected": "gpu-2",
        },
        # No UserKnownHostsFile: ~/.ssh/known_hosts and the system file, as ssh; the agent's keys only.
        "system-known": {"ansible_host": fleet_addr["gpu-3"], "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes",
                         "expected": "gpu-3"},
        # The encrypted key file alone (IdentitiesOnly): the agent if it holds the key, else the passphrase file.
        "key-file": {"ansible_host": fleet_addr["gpu-3"], "ansible_ssh_private_key_file": str(key),
                     "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
                     "expected": "gpu-3"},
    }
    doc = {"all": {"children": {"fleet": {"hosts": hosts, "vars": {
        "ansible_user": "azureuser", "ansible_python_interpreter": "/usr/bin/python3"}}}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_lab()
    tmp = tmp_path_factory.mktemp("fanout-ssh")
    lab = make_lab(tmp, "127.0.73", 3)
    agent = None
    try:
        (tmp / "keys").mkdir(mode=0o700)
        key = tmp / "keys" / "fleet_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-C", "fleet", "-f", str(key)],
                       check=True)
        pub = key.with_suffix(".pub").read_text()
        for host in ("gpu-1", "gpu-2", "gpu-3"):
            proc = subprocess.run(["ssh", "-F", str(lab.paths.ssh_config), host, "cat >> .ssh/authorized_keys"],
                                  input=pub, text=True, capture_output=True, timeout=30, check=False)
            assert proc.returncode == 0, proc.stderr
        # The bastion's sshd logs every channel it opens (DEBUG1), to a file (the lab has no syslog).
        remote(lab, "gpu-1", f"echo 'LogLevel DEBUG1' > /etc/ssh/sshd_config.d/30-test-debug.conf;"
                             f" echo 'SSHD_OPTS=\"-E {BASTION_LOG}\"' > /etc/default/ssh;"
                             " /etc/init.d/ssh restart >/dev/null")
        lab.wait_ready(["gpu-1"], 15)
        # A real agent holding the encrypted key; the passphrase goes in through SSH_ASKPASS, as a desktop does.
        sock = str(tmp / "agent.sock")
        agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        askpass = tmp / "askpass"
        askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
        askpass.chmod(0o700)
        env = {**os.environ, "SSH_AUTH_SOCK": sock, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
               "DISPLAY": ":0"}
        subprocess.run(["ssh-add", "-q", str(key)], env=env, stdin=subprocess.DEVNULL, check=True, timeout=30)
        listed = subprocess.run(["ssh-add", "-l"], env=env, capture_output=True, text=True, check=True).stdout
        assert "fleet" in listed
        addr, key_line = {}, {}
        for entry in lab.paths.known_hosts.read_text().splitlines():
            names, kind, blob = entry.split()
            name, address = names.split(",")
            addr[name], key_line[name] = address, f"{kind} {blob}"
        inv_known = tmp / "inventory_known_hosts"
        inv_known.write_text(known_line(addr["gpu-2"], key_line["gpu-2"]))
        system_known = tmp / "ssh_known_hosts"
        system_known.write_text(known_line(addr["gpu-1"], key_line["gpu-1"]) +
                                known_line(addr["gpu-3"], key_line["gpu-3"]))
        inventory = write_inventory(tmp / "hosts.yml", addr, key, inv_known, system_known)
        yield Fleet(lab, tmp, key, sock, addr, key_line, inv_known, system_known, inventory)
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=10)
        lab.down(purge=True)


@pytest.fixture
def env(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The agent on, no passphrase file, the system-style known_hosts file as the fan-out's global file."""
    monkeypatch.setenv("SSH_AUTH_SOCK", fleet.agent_sock)
    monkeypatch.delenv(PASSPHRASE_FILE_ENV, raising=False)
    monkeypatch.setattr(fanout, "GLOBAL_KNOWN_HOSTS", (str(fleet.system_known),))
    return monkeypatch


def channels_to(fleet: Fleet, host: str) -> int:
    """How many direct-tcpip channels the bastion has opened to a lab host, from its sshd log."""
    text = remote(fleet.lab, "gpu-1", f"grep -c 'server_request_direct_tcpip: .* target {fleet.addr[host]} port 22'"
                                      f" {BASTION_LOG} || true")
    return int(text.strip() or 0)


def run(fleet: Fleet, limit: str | None = None, inventory: Path | None = None):  # type: ignore[no-untyped-def]
    return fan_out(load(inventory or fleet.inventory, "fleet", limit=limit), "hostname", connect_timeout=10,
                   timeout=30)


def test_agent_held_encrypted_key_system_known_hosts_and_the_bastion(fleet: Fleet, env: pytest.MonkeyPatch) -> None:
    before = {h: channels_to(fleet, h) for h in ("gpu-2", "gpu-3")}
    result = run(fleet)
    expected = {h.name: h.vars["expected"] for h in load(fleet.inventory, "fleet")}
    for name, host_run in result.runs.items():
        assert host_run.status is Status.OK, (name, host_run)
        assert host_run.stdout.strip() == expected[name]
    # Through the bastion: one channel per host behind it (the two ProxyJump hosts share one bastion
    # connection; the ProxyCommand host has its own ssh -W); the chain's channel goes to its second hop, gpu-3.
    # The hosts on gpu-3 were reached directly.
    assert channels_to(fleet, "gpu-2") - before["gpu-2"] == 3
    assert channels_to(fleet, "gpu-3") - before["gpu-3"] == 1


def test_many_hosts_behind_one_bastion_finish_without_cutting_each_other_off(
    fleet: Fleet, env: pytest.MonkeyPatch
) -> None:
    """Hosts behind one bastion share its connection; each one that finishes closes its channel. A packet sent on
    a channel the bastion has already freed makes OpenSSH drop the whole bastion connection ("packet referred to
    nonexistent channel"), and with it every host still in flight: the fan-out must never send one."""
    strict = f"-o UserKnownHostsFile={fleet.inv_known} -o StrictHostKeyChecking=yes"
    hosts = {f"behind-{i:02d}": {"ansible_host": fleet.addr["gpu-2"], "ansible_ssh_common_args": strict,
                                 "ansible_ssh_extra_args": f"-J azureuser@{fleet.addr['gpu-1']}"} for i in range(16)}
    doc = {"all": {"children": {"fleet": {"hosts": hosts, "vars": {"ansible_user": "azureuser"}}}}}
    inventory = fleet.tmp / "behind.yml"
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    for _ in range(3):
        result = run(fleet, inventory=inventory)
        bad = {n: (r.status.value, r.exit_code, r.error) for n, r in result.runs.items() if r.status is not Status.OK}
        assert not bad
        assert {r.stdout.strip() for r in result.runs.values()} == {"gpu-2"}
    assert remote(fleet.lab, "gpu-1", f"grep -c 'nonexistent channel' {BASTION_LOG} || true").strip() == "0"


def test_without_the_agent_an_encrypted_key_needs_its_passphrase_file(fleet: Fleet, env: pytest.MonkeyPatch) -> None:
    env.delenv("SSH_AUTH_SOCK")
    refused = run(fleet, "key-file").runs["key-file"]
    assert refused.status is Status.UNREACHABLE
    assert str(fleet.key) in (refused.error or "") and "encrypted" in (refused.error or "")
    assert PASSPHRASE_FILE_ENV in (refused.error or "")

    secret = fleet.tmp / "passphrase"
    secret.write_text(PASSPHRASE + "\n")
    secret.chmod(0o600)
    env.setenv(PASSPHRASE_FILE_ENV, str(secret))
    good = run(fleet, "key-file")
    assert good.runs["key-file"].status is Status.OK, good.runs["key-file"].error
    assert good.runs["key-file"].stdout.strip() == "gpu-3"

    wrong = fleet.tmp / "wrong-passphrase"
    wrong.write_text("not the passphrase 1c4e\n")
    wrong.chmod(0o600)
    env.setenv(PASSPHRASE_FILE_ENV, str(wrong))
    bad = run(fleet, "key-file")
    assert bad.runs["key-file"].status is Status.UNREACHABLE
    assert "does not decrypt" in (bad.runs["key-file"].error or "")
    for result in (refused, good, bad):
        assert PASSPHRASE not in repr(result) and "not the passphrase" not in repr(result)

    secret.chmod(0o644)
    env.setenv(PASSPHRASE_FILE_ENV, str(secret))
    with pytest.raises(FanoutError, match="chmod 600"):
        run(fleet, "key-file")


def test_the_bastion_host_key_is_checked_strictly(fleet: Fleet, env: pytest.MonkeyPatch) -> None:
    changed = fleet.tmp / "bastion-changed"
    changed.write_text(known_line(fleet.addr["gpu-1"], fleet.key_line["gpu-2"]) +
                       known_line(fleet.addr["gpu-3"], fleet.key_line["gpu-3"]))
    unknown = fleet.tmp / "bastion-unknown"
    unknown.write_text(known_line(fleet.addr["gpu-3"], fleet.key_line["gpu-3"]))
    before = channels_to(fleet, "gpu-2")
    for path, reason in ((changed, "host key mismatch"), (unknown, "not found in known_hosts")):
        env.setattr(fanout, "GLOBAL_KNOWN_HOSTS", (str(path),))
        result = run(fleet, "via-bastion*,system-known")
        for name in ("via-bastion", "via-bastion-extra"):
            error = result.runs[name].error or ""
            assert result.runs[name].status is Status.UNREACHABLE, name
            assert f"bastion azureuser@{fleet.addr['gpu-1']}:22" in error and reason in error, error
        assert result.runs["system-known"].status is Status.OK  # hosts not behind it are not affected
    assert channels_to(fleet, "gpu-2") == before  # nothing went through a bastion that was not verified


def test_the_target_behind_the_bastion_is_checked_strictly(fleet: Fleet, env: pytest.MonkeyPatch) -> None:
    bad_known = fleet.tmp / "target-changed"
    bad_known.write_text(known_line(fleet.addr["gpu-2"], fleet.key_line["gpu-3"]))
    inventory = write_inventory(fleet.tmp / "hosts-bad.yml", fleet.addr, fleet.key, bad_known, fleet.system_known)
    before = channels_to(fleet, "gpu-2")
    result = run(fleet, "via-bastion", inventory)
    error = result.runs["via-bastion"].error or ""
    assert result.runs["via-bastion"].status is Status.UNREACHABLE
    assert f"host key mismatch for {fleet.addr['gpu-2']}" in error and str(bad_known) in error, error
    assert channels_to(fleet, "gpu-2") == before + 1  # the bastion was fine: the target's key was refused


def test_ansible_through_the_runner_refuses_an_unknown_host_key(fleet: Fleet, env: pytest.MonkeyPatch) -> None:
    empty = fleet.tmp / "empty_known_hosts"
    empty.write_text("")
    doc = {"all": {"hosts": {"gpu-3": {
        "ansible_host": fleet.addr["gpu-3"], "ansible_user": "azureuser",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={empty} -o StrictHostKeyChecking=yes", "expected": "gpu-3",
    }}}}
    inventory = fleet.tmp / "hosts-unknown.yml"
    inventory.write_text(yaml.safe_dump(doc))
    (fleet.tmp / "play.yml").write_text(PLAYBOOK)
    result = run_playbook(fleet.tmp / "play.yml", inventory)
    assert result.hosts["gpu-3"].state is HostState.UNREACHABLE, result.stdout_tail
    assert empty.read_text() == ""  # and nothing was learned on first use


SCRIPT = """
import json, sys
from pathlib import Path
from remediation.transport.fanout import fan_out
from remediation.transport.inventory import load
from remediation.transport.runner import run_playbook
play, inventory = Path(sys.argv[1]), Path(sys.argv[2])
played = run_playbook(play, inventory)
fanned = fan_out(load(inventory, "fleet"), "hostname", connect_timeout=10, timeout=30)
print(json.dumps({
    "runner": {h: o.state.value for h, o in played.hosts.items()},
    "tail": played.stdout_tail[-3000:],
    "fanout": {h: [r.status.value, r.error, r.stdout.strip()] for h, r in fanned.runs.items()},
}))
"""


def test_the_same_inventory_works_for_ansible_playbook_through_the_runner(fleet: Fleet) -> None:
    """ssh(1) under ansible-playbook reads the system file only under its real name, and checks a ProxyJump
    hop only against the default files (ssh -W gets none of the target's -o options): run both clients in a
    private mount namespace where a copy of /etc/ssh with the lab's ssh_known_hosts is mounted on /etc/ssh."""
    etc_ssh = fleet.tmp / "etc-ssh"
    shutil.rmtree(etc_ssh, ignore_errors=True)
    shutil.copytree("/etc/ssh", etc_ssh, symlinks=True)
    shutil.copyfile(fleet.system_known, etc_ssh / "ssh_known_hosts")
    (fleet.tmp / "play.yml").write_text(PLAYBOOK)
    before, before_hop = channels_to(fleet, "gpu-2"), channels_to(fleet, "gpu-3")
    env = {k: v for k, v in os.environ.items() if k != PASSPHRASE_FILE_ENV}
    env["SSH_AUTH_SOCK"] = fleet.agent_sock
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/ssh && exec "$@"',
         str(etc_ssh), sys.executable, "-c", SCRIPT, str(fleet.tmp / "play.yml"), str(fleet.inventory)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    names = {"via-bastion", "via-bastion-extra", "via-two-bastions", "via-proxycommand", "system-known", "key-file"}
    assert out["runner"] == dict.fromkeys(names, "ok"), out["tail"]
    assert {h: r[0] for h, r in out["fanout"].items()} == dict.fromkeys(names, "ok"), out["fanout"]
    # Three hosts behind the bastion, reached twice each (Ansible, then the fan-out; Ansible's ssh multiplexes
    # its two tasks per host over one connection): at least 6 channels to gpu-2; the chain's 2 go to gpu-3.
    assert channels_to(fleet, "gpu-2") - before >= 6
    assert channels_to(fleet, "gpu-3") - before_hop >= 2
