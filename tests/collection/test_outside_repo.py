"""The collection outside the repository: the built tarball and the built wheel in a fresh virtualenv and
collections path under a temporary directory, the playbooks run by FQCN from there against lab hosts of this
module's own (127.0.86.N), with the same results as the in-repo runs.

Nothing of the checkout is on any path of those runs: the virtualenv has the wheel (not an editable install), the
working directory has no ansible.cfg, the environment has no ``ANSIBLE_*`` variable but the collections path and
Ansible's home (both in the temporary directory), and the lab's inventory, key and known_hosts live in the lab's
temporary state directory. The tests check each of these before they rely on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from tests.collection.conftest import FQCN, Built, clean_env, install_collection, run
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

PROBE = ROOT / "remediation" / "hostside" / "gpuprobe"  # the probe package
BOOT_KERNEL, NEW_KERNEL, DRIVER = "6.5.0-44-generic", "6.5.0-45-generic", "535.183.01"
RECAP = re.compile(r"^(?P<host>\S+)\s+: ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
                   r"failed=(?P<failed>\d+)", re.M)
# What harden changes on a host: dpkg's database and selections, apt's effective configuration, the /etc/apt tree.
SNAPSHOT = (
    "sha256sum /var/lib/dpkg/status; apt-config dump | sha256sum; apt-mark showhold;"
    " find /etc/apt -printf '%p %y %m %s\\n' | sort;"
    " find /etc/apt -type f -print0 | sort -z | xargs -0 sha256sum"
)
# The variables the in-repo tests of these playbooks pass; nothing else.
ALLOWED_ANSIBLE_ENV = {"ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_HOME", "ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR"}


@dataclass(frozen=True)
class Outside:
    venv: Path
    collections: Path
    work: Path  # the working directory of every run: empty
    env: dict[str, str]

    def playbook(self, inventory: Path, name: str, *args: str) -> tuple[int, str, dict[str, dict[str, int]]]:
        proc = run([str(self.venv / "bin" / "ansible-playbook"), "-i", str(inventory), f"{FQCN}.{name}", *args],
                   self.work, self.env, timeout=600)
        return proc.returncode, proc.stdout + proc.stderr, recap(proc.stdout)


def recap(stdout: str) -> dict[str, dict[str, int]]:
    return {m["host"]: {k: int(m[k]) for k in ("changed", "unreachable", "failed")} for m in RECAP.finditer(stdout)}


def constraints(path: Path) -> Path:
    """This environment's versions (ansible-core, ansible-runner, ...) as pip constraints: the fresh virtualenv
    gets what the in-repo runs use, from pip's cache where it can."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True,
                            text=True, check=True).stdout
    path.write_text("".join(f"{line}\n" for line in frozen.splitlines() if "==" in line and " @ " not in line))
    return path


@pytest.fixture(scope="module")
def outside(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Outside:
    require_lab()
    tmp = tmp_path_factory.mktemp("outside")
    venv, home, work, collections = tmp / "venv", tmp / "home", tmp / "work", tmp / "collections"
    work.mkdir()
    proc = run([sys.executable, "-m", "venv", str(venv)], tmp, clean_env(home, Path("/usr/bin")))
    assert proc.returncode == 0, proc.stderr
    pip_env = clean_env(home, venv / "bin")
    proc = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(constraints(tmp / "c.txt")),
                str(built.wheel)], work, pip_env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    install_collection(built.tarball, collections, work, pip_env, venv / "bin" / "ansible-galaxy")
    env = clean_env(home, venv / "bin", ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_HOME=str(home / ".ansible"))
    return Outside(venv, collections, work, env)


