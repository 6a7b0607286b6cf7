"""What ``lab.up`` writes so that Ansible, Fabric and plain ``ssh -F`` reach the lab the same way.

* ``inventories/lab/hosts.yml``: group ``gpu``; per host its address, the lab's client key, and the lab's
  known_hosts with strict host key checking (no client ever turns host key checks off).
* ``inventories/lab/ssh_config``: the same, for ``ssh -F inventories/lab/ssh_config gpu-1``.
* ``<state>/ssh/known_hosts``: each host's own ed25519 key under its name and its address.

All three are generated from data (YAML dumper / fixed line formats), never from user text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from remediation.core.skus import expected_gpu_count

from . import packages
from .config import HOST_SETTINGS, LOGIN_USER, LabConfig, LabPaths


@dataclass(frozen=True)
class LabHost:
    name: str
    index: int
    address: str
    host_key: str  # "ssh-ed25519 AAAA..."
    driver_branch: str = packages.DRIVER_BRANCH  # the NVIDIA driver branch installed on the host


def host_vars(cfg: LabConfig, paths: LabPaths, host: LabHost) -> dict[str, object]:
    return {
        "ansible_host": host.address,
        "ansible_port": 22,
        # Azure images: log in as the image's user, escalate with sudo (passwordless, cloud-init's rule).
        "ansible_user": LOGIN_USER,
        "ansible_become": True,
        "ansible_ssh_private_key_file": str(paths.client_key),
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={paths.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
        ),
        "ansible_python_interpreter": "/usr/bin/python3",
        "lab_known_hosts": str(paths.known_hosts),
        "azure_vm_size": cfg.sku,
        "gpu_expected_count": expected_gpu_count(cfg.sku),
        "nvidia_driver_branch": host.driver_branch,
        **{k: v for k, v in cfg.host_overrides.get(host.name, {}).items() if k not in HOST_SETTINGS},
    }


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def write(cfg: LabConfig, paths: LabPaths, hosts: list[LabHost]) -> Path:
    inventory = {
        "all": {
            "children": {
                "gpu": {
                    "hosts": {h.name: host_vars(cfg, paths, h) for h in hosts},
                    "vars": {
                        "nvidia_driver_branch": packages.DRIVER_BRANCH,
                        "nvidia_driver_expected_version": packages.BOOT_DRIVER,
                        "driver_restore_method": "apt",
                        "gpu_lab": True,
                    },
                }
            }
        }
    }
    header = "# Written by `invoke lab.up` for the simulated lab fleet; regenerated on every lab.up.\n"
    # libyaml's emitter when PyYAML has it: the pure-Python one takes ~4 s for a 1,000-host inventory.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    _atomic_write(cfg.inventory_path, header + yaml.dump(inventory, Dumper=dumper, sort_keys=False))
    _atomic_write(paths.known_hosts, "".join(f"{h.name},{h.address} {h.host_key}\n" for h in hosts), 0o644)
    blocks = []
    for h in hosts:
        blocks.append(
            f"Host {h.name}\n  HostName {h.address}\n  Port 22\n  User {LOGIN_USER}\n"
            f"  IdentityFile {paths.client_key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {paths.known_hosts}\n  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n  ConnectTimeout 5\n"
        )
    ssh_config = "# Written by `invoke lab.up`.\n" + "\n".join(blocks)
    _atomic_write(paths.ssh_config, ssh_config)
    _atomic_write(cfg.inventory_path.parent / "ssh_config", ssh_config)
    return cfg.inventory_path
