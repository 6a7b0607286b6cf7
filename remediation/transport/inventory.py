"""Hosts from an Ansible inventory: the one list of hosts and their vars, read with Ansible's own loader.

Ansible's ``InventoryManager`` reads every inventory form Ansible reads (YAML/INI files, directories, the
``azure.azcollection.azure_rm`` dynamic plugin), so the audit, the roles and AWX see the same hosts with the
same variables. The SSH settings are what Ansible's own ``ssh`` connection plugin resolves for each host (its
variables, ``ansible.cfg`` and ``ANSIBLE_*`` settings, Jinja templates in them rendered): ``ansible_host``,
``ansible_port``, ``ansible_user``, ``ansible_ssh_private_key_file``, ``ssh_args``,
``ansible_ssh_common_args`` and ``ansible_ssh_extra_args``, read with ssh's grammar by
:func:`remediation.transport.sshopts.ssh_target` (ProxyJump, ProxyCommand, known_hosts files, identities).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remediation.core.errors import InventoryError
from remediation.transport.sshopts import SshOptions, port_number, ssh_target


@dataclass(frozen=True)
class Become:
    """Whether and how the fan-out escalates privilege on a host (Ansible's ``become`` settings).

    ``enabled`` follows ``ansible_become`` when the inventory sets it, else ``ANSIBLE_BECOME`` / ansible.cfg's
    ``[privilege_escalation] become`` when set there; when neither is set, it is on exactly when the SSH login user
    is not root, as the project's playbooks do (``become: "{{ ansible_user != 'root' }}"``): the probe cannot read
    other users' ``/proc/<pid>/fd`` without it. ``source`` names what decided, for messages."""

    enabled: bool = False
    method: str = "sudo"
    user: str = "root"
    source: str = "the login user (root)"


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int = 22
    user: str = "root"
    vars: Mapping[str, Any] = field(default_factory=dict)
    ssh: SshOptions = field(default_factory=SshOptions)
    become: Become = field(default_factory=Become)

    @property
    def key_file(self) -> Path | None:
        """The first identity file the inventory names (``ansible_ssh_private_key_file`` or ``-i``)."""
        return self.ssh.identity_files[0] if self.ssh.identity_files else None

    @property
    def known_hosts(self) -> Path | None:
        """The first ``UserKnownHostsFile`` the inventory names."""
        return self.ssh.user_known_hosts[0] if self.ssh.user_known_hosts else None

    @property
    def expected_gpu_count(self) -> int | None:
        value = self.vars.get("gpu_expected_count")
        if value in (None, ""):
            from remediation.core.skus import expected_gpu_count

            return expected_gpu_count(self.vars.get("azure_vm_size"))
        return int(value)

    @property
    def expected_driver_version(self) -> str | None:
        value = self.vars.get("nvidia_driver_expected_version")
        return str(value) if value else None


_SSH_OPTIONS = ("host", "port", "remote_user", "private_key_file", "ssh_args", "ssh_common_args", "ssh_extra_args")
_plugins_ready = False


def _ssh_plugin() -> Any:
    """Ansible's ``ssh`` connection plugin: it resolves each host's options (vars > env > ansible.cfg).

    Asked for by its short name, as ansible-playbook asks for its default connection: the fully qualified
    ``ansible.builtin.ssh`` makes the loader read ansible.builtin's routing metadata first (a large YAML file, parsed
    in pure Python: about 0.3 s of every command's start, half of reading a 30-host inventory). Same plugin, same
    options (``tests/unit/test_inventory_loader.py``)."""
    global _plugins_ready
    from ansible.playbook.play_context import PlayContext
    from ansible.plugins.loader import connection_loader, init_plugin_loader

    if not _plugins_ready:
        init_plugin_loader()
        _plugins_ready = True
    plugin = connection_loader.get("ssh", PlayContext(), None)
    if plugin is None:
        raise InventoryError("Ansible's ssh connection plugin cannot be loaded: reinstall ansible-core (./run setup)")
    return plugin


def _connection_options(
    plugin: Any, loader: Any, name: str, hostvars: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ssh plugin's options for one host, its ``ansible_*`` variables), Jinja templates rendered as Ansible
    renders them."""
    from ansible.template import Templar

    templar = None
    var_options: dict[str, Any] = {}
    for key, value in hostvars.items():
        if not (key.startswith("ansible_") or key == "inventory_hostname"):
            continue
        if not (isinstance(value, str) and ("{{" in value or "{%" in value)):
            var_options[key] = value
            continue
        templar = templar or Templar(loader=loader, variables=dict(hostvars))
        try:
            var_options[key] = templar.template(value)
        except Exception as exc:  # AnsibleUndefinedVariable and friends
            raise InventoryError(f"host {label(name)}: {key} cannot be rendered: {exc}") from None
    try:
        plugin.set_options(var_options=var_options)
        return {key: plugin.get_option(key) for key in _SSH_OPTIONS}, var_options
    except Exception as exc:
        raise InventoryError(f"host {label(name)}: Ansible's ssh connection options are not usable: {exc}") from None


@functools.cache
def _fresh_loader_class() -> type:
    from ansible.parsing.dataloader import DataLoader

    class FreshDataLoader(DataLoader):  # type: ignore[misc]  # Ansible's classes are untyped here
        """Ansible's DataLoader without the deep copy of data it has just parsed and not cached.

        ``load_from_file`` deep-copies what it returns so that callers never share its file cache; with
        ``cache='none'`` (how the auto and yaml inventory plugins read an inventory file) nothing was cached and the
        copy protects nothing. With Ansible's data tags on every node it was half the time of reading a 1,000-host
        inventory (1.7 of 3.3 CPU seconds)."""

        def load_from_file(self, file_name: str, cache: str = "all", unsafe: bool = False, **kwargs: Any) -> Any:
            return super().load_from_file(file_name, cache=cache, unsafe=unsafe or cache == "none", **kwargs)

    return FreshDataLoader


def load(inventory: str | Path, group: str = "all", limit: str | Sequence[str] | None = None) -> list[Host]:
    """Hosts of ``group`` in the inventory, narrowed by ``limit`` (comma list of names or glob patterns)."""
    path = Path(inventory)
    if not path.exists():
        raise InventoryError(
            f"inventory {inventory} does not exist: pass --inventory PATH, or start the lab (`invoke lab.up`)"
            " which writes inventories/lab/hosts.yml"
        )
    from ansible.inventory.manager import InventoryManager
    from ansible.vars.manager import VariableManager

    loader = _fresh_loader_class()()
    try:
        manager = InventoryManager(loader=loader, sources=[str(path)])
    except Exception as exc:  # ansible raises many types for an unreadable inventory
        raise InventoryError(f"inventory {inventory} cannot be read: {exc}") from None
    if group not in manager.groups:
        raise InventoryError(
            f"group {group!r} is not in inventory {inventory}; groups there: {', '.join(sorted(manager.groups))}"
        )
    variables = VariableManager(loader=loader, inventory=manager)
    plugin = _ssh_plugin()
    hosts = sorted(manager.groups[group].get_hosts(), key=lambda h: _natural(h.name))
    if limit:
        patterns = [p.strip() for p in (limit.split(",") if isinstance(limit, str) else limit) if p.strip()]
        picked = [h for h in hosts if any(fnmatch.fnmatchcase(h.name, p) for p in patterns)]
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(h.name, p) for h in hosts)]
        if unmatched:
            raise InventoryError(f"--limit {','.join(unmatched)} matches no host of group {group!r} in {inventory}")
        hosts = picked
    return [host_from_vars(plugin, loader, h.name, variables.get_vars(host=h, include_hostvars=False)) for h in hosts]


def host_from_vars(plugin: Any, loader: Any, name: str, hv: Mapping[str, Any]) -> Host:
    """One inventory host from its variables: the ssh plugin's options read with ssh's grammar."""
    opts, rendered = _connection_options(plugin, loader, name, hv)
    port = opts["port"]
    if port not in (None, "") and not (isinstance(port, int) or (isinstance(port, str) and port_number(port))):
        raise InventoryError(f"host {label(name)}: ansible_port {port!r} is not a port number; fix the inventory")
    target = ssh_target(
        host=str(opts["host"] or name),
        port=int(port) if port not in (None, "") else None,
        user=str(opts["remote_user"]) if opts["remote_user"] else None,
        private_key_file=str(opts["private_key_file"]) if opts["private_key_file"] else None,
        ssh_args=str(opts["ssh_args"] or ""),
        common_args=str(opts["ssh_common_args"] or ""),
        extra_args=str(opts["ssh_extra_args"] or ""),
        where=f"host {label(name)}",
        host_var=_host_var(hv),
    )
    return Host(
        name=name,
        address=target.host,
        port=target.port,
        user=target.user,
        vars={k: v for k, v in hv.items() if not k.startswith("ansible_") or k == "ansible_host"},
        ssh=target.options,
        become=become_settings(name, rendered, target.user),
    )


def become_settings(name: str, variables: Mapping[str, Any], login_user: str) -> Become:
    """A host's :class:`Become` from its (rendered) variables, Ansible's configuration and the login user."""
    from ansible import constants as C
    from ansible.module_utils.parsing.convert_bool import boolean

    value = variables.get("ansible_become")
    if value is not None:
        try:
            enabled, source = boolean(value, strict=True), "ansible_become"
        except TypeError:
            raise InventoryError(
                f"host {label(name)}: ansible_become {value!r} is not a boolean; write true or false"
            ) from None
    elif C.config.get_config_value_and_origin("DEFAULT_BECOME")[1] != "default":
        enabled, source = bool(C.DEFAULT_BECOME), "ANSIBLE_BECOME / ansible.cfg become"
    else:
        enabled, source = login_user != "root", f"the login user ({login_user})"
    method = variables.get("ansible_become_method") or C.DEFAULT_BECOME_METHOD
    user = variables.get("ansible_become_user") or C.DEFAULT_BECOME_USER
    return Become(enabled, str(method), str(user), source)


def label(name: str) -> str:
    """An inventory host name as it may appear in a one-line message: quoted when it has spaces or controls."""
    return name if name and all(ch.isprintable() and not ch.isspace() for ch in name) else repr(name)


def _host_var(hostvars: Mapping[str, Any]) -> str:
    """The variable the ssh plugin takes the address from (the last of its ``vars:`` set wins)."""
    return next((k for k in ("ansible_ssh_host", "ansible_host") if hostvars.get(k)), "inventory_hostname")


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
