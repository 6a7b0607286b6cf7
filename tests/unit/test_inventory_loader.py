"""The inventory is read through Ansible's own loader, less the deep copy of freshly parsed, uncached data
(``inventory._fresh_loader_class``): the hosts it gives must be exactly those Ansible's stock DataLoader gives, for
every kind of inventory a fleet uses (YAML, INI, a directory, group_vars/host_vars, templated values)."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.transport import inventory

YAML_INVENTORY = """\
all:
  vars:
    admin_user: azureuser
  children:
    gpu:
      vars:
        ansible_user: "{{ admin_user }}"
        ansible_ssh_common_args: -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/etc/gpufleet/known_hosts
      hosts:
        gpu-1: {ansible_host: 10.0.0.4, gpu_expected_count: 8}
        gpu-2: {ansible_host: 10.0.0.5, ansible_port: 2222, ansible_become: false}
        gpu-3: {ansible_host: "{{ '10.0.0.' ~ (3 + 3) }}"}
"""

INI_INVENTORY = """\
[gpu]
gpu-a ansible_host=10.1.0.4 ansible_user=ubuntu
gpu-b ansible_host=10.1.0.5 ansible_port=2200

[gpu:vars]
ansible_ssh_private_key_file=/etc/gpufleet/id_ed25519
"""


def _stock(monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible.parsing.dataloader import DataLoader

    monkeypatch.setattr(inventory, "_fresh_loader_class", lambda: DataLoader)


def _both(monkeypatch: pytest.MonkeyPatch, source: Path, group: str) -> tuple[list[inventory.Host], list]:
    ours = inventory.load(source, group)
    with monkeypatch.context() as m:
        _stock(m)
        stock = inventory.load(source, group)
    return ours, stock


def test_yaml_with_group_vars_host_vars_and_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hosts.yml").write_text(YAML_INVENTORY)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "gpu-1.yml").write_text("ansible_port: 2022\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text("ansible_ssh_private_key_file: /etc/gpufleet/key\n")
    ours, stock = _both(monkeypatch, tmp_path / "hosts.yml", "gpu")
    assert ours == stock
    by_name = {h.name: h for h in ours}
    assert by_name["gpu-1"].port == 2022 and by_name["gpu-1"].user == "azureuser"  # host_vars, a rendered template
    assert by_name["gpu-3"].address == "10.0.0.6"  # a template in the address, rendered as Ansible renders it
    assert str(by_name["gpu-2"].key_file) == "/etc/gpufleet/key"  # group_vars


def test_ini_and_a_directory_of_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "10-gpu.ini").write_text(INI_INVENTORY)
    (tmp_path / "20-more.yml").write_text("gpu:\n  hosts:\n    gpu-c: {ansible_host: 10.1.0.6}\n")
    ours, stock = _both(monkeypatch, tmp_path, "gpu")
    assert ours == stock
    assert [h.name for h in ours] == ["gpu-a", "gpu-b", "gpu-c"]
    assert {h.user for h in ours} >= {"ubuntu"}


def test_two_loads_share_no_data(tmp_path: Path) -> None:
    # Nothing is cached between loads: an edited inventory is read afresh.
    source = tmp_path / "hosts.yml"
    source.write_text(YAML_INVENTORY)
    first = inventory.load(source, "gpu")
    source.write_text(YAML_INVENTORY.replace("10.0.0.4", "10.0.0.40"))
    second = inventory.load(source, "gpu")
    assert first[0].address == "10.0.0.4" and second[0].address == "10.0.0.40"


def test_the_ssh_plugin_by_its_short_name_gives_the_options_of_the_fully_qualified_one() -> None:
    # inventory._ssh_plugin asks for "ssh" (no routing metadata to read); the options must be those of
    # ansible.builtin.ssh for every spelling of the connection variables.
    from ansible.playbook.play_context import PlayContext
    from ansible.plugins.loader import connection_loader

    ours = inventory._ssh_plugin()
    fqcn = connection_loader.get("ansible.builtin.ssh", PlayContext(), None)
    assert type(ours).__name__ == type(fqcn).__name__ == "Connection"
    variables = [
        {},
        {"ansible_host": "10.0.0.4", "ansible_port": 2222, "ansible_user": "azureuser", "ansible_ssh_args": "-C",
         "ansible_ssh_common_args": "-o ProxyJump=bastion", "ansible_ssh_extra_args": "-o ServerAliveInterval=5",
         "ansible_ssh_private_key_file": "/etc/gpufleet/id_ed25519"},
        {"inventory_hostname": "gpu-9", "ansible_ssh_host": "10.0.0.9", "ansible_ssh_port": 22,
         "ansible_ssh_user": "ubuntu", "ansible_private_key_file": "/etc/gpufleet/key"},
    ]
    for var_options in variables:
        ours.set_options(var_options=var_options)
        fqcn.set_options(var_options=var_options)
        got = {key: ours.get_option(key) for key in inventory._SSH_OPTIONS}
        assert got == {key: fqcn.get_option(key) for key in inventory._SSH_OPTIONS}, var_options
    assert got["host"] == "10.0.0.9" and got["remote_user"] == "ubuntu"  # the last set really was read
