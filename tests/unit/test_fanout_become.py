"""Privilege escalation of the fan-out (Ansible's become): which hosts escalate, the command sent, sudo's refusals
turned into one line per host, and the probe's ``euid`` in the facts (pure: no host is reached)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from remediation.core.errors import FanoutError, InventoryError, ProbeError
from remediation.core.facts import facts_from_dict
from remediation.transport.fanout import become_problem, fan_out, remote_command, sudo_problem
from remediation.transport.inventory import Become, Host, load
from tests.unit.test_probe_host import run_probe

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-gpu-h200"
PROBE = "python3 -I - --nvml-timeout 10"


def _hosts(tmp: Path, **hosts: dict[str, Any]) -> dict[str, Host]:
    doc = {"all": {"children": {"gpu": {"hosts": {name.replace("_", "-"): v for name, v in hosts.items()}}}}}
    path = tmp / "hosts.yml"
    path.write_text(yaml.safe_dump(doc))
    return {h.name: h for h in load(path, "gpu")}


def test_become_follows_ansible_become_else_the_login_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_BECOME", raising=False)
    hosts = _hosts(
        tmp_path,
        root={"ansible_user": "root"},
        azure={"ansible_user": "azureuser"},
        flagged={"ansible_user": "azureuser", "ansible_become": "yes"},
        off={"ansible_user": "azureuser", "ansible_become": False},
        dash_l={"ansible_ssh_common_args": "-l azureuser"},
        templated={"ansible_user": "root", "ansible_become": "{{ 1 == 1 }}"},
    )
    assert not hosts["root"].become.enabled
    assert hosts["azure"].become == Become(True, "sudo", "root", "the login user (azureuser)")
    assert hosts["flagged"].become.enabled and hosts["flagged"].become.source == "ansible_become"
    assert not hosts["off"].become.enabled
    assert hosts["dash-l"].user == "azureuser" and hosts["dash-l"].become.enabled
    assert hosts["templated"].become.enabled


def test_a_become_value_that_is_not_a_boolean_names_host_and_variable(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"^host gpu-1: ansible_become 'maybe' is not a boolean"):
        _hosts(tmp_path, gpu_1={"ansible_become": "maybe"})


def _host(enabled: bool = True, method: str = "sudo", user: str = "root") -> Host:
    return Host("gpu-1", "127.0.0.1", user="azureuser", become=Become(enabled, method, user, "ansible_become"))


def test_the_command_goes_through_sudo_n_only_when_escalating() -> None:
    assert remote_command(_host(False), PROBE) == PROBE
    assert remote_command(_host(), PROBE) == f"sudo -n -- {PROBE}"
    assert remote_command(_host(), "python3 - eyJvcCI6ICJyZWFkIn0=") == "sudo -n -- python3 - eyJvcCI6ICJyZWFkIn0="
    # A compound command runs whole under sudo, never its first half only.
    assert remote_command(_host(), "cat /x 2>/dev/null || true") == "sudo -n -- sh -c 'cat /x 2>/dev/null || true'"
    # sudo execs programs: an environment assignment or a shell builtin in front needs the shell (sudo -- would
    # look for a program named DEBIAN_FRONTEND=noninteractive).
    apt = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q nvidia-driver-535"
    assert remote_command(_host(), apt) == "sudo -n -- sh -c " + shlex.quote(apt)
    assert remote_command(_host(), "cd /tmp") == "sudo -n -- sh -c 'cd /tmp'"
    assert remote_command(_host(), "apt-get install -y -o Foo=bar x") == "sudo -n -- apt-get install -y -o Foo=bar x"
    # Text shlex cannot split is no crash: the shell gets it, quoted, and judges it.
    assert remote_command(_host(), "echo 'unclosed") == "sudo -n -- sh -c " + shlex.quote("echo 'unclosed")


def test_a_method_or_user_the_fanout_cannot_use_is_refused_before_any_host() -> None:
    assert become_problem(_host()) is None and become_problem(_host(False, "su")) is None
    su = become_problem(_host(method="su"))
    assert su == ("host gpu-1: ansible_become_method 'su' is not supported by the fan-out (it escalates with sudo"
                  " only): set ansible_become_method: sudo, or log in as root")
    assert "ansible_become_user 'postgres'" in (become_problem(_host(user="postgres")) or "")
    with pytest.raises(FanoutError, match="ansible_become_method 'su'"):
        fan_out([_host(method="su")], "true", connect_timeout=0.1, timeout=0.1)  # refused before connecting


@pytest.mark.parametrize(
    ("code", "stderr", "expected"),
    [
        (1, "sudo: a password is required\n",
         "gpu-1: sudo asks for a password for azureuser (sudo -n); give azureuser passwordless sudo (NOPASSWD) for"
         " python3, or log in as root"),
        (1, "sudo: unable to resolve host gpu-1: Name or service not known\nsudo: a password is required\n",
         "gpu-1: sudo asks for a password for azureuser (sudo -n); give azureuser passwordless sudo (NOPASSWD) for"
         " python3, or log in as root"),
        (1, "azureuser is not in the sudoers file.\n",
         "gpu-1: sudo refuses azureuser (not in sudoers for python3); give azureuser passwordless sudo (NOPASSWD)"
         " for python3, or log in as root"),
        (127, "sh: 1: sudo: not found\n",
         "gpu-1: sudo is not installed, and ansible_become asks for it (become): install sudo on the host, or log"
         " in as root"),
        (1, "Traceback ...\nValueError: sudo: a password is required\n", None),  # the program's, not sudo's
        (2, "sudo: a password is required\n", None),
        (0, "sudo: a password is required\n", None),
    ],
)
def test_sudo_refusals_become_one_line(code: int, stderr: str, expected: str | None) -> None:
    assert sudo_problem(_host(), PROBE, code, stderr) == expected


def test_sudo_refusal_lines_are_only_read_when_escalating() -> None:
    assert sudo_problem(_host(False), PROBE, 1, "sudo: a password is required\n") is None


def test_a_huge_stderr_is_read_in_linear_time() -> None:
    assert sudo_problem(_host(), PROBE, 1, "sudo:" * 200_000 + "\n" + "x\n" * 200_000) is None


def test_euid_in_facts_old_documents_unchanged_unprivileged_ones_unknown_device_users() -> None:
    doc = json.loads((REAL / "probe-user-job.json").read_text())
    old = facts_from_dict(doc, host="h200")
    assert old.euid is None and not old.unprivileged and old.device_users.available  # older probe: as before
    unpriv = facts_from_dict({**doc, "euid": 1000}, host="h200")
    assert unpriv.euid == 1000 and unpriv.unprivileged and not unpriv.device_users.available
    root = facts_from_dict({**doc, "euid": 0}, host="h200")
    assert root.euid == 0 and not root.unprivileged and root.device_users.available
    with pytest.raises(ProbeError, match="euid"):
        facts_from_dict({**doc, "euid": "root"}, host="h200")


def test_the_probe_reports_its_euid() -> None:
    doc = run_probe("--root", "/nonexistent")
    assert doc["euid"] == os.geteuid()
    assert facts_from_dict(doc, host="controller").euid == os.geteuid()
