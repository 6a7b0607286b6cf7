"""Lab settings and the paths that follow from them.

Values come from the ``lab:`` section of ``invoke.yaml`` (or ``INVOKE_LAB_*`` variables); a flag on a task wins
over the config, the config over these defaults. ``GPULAB_STATE_DIR`` and ``GPULAB_CACHE_DIR`` override the
directories, so that tests and several clones can share one cached base.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import LabError

MAX_HOSTS = 1000
#: Hosts per /24: host N of a lab on prefix ``a.b.c`` listens on ``a.b.(c + (N-1) // 254).((N-1) % 254 + 1)``, so
#: a lab of up to 254 hosts stays in ``a.b.c.1-254`` and 1,000 hosts take four /24s (``a.b.c`` .. ``a.b.c+3``).
HOSTS_PER_NET = 254
DEFAULT_SKU = "Standard_NC48ads_A100_v4"
FLAVOURS = ("generic", "azure")
DRIVER_BRANCHES = ("535", "535-server", "535-open")  # lab/packages.py offers these
DEFAULT_DRIVER_BRANCH = "535"
#: Ubuntu releases a lab host can run (lab/packages.py builds one repository and base root per release).
RELEASES = ("jammy", "noble")
DEFAULT_RELEASE = "jammy"
#: Per-host settings of ``host_overrides`` that the lab itself reads (not Ansible variables).
HOST_SETTINGS = ("release", "pynvml")
#: Where an image with the NVIDIA Python bindings has them (Debian's and Ubuntu's ``python3-*`` path).
PYNVML_PATH = "/usr/lib/python3/dist-packages/pynvml.py"


def default_flavour(sku: str) -> str:
    """The kernel flavour a host of that VM size runs: Ubuntu on Azure (``Standard_*``) runs ``linux-azure``."""
    return "azure" if sku.startswith("Standard_") else "generic"


def test_prefix(prefix: str) -> str:
    """A fixed test/benchmark prefix ``127.0.X``, moved to ``127.N.X`` when ``GPULAB_NET=N`` is set.

    Tests, Molecule scenarios and benchmarks use fixed loopback prefixes; two checkouts that run them at the same
    time on one machine each set their own ``GPULAB_NET`` (1-254) so their hosts never share an address.
    """
    net = os.environ.get("GPULAB_NET", "").strip()
    if not net:
        return prefix
    if not net.isdigit() or not 1 <= int(net) <= 254:
        raise LabError(f"GPULAB_NET={net!r} must be a number from 1 to 254 (the second octet of 127.N.X)")
    first, _second, third = prefix.split(".")
    return f"{first}.{int(net)}.{third}"


#: The login user of every lab host, as on an Azure Ubuntu image: key-only, passwordless sudo (cloud-init's
#: ``90-cloud-init-users`` rule); root's key only prints cloud-init's "Please login as the user" and exits 142.
LOGIN_USER = "azureuser"
LOGIN_UID = 1000


@dataclass(frozen=True)
class LabConfig:
    state_dir: Path = Path(".lab")
    cache_dir: Path | None = None  # default: <state_dir>/cache
    address_prefix: str = "127.0.1"  # host N listens on <prefix>.N:22
    mirror: str = "http://deb.debian.org/debian"
    suite: str = "bookworm"
    sku: str = DEFAULT_SKU
    flavour: str = ""  # kernel flavour of new hosts: generic | azure; empty: from the VM size (Azure: azure)
    secure_boot: bool = False  # new hosts are Trusted Launch VMs (Secure Boot on)
    driver_branch: str = ""  # NVIDIA driver branch of new hosts: 535 | 535-server | 535-open; empty: 535
    release: str = DEFAULT_RELEASE  # Ubuntu release of new hosts: jammy (22.04) | noble (24.04)
    # New hosts' image has the NVIDIA Python bindings (pynvml in dist-packages); false: as a stock Azure Ubuntu
    # image with the NVIDIA driver, which has none (host_overrides.<host>.pynvml wins).
    pynvml: bool = True
    boot_delay: float = 1.0  # seconds a rebooting host stays down
    ready_timeout: float = 30.0  # seconds lab.up waits for every sshd (per 100 hosts, for a lab of more than 100)
    inventory_path: Path = Path("inventories/lab/hosts.yml")
    host_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def cache(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.state_dir / "cache"

    def address(self, index: int) -> str:
        """Host ``index``'s loopback address: 254 hosts per /24, then the next /24 (see ``HOSTS_PER_NET``)."""
        first, second, third = self.address_prefix.split(".")
        net, host = divmod(index - 1, HOSTS_PER_NET)
        return f"{first}.{second}.{int(third) + net}.{host + 1}"

    def address_nets(self, count: int) -> list[str]:
        """The /24 prefixes a lab of ``count`` hosts listens on (one per 254 hosts, from ``address_prefix`` on)."""
        first, second, third = self.address_prefix.split(".")
        return [f"{first}.{second}.{int(third) + n}" for n in range((count - 1) // HOSTS_PER_NET + 1)]

    def check_count(self, count: int) -> None:
        """One clear line when ``count`` hosts cannot run: above ``MAX_HOSTS`` or past the end of the prefix's /16."""
        if not 1 <= count <= MAX_HOSTS:
            raise LabError(f"--hosts {count} is out of range: the lab runs 1 to {MAX_HOSTS} hosts")
        last = self.address_nets(count)[-1]
        if int(last.split(".")[2]) > 255:
            raise LabError(
                f"--hosts {count} on lab.address_prefix {self.address_prefix} would need addresses up to {last}.x,"
                f" past the end of {'.'.join(last.split('.')[:2])}.255.x (254 hosts per /24): use a lower third"
                " octet in lab.address_prefix or fewer hosts"
            )

    def host_flavour(self, flavour: str | None = None) -> str:
        """The flavour new hosts get: the flag, else ``lab.flavour``, else the VM size's."""
        chosen = flavour or self.flavour or default_flavour(self.sku)
        if chosen not in FLAVOURS:
            raise LabError(
                f"kernel flavour {chosen!r} (--flavour or lab.flavour) is not one the lab has;"
                f" use one of: {', '.join(FLAVOURS)}"
            )
        return chosen

    def host_driver_branch(self, name: str, branch: str | None = None) -> str:
        """The driver branch host ``name`` gets when it is created: ``nvidia_driver_branch`` in its
        ``host_overrides`` (the inventory says that one, so the host must have it), else the flag, else
        ``lab.driver_branch``, else 535."""
        override = self.host_overrides.get(name, {}).get("nvidia_driver_branch")
        chosen = str(override or branch or self.driver_branch or DEFAULT_DRIVER_BRANCH)
        if chosen not in DRIVER_BRANCHES:
            where = f"host_overrides.{name}.nvidia_driver_branch" if override else "--driver-branch, lab.driver_branch"
            raise LabError(
                f"driver branch {chosen!r} ({where}) is not one the lab has; use one of: {', '.join(DRIVER_BRANCHES)}"
            )
        return chosen

    def host_release(self, name: str, release: str | None = None) -> str:
        """The Ubuntu release a new host gets: ``host_overrides[<host>].release``, else the flag (``lab.up
        --release``), else ``lab.release``."""
        override = self.host_overrides.get(name, {}).get("release")
        chosen = str(override or release or self.release)
        if chosen not in RELEASES:
            where = f"host_overrides.{name}.release" if override else "--release or lab.release"
            raise LabError(
                f"Ubuntu release {chosen!r} ({where}) is not one the lab has; use one of: {', '.join(RELEASES)}"
            )
        return chosen

    def host_pynvml(self, name: str) -> bool:
        """Whether new host ``name``'s image has pynvml: ``host_overrides[<host>].pynvml``, else ``lab.pynvml``."""
        settings = self.host_overrides.get(name, {})
        if "pynvml" not in settings:
            return self.pynvml
        value = settings["pynvml"]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise LabError(
            f"host_overrides.{name}.pynvml is {value!r}: use true (the image has pynvml) or false (it has none)"
        )

    def validate(self) -> LabConfig:
        if self.flavour:
            self.host_flavour()
        if self.driver_branch:
            self.host_driver_branch("")
        for name, overrides in self.host_overrides.items():
            if "nvidia_driver_branch" in overrides:
                self.host_driver_branch(name)
        if self.release not in RELEASES:
            raise LabError(
                f"lab.release {self.release!r} is not an Ubuntu release the lab has; use one of: {', '.join(RELEASES)}"
            )
        for name, settings in self.host_overrides.items():
            if "release" in settings:
                self.host_release(str(name))
            self.host_pynvml(str(name))
        try:
            net = ipaddress.ip_address(f"{self.address_prefix}.1")
        except ValueError:
            raise LabError(
                f"lab.address_prefix {self.address_prefix!r} is not the first three octets of an IPv4 address;"
                " use e.g. 127.0.1"
            ) from None
        if not net.is_loopback:
            raise LabError(
                f"lab.address_prefix {self.address_prefix!r} is not in 127.0.0.0/8: lab hosts only listen on"
                " loopback addresses; use e.g. 127.0.1"
            )
        return self

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, root: Path | None = None) -> LabConfig:
        """Build from the ``lab`` config mapping; relative paths are taken from ``root`` (the project)."""
        data = dict(data or {})
        root = root or Path.cwd()
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LabError(f"unknown lab setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cfg = cls(**data)
        state = Path(os.environ.get("GPULAB_STATE_DIR") or cfg.state_dir)
        cache_env = os.environ.get("GPULAB_CACHE_DIR")
        cache = Path(cache_env) if cache_env else (Path(cfg.cache_dir) if cfg.cache_dir else None)
        inventory = Path(cfg.inventory_path)
        cfg = replace(
            cfg,
            state_dir=(state if state.is_absolute() else root / state).resolve(),
            cache_dir=None if cache is None else (cache if cache.is_absolute() else root / cache).resolve(),
            inventory_path=(inventory if inventory.is_absolute() else root / inventory).resolve(),
            boot_delay=float(cfg.boot_delay),
            ready_timeout=float(cfg.ready_timeout),
            secure_boot=_bool(cfg.secure_boot),
            pynvml=_bool(cfg.pynvml),
            driver_branch=str(cfg.driver_branch or ""),
            release=str(cfg.release).strip().lower(),
        )
        return cfg.validate()


def _bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@dataclass(frozen=True)
class LabPaths:
    """Where everything of one lab lives (all under the state directory except the shared cache)."""

    config: LabConfig

    @property
    def state(self) -> Path:
        return self.config.state_dir

    @property
    def hosts(self) -> Path:
        return self.state / "hosts"

    def host(self, name: str) -> Path:
        return self.hosts / name

    @property
    def ssh(self) -> Path:
        return self.state / "ssh"

    @property
    def client_key(self) -> Path:
        return self.ssh / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.ssh / "config"

    @property
    def supervisor_pid(self) -> Path:
        return self.state / "supervisor.pid"

    @property
    def supervisor_socket(self) -> Path:
        return self.state / "supervisor.sock"

    @property
    def supervisor_log(self) -> Path:
        return self.state / "supervisor.log"

    @property
    def lock(self) -> Path:
        return self.state / "lab.lock"