@pytest.fixture(scope="module")
def olab(outside: Outside, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    lab = make_lab(tmp_path_factory.mktemp("outside-lab"), "127.0.86", 3)
    try:
        yield lab
    finally:
        lab.down(purge=True)


def remote(lab: Any, host: str, command: str) -> str:
    proc = ssh(lab, host, command)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def test_nothing_of_the_checkout_is_on_any_path(outside: Outside, olab: Any) -> None:
    root = str(ROOT)
    assert not any(root in value for value in outside.env.values())
    assert {k for k in outside.env if k.startswith("ANSIBLE_")} <= ALLOWED_ANSIBLE_ENV
    assert not any(k.startswith("PYTHON") or k == "VIRTUAL_ENV" for k in outside.env)
    assert list(outside.work.iterdir()) == []  # no ansible.cfg, nothing at all
    assert root not in Path(olab.cfg.inventory_path).read_text()
    probe = run([str(outside.venv / "bin" / "python"), "-c",
                 "import json, sys, ansible, remediation, remediation.restore.rules; "
                 "print(json.dumps({'path': sys.path, 'ansible': ansible.__file__, 'lib': remediation.__file__}))"],
                outside.work, outside.env)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert not [p for p in seen["path"] if p.startswith(root)], seen["path"]
    assert seen["lib"].startswith(str(outside.venv)) and seen["ansible"].startswith(str(outside.venv)), seen
    version = run([str(outside.venv / "bin" / "ansible-playbook"), "--version"], outside.work, outside.env)
    assert "config file = None" in version.stdout, version.stdout
    assert f"ansible collection location = {outside.collections}" in version.stdout, version.stdout
    assert root not in version.stdout
    listing = run([str(outside.venv / "bin" / "ansible-galaxy"), "collection", "list", FQCN], outside.work,
                  outside.env)
    assert str(outside.collections / "ansible_collections") in listing.stdout and root not in listing.stdout


def test_harden_by_fqcn_leaves_a_host_as_the_in_repo_run_does(outside: Outside, olab: Any) -> None:
    inventory = Path(olab.cfg.inventory_path)
    # In the repository: the checkout's venv, its ansible.cfg, playbooks/harden.yml, on gpu-1.
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(inventory.parent / "ansible-home"),
           "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}"}
    repo = run([str(venv_bin / "ansible-playbook"), "-i", str(inventory), "playbooks/harden.yml", "--limit", "gpu-1"],
               ROOT, env)
    assert repo.returncode == 0, repo.stdout[-4000:] + repo.stderr
    # Outside: the installed collection by FQCN, on gpu-2.
    rc, output, counts = outside.playbook(inventory, "harden", "--limit", "gpu-2")
    assert rc == 0, output[-4000:]
    assert counts["gpu-2"]["failed"] == 0 and counts["gpu-2"]["changed"] > 0
    assert counts["gpu-2"]["changed"] == recap(repo.stdout)["gpu-1"]["changed"]
    # The same end state, byte for byte: dpkg's database and holds, apt's effective configuration, /etc/apt.
    hardened = remote(olab, "gpu-2", SNAPSHOT)
    assert hardened == remote(olab, "gpu-1", SNAPSHOT)
    assert remote(olab, "gpu-3", SNAPSHOT) != hardened  # not a snapshot that cannot tell
    holds = remote(olab, "gpu-2", "apt-mark showhold").split()
    assert {f"linux-image-{BOOT_KERNEL}", "linux-image-generic", "nvidia-driver-535"} <= set(holds)
    blacklist = remote(olab, "gpu-2",
                       "apt-config dump --no-empty --format '%v%n' Unattended-Upgrade::Package-Blacklist")
    assert {"^linux-image-", "^nvidia-"} <= set(blacklist.split())
    # Idempotent from the install too.
    rc, output, counts = outside.playbook(inventory, "harden", "--limit", "gpu-2")
    assert rc == 0 and counts["gpu-2"]["changed"] == 0, output[-4000:]


