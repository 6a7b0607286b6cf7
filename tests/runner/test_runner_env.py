"""The ansible-runner wrapper's environment: ANSIBLE_* passes (vault), nothing else does, secrets stay out of logs.

A real ``ansible-playbook`` run through ``run_playbook`` against the controller itself (``ansible_connection=local``):
no lab host needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from remediation.transport.runner import HostState, run_playbook

BIN = Path(sys.executable).parent
VAULT_PASSWORD = "vault-pass-8d1f"  # noqa: S105 - a throwaway password for the test's own vault
DECRYPTED = "decrypted-value-5c2e"
CLOUD_SECRET = "cloud-secret-77a9"  # noqa: S105 - stands for a cloud credential in the controller's environment
PLAYBOOK = """\
- name: Vault and environment through the runner
  hosts: all
  gather_facts: false
  vars_files: [vaulted.yml]
  tasks:
    - name: Write what the playbook sees
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0600"
        content: "{{ {'vaulted': secret_value,
                      'cloud': lookup('ansible.builtin.env', 'GPUFLEET_TEST_CLOUD_SECRET'),
                      'ansible_var': lookup('ansible.builtin.env', 'ANSIBLE_GPUFLEET_TEST_SETTING'),
                      'host_key_checking': lookup('ansible.builtin.env', 'ANSIBLE_HOST_KEY_CHECKING')} | to_json }}"
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("runner-env")
    password = tmp / "vault-password"
    password.write_text(VAULT_PASSWORD + "\n")
    password.chmod(0o600)
    vaulted = subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password), DECRYPTED,
         "--name", "secret_value"],
        capture_output=True, text=True, check=True,
    ).stdout
    (tmp / "vaulted.yml").write_text(vaulted)
    (tmp / "play.yml").write_text(PLAYBOOK)
    (tmp / "inventory").write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable} out={tmp / 'seen.json'}\n"
    )
    yield tmp


def _run(project: Path, monkeypatch: pytest.MonkeyPatch, keep: Path | None = None) -> dict[str, str]:
    monkeypatch.setenv("GPUFLEET_TEST_CLOUD_SECRET", CLOUD_SECRET)
    monkeypatch.setenv("ANSIBLE_GPUFLEET_TEST_SETTING", "passed-through")
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")  # the runner keeps host keys checked regardless
    result = run_playbook(project / "play.yml", project / "inventory", keep_artifacts=keep)
    assert result.rc == 0, result.stdout_tail
    assert result.hosts["localhost"].state in (HostState.OK, HostState.CHANGED)
    for text in (result.stdout_tail, repr(result)):
        assert DECRYPTED not in text and VAULT_PASSWORD not in text and CLOUD_SECRET not in text
    seen: dict[str, str] = json.loads((project / "seen.json").read_text())
    return seen


def test_vaulted_variable_decrypts_with_the_vault_password_file(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(project / "vault-password"))
    seen = _run(project, monkeypatch)
    assert seen["vaulted"] == DECRYPTED
    assert seen["ansible_var"] == "passed-through"


def test_only_the_allowlist_and_ansible_variables_reach_the_playbook(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(project / "vault-password"))
    seen = _run(project, monkeypatch)
    assert seen["cloud"] == ""  # not ANSIBLE_*, not allowlisted: not in Ansible's environment
    assert seen["host_key_checking"] == "True"


def test_kept_artifacts_hold_no_secret_and_no_environment_value(
    project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(project / "vault-password"))
    _run(project, monkeypatch, keep=tmp_path / "kept")
    files = [p for p in (tmp_path / "kept").rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files)
    for path in files:
        text = path.read_text(errors="replace")
        for secret in (CLOUD_SECRET, VAULT_PASSWORD, DECRYPTED, str(project / "vault-password")):
            assert secret not in text, (path, secret)
    command = json.loads(next(p for p in files if p.name == "command").read_text())
    assert "ANSIBLE_VAULT_PASSWORD_FILE" in command["env"]  # the names stay, for whoever debugs the run
    assert set(command["env"].values()) == {"<redacted>"}


def test_without_the_vault_password_the_run_fails(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    result = run_playbook(project / "play.yml", project / "inventory")
    assert result.rc != 0
    assert "vault" in result.stdout_tail.lower()
