"""Hosts from an Ansible inventory: the one list of hosts and their vars, read with Ansible's own loader.

Ansible's ``InventoryManager`` reads every inventory form Ansible reads (YAML/INI files, directories, the
``azure.azcollection.azure_rm`` dynamic plugin), so the audit, the roles and AWX see the same hosts with the
same variables. SSH settings come from the usual connection variables; the known_hosts file from
``lab_known_hosts`` or ``UserKnownHostsFile=`` in ``ansible_ssh_common_args``.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InventoryError


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: Path | None = None
    known_hosts: Path | None = None
    vars: Mapping[str, Any] = field(default_factory=dict)

    @property
    def expected_gpu_count(self) -> int | None:
        value = self.vars.get("gpu_expected_count")
        if value in (None, ""):
            from .skus import expected_gpu_count

            return expected_gpu_count(self.vars.get("azure_vm_size"))
        return int(value)

    @property
    def expected_driver_version(self) -> str | None:
        value = self.vars.get("nvidia_driver_expected_version")
        return str(value) if value else None


def _known_hosts(hostvars: Mapping[str, Any]) -> Path | None:
    if hostvars.get("lab_known_hosts"):
        return Path(str(hostvars["lab_known_hosts"]))
    args = str(hostvars.get("ansible_ssh_common_args", "")) + " " + str(hostvars.get("ansible_ssh_extra_args", ""))
    for token in shlex.split(args):
        m = re.match(r"(?i)UserKnownHostsFile=(\S+)", token)
        if m:
            return Path(os.path.expanduser(m.group(1)))
    return None


def load(inventory: str | Path, group: str = "all", limit: str | Sequence[str] | None = None) -> list[Host]:
    """Hosts of ``group`` in the inventory, narrowed by ``limit`` (comma list of names or glob patterns)."""
    path = Path(inventory)
    if not path.exists():
        raise InventoryError(
            f"inventory {inventory} does not exist: pass --inventory PATH, or start the lab (`invoke lab.up`)"
            " which writes inventories/lab/hosts.yml"
        )
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        manager = InventoryManager(loader=loader, sources=[str(path)])
    except Exception as exc:  # ansible raises many types for an unreadable inventory
        raise InventoryError(f"inventory {inventory} cannot be read: {exc}") from None
    if group not in manager.groups:
        raise InventoryError(
            f"group {group!r} is not in inventory {inventory}; groups there: {', '.join(sorted(manager.groups))}"
        )
    variables = VariableManager(loader=loader, inventory=manager)
    hosts = sorted(manager.groups[group].get_hosts(), key=lambda h: _natural(h.name))
    if limit:
        patterns = [p.strip() for p in (limit.split(",") if isinstance(limit, str) else limit) if p.strip()]
        picked = [h for h in hosts if any(fnmatch.fnmatchcase(h.name, p) for p in patterns)]
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(h.name, p) for h in hosts)]
        if unmatched:
            raise InventoryError(f"--limit {','.join(unmatched)} matches no host of group {group!r} in {inventory}")
        hosts = picked
    out = []
    for h in hosts:
        hv = variables.get_vars(host=h, include_hostvars=False)
        key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
        out.append(
            Host(
                name=h.name,
                address=str(hv.get("ansible_host") or h.name),
                port=int(hv.get("ansible_port") or 22),
                user=str(hv.get("ansible_user") or "root"),
                key_file=Path(os.path.expanduser(str(key))) if key else None,
                known_hosts=_known_hosts(hv),
                vars={k: v for k, v in hv.items() if not k.startswith("ansible_") or k == "ansible_host"},
            )
        )
    return out


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