def test_audit_timer_by_fqcn_installs_the_packages_probe_and_runs_it(outside: Outside, olab: Any) -> None:
    inventory = Path(olab.cfg.inventory_path)
    rc, output, counts = outside.playbook(inventory, "audit_timer", "--limit", "gpu-1,gpu-2")
    assert rc == 0, output[-4000:]
    assert sorted(counts) == ["gpu-1", "gpu-2"] and all(c["changed"] > 0 and c["failed"] == 0 for c in counts.values())
    for host in ("gpu-1", "gpu-2"):
        # The probe the role copied is the installed package's, which is the checkout's package: the same modules.
        listing = remote(olab, host, "cd /usr/local/lib/gpufleet/gpuprobe && sha256sum *.py")
        assert sorted(line.split() for line in listing.splitlines()) == sorted(
            [hashlib.sha256(p.read_bytes()).hexdigest(), p.name] for p in PROBE.glob("*.py"))
        (line,) = [x for x in remote(olab, host, "cat /etc/cron.d/gpufleet-probe").splitlines()
                   if x.strip() and not x.startswith("#")]
        fields = line.split(None, 6)
        assert fields[:6] == ["*/5", "*", "*", "*", "*", "root"]
        assert shlex.split(fields[6]) == [
            "/usr/bin/flock", "-n", "/run/gpufleet-probe.lock",
            "/usr/bin/python3", "/usr/local/lib/gpufleet/gpuprobe",
            "--nvml-timeout", "10", "--json-out", "/var/lib/gpufleet/facts.json",
            "--prom-out", "/var/lib/node_exporter/textfile_collector/gpufleet.prom", "--host-label", host]
        facts = json.loads(remote(olab, host, "cat /var/lib/gpufleet/facts.json"))
        assert facts["hostname"] == host and facts["nvml"]["ok"] is True and facts["nvml"]["device_count"] == 2
        prom = remote(olab, host, "cat /var/lib/node_exporter/textfile_collector/gpufleet.prom")
        assert f'gpufleet_nvml_ok{{host="{host}"}} 1' in prom, prom[:2000]
    rc, output, counts = outside.playbook(inventory, "audit_timer", "--limit", "gpu-1,gpu-2")
    assert rc == 0 and all(c["changed"] == 0 for c in counts.values()), output[-4000:]


def test_driver_restore_by_fqcn_repairs_the_s1_host(outside: Outside, olab: Any) -> None:
    inventory = Path(olab.cfg.inventory_path)
    inject(olab, "gpu-3", "kernel-upgrade")
    broken = ssh(olab, "gpu-3", "python3 -c 'import pynvml; pynvml.nvmlInit()'")
    assert broken.returncode == 1 and "NVMLError_DriverNotLoaded" in broken.stderr
    rc, output, counts = outside.playbook(inventory, "driver_restore", "--limit", "gpu-3",
                                          "-e", json.dumps({"nvidia_driver_restore_allow_reboot": True}))
    assert rc == 0, output[-6000:]
    assert counts["gpu-3"]["changed"] > 0 and counts["gpu-3"]["failed"] == 0
    # What molecule/nvidia_driver_restore's verify asks of the restored host.
    assert remote(olab, "gpu-3", "uname -r").strip() == NEW_KERNEL
    nvml = remote(olab, "gpu-3",
                  "python3 -c 'import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlSystemGetDriverVersion())'")
    assert nvml.strip() == DRIVER
    holds = set(remote(olab, "gpu-3", "apt-mark showhold").split())
    assert {f"linux-image-{NEW_KERNEL}", f"linux-headers-{NEW_KERNEL}", "nvidia-driver-535"} <= holds
    journal = json.loads(remote(olab, "gpu-3", "cat /var/lib/gpufleet/driver-restore/journal.json"))
    assert journal["status"] == "applied"
    # Healthy now: the same playbook decides so and changes nothing.
    rc, output, counts = outside.playbook(inventory, "driver_restore", "--limit", "gpu-3",
                                          "-e", json.dumps({"nvidia_driver_restore_allow_reboot": True}))
    assert rc == 0 and counts["gpu-3"]["changed"] == 0, output[-4000:]
