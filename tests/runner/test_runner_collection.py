"""Playbooks by name from the collection gpufleet.remediation, and the run's own Ansible settings, whatever the
working directory holds.

A real ``ansible-playbook`` run through ``run_playbook`` against the controller itself (``ansible_connection=local``)
of a playbook in a stand-in collection under a temporary directory: no lab host needed.
"""

from __future__ import annotations

import configparser
import json
import os
import sys
from pathlib import Path

import pytest

from remediation.core.errors import RunnerError
from remediation.transport.runner import (
    ANSIBLE_SETTINGS,
    COLLECTION,
    HostState,
    _find_collection_playbook,
    _write_config,
    collections_first,
    collections_path,
    playbook_target,
    run_playbook,
)
from tests.conftest import ROOT

PLAYBOOK = """\
- name: What the run's Ansible sees
  hosts: all
  gather_facts: false
  tasks:
    - name: Write it
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0600"
        content: "{{ {'gathering': lookup('ansible.builtin.config', 'DEFAULT_GATHERING'),
                      'timeout': lookup('ansible.builtin.config', 'DEFAULT_TIMEOUT'),
                      'collections': lookup('ansible.builtin.config', 'COLLECTIONS_PATHS'),
                      'config': lookup('ansible.builtin.env', 'ANSIBLE_CONFIG'),
                      'playbook': playbook_dir} | to_json }}"
"""


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("driver_restore", f"{COLLECTION}.driver_restore"),
        ("playbooks/driver_restore.yml", f"{COLLECTION}.driver_restore"),
        (Path("playbooks/kernel_update.yml"), f"{COLLECTION}.kernel_update"),
        ("./playbooks/harden.yaml", f"{COLLECTION}.harden"),
        ("other.collection.site", "other.collection.site"),
    ],
)
def test_names_and_the_old_paths_mean_the_collections_playbooks(given: str | Path, target: str) -> None:
    assert playbook_target(given) == target


@pytest.mark.parametrize("given", ["../playbooks/harden.yml", "Harden", "roles/x/tasks/main.yml", "harden.yml", ""])
def test_anything_else_relative_is_refused(given: str) -> None:
    with pytest.raises(RunnerError, match="give a playbook name"):
        playbook_target(given)


def test_an_absolute_playbook_file_runs_as_it_is(tmp_path: Path) -> None:
    play = tmp_path / "play.yml"
    with pytest.raises(RunnerError, match="does not exist"):
        playbook_target(play)
    play.write_text(PLAYBOOK)
    assert playbook_target(play) == str(play)


@pytest.mark.parametrize("name", ["audit_timer", "driver_restore", "gpu_memory_log", "harden", "kernel_update",
                                  "remediate_timer"])
def test_the_checkout_collection_resolves_every_playbook(name: str) -> None:
    found = _find_collection_playbook(f"{COLLECTION}.{name}", [ROOT / "collections"])
    assert found is not None and found.resolve() == (ROOT / "playbooks" / f"{name}.yml").resolve()


def test_collections_path_order(tmp_path: Path) -> None:
    env = {"ANSIBLE_HOME": str(tmp_path / "ah")}
    assert collections_path(env)[-2:] == [tmp_path / "ah" / "collections", Path("/usr/share/ansible/collections")]
    env = {"ANSIBLE_COLLECTIONS_PATH": f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}"}
    with collections_first([tmp_path / "first"]), collections_first([tmp_path / "nested"]):
        paths = collections_path(env)
    # the innermost block first, then the outer ones (the suite's own: this checkout's collections/), then the user's
    assert paths == [tmp_path / "nested", tmp_path / "first", ROOT / "collections", tmp_path / "a", tmp_path / "b"]
    assert tmp_path / "nested" not in collections_path(env)  # the block ended


def test_the_runs_config_says_what_the_checkouts_ansible_cfg_says(tmp_path: Path) -> None:
    """Every setting of the checkout's ansible.cfg but its two relative paths (roles/, collections/: the run finds the
    roles in the collection and the collection on :func:`collections_path`) is in every run's own config."""
    checkout = configparser.ConfigParser()
    checkout.read(ROOT / "ansible.cfg")
    ours = configparser.ConfigParser()
    ours.read(_write_config(tmp_path / "ansible.cfg", [tmp_path / "c1", tmp_path / "c2"]))
    for section in checkout.sections():
        wanted = {k: v for k, v in checkout[section].items() if k not in ("roles_path", "collections_path")}
        assert dict(ours[section]) | wanted == dict(ours[section]), section
    assert ours["defaults"]["collections_path"] == f"{tmp_path / 'c1'}{os.pathsep}{tmp_path / 'c2'}"
    assert ours["defaults"]["host_key_checking"] == "True"


@pytest.fixture()
def collection(tmp_path: Path) -> Path:
    """A stand-in collection gpufleet.remediation with one playbook, in a collections directory of its own."""
    root = tmp_path / "colls" / "ansible_collections" / "gpufleet" / "remediation"
    (root / "playbooks").mkdir(parents=True)
    (root / "galaxy.yml").write_text("namespace: gpufleet\nname: remediation\nversion: 0.0.1\n")
    (root / "playbooks" / "whoami.yml").write_text(PLAYBOOK)
    return tmp_path / "colls"


def test_a_name_runs_the_collections_playbook_with_the_runs_own_settings(
    collection: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A working directory with an ansible.cfg that says otherwise: the run never reads it.
    work = tmp_path / "work"
    work.mkdir()
    (work / "ansible.cfg").write_text("[defaults]\ngathering = explicit\ntimeout = 7\n")
    monkeypatch.chdir(work)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.delenv("ANSIBLE_GATHERING", raising=False)
    monkeypatch.delenv("ANSIBLE_TIMEOUT", raising=False)
    out = tmp_path / "seen.json"
    inventory = tmp_path / "inventory"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable} out={out}\n")
    for given in ("whoami", "playbooks/whoami.yml"):
        with collections_first([collection]):
            result = run_playbook(given, inventory)
        assert result.rc == 0, result.stdout_tail
        assert result.hosts["localhost"].state in (HostState.OK, HostState.CHANGED)
        seen = json.loads(out.read_text())
        assert seen["playbook"] == str(collection / "ansible_collections" / "gpufleet" / "remediation" / "playbooks")
        assert seen["gathering"] == ANSIBLE_SETTINGS["defaults"]["gathering"] == "smart"
        assert seen["timeout"] == 30
        assert seen["collections"][0] == str(collection)
        assert seen["config"].endswith("/ansible.cfg") and "gpufleet-runner-" in seen["config"]
        out.unlink()


def test_a_name_no_collection_has_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", str(tmp_path / "empty"))
    with pytest.raises(RunnerError, match=r"playbook gpufleet\.remediation\.nope not found.*ansible-galaxy collection"):
        run_playbook("nope", tmp_path / "inventory")
