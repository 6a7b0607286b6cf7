"""Issue 20, item 1: a hostile inventory value never reaches a shell on the controller (real Invoke CLI, no host).

OpenSSH 9.6+ refuses host and user names with shell metacharacters before it expands them into a ProxyCommand
(CVE-2023-51385); the fan-out does the same: exit 2, one line naming the host, the variable and the fix, and the
ProxyCommand is never started (the marker file the payload would create does not exist).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def audit(inventory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "audit", "--inventory", str(inventory), "--timeout", "10"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )


def write_inventory(path: Path, hostvars: dict[str, str]) -> Path:
    path.write_text(json.dumps({"gpu": {"hosts": {"gpu-1": hostvars}}}))  # JSON is YAML
    return path


@pytest.mark.parametrize(
    ("hostvars", "variable"),
    [
        ({"ansible_host": "127.0.0.1$(touch {marker})",
          "ansible_ssh_common_args": "-o ProxyCommand='true %h'"}, "ansible_host"),
        ({"ansible_host": "127.0.0.1", "ansible_user": "root;touch {marker}",
          "ansible_ssh_common_args": "-o ProxyCommand='true %r'"}, "ansible_user"),
        ({"ansible_host": "127.0.0.1",
          "ansible_ssh_common_args": "-o HostName=`touch${IFS}{marker}` -o ProxyCommand='true %h'"}, "HostName"),
    ],
    ids=["ansible_host", "ansible_user", "HostName-option"],
)
def test_shell_metacharacters_in_inventory_exit_2_and_run_nothing(
    tmp_path: Path, hostvars: dict[str, str], variable: str
) -> None:
    marker = tmp_path / "pwned"
    inventory = write_inventory(
        tmp_path / "hosts.yml", {k: v.replace("{marker}", str(marker)) for k, v in hostvars.items()}
    )
    proc = audit(inventory)
    assert not marker.exists(), "the inventory value reached a shell on the controller"
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "gpu-1" in lines[0] and variable in lines[0] and "shell metacharacter" in lines[0], lines[0]


def test_train_monitor_refuses_a_host_name_with_shell_metacharacters(tmp_path: Path) -> None:
    """Issue 20, item 3: Ansible accepts the name ``gpu-2;id``; train.monitor refuses it before connecting."""
    inventory = write_inventory(tmp_path / "hosts.yml", {"ansible_host": "127.0.0.1", "ansible_port": "1"})
    inventory.write_text(inventory.read_text().replace('"gpu-1"', '"gpu-2;id"'))
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "train.monitor", "--host", "gpu-2;id", "--inventory", str(inventory),
         "--count", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpu-2;id" in lines[0] and "rename the host" in lines[0], proc.stderr
