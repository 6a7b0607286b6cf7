"""The lab's verbs: up, down, status, reboot, fault, clear. ``tasks.py`` calls these and nothing else.

Every verb checks its input before it changes anything, raises ``LabError`` (one line naming the input and
the fix) on bad input, and returns frozen results that the task renders.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from . import hardware, inventory, packages
from .base import Base, ensure_base, ensure_release
from .config import LOGIN_UID, LOGIN_USER, PYNVML_PATH, LabConfig, LabPaths
from .errors import LabError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: What cloud-init (disable_root: true, Ubuntu's default) puts before root's key: a root login prints this and exits.
ROOT_KEY_OPTIONS = (
    'no-port-forwarding,no-agent-forwarding,no-X11-forwarding,command="echo \'Please login as the user \\"{user}\\"'
    ' rather than the user \\"root\\".\';echo;sleep 10;exit 142"'
)


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    state: str  # up | rebooting | down | crashed | unknown
    ssh: bool
    kernel: str | None
    boot_id: str | None
    boots: int
    faults: tuple[str, ...]
    flavour: str = "generic"
    secure_boot: bool = False
    release: str = "jammy"
    pynvml: bool = True  # the image has the NVIDIA Python bindings (lab.pynvml, host_overrides.<host>.pynvml)


@dataclass(frozen=True)
class UpResult:
    hosts: tuple[str, ...]
    started: tuple[str, ...]
    removed: tuple[str, ...]
    inventory: Path
    seconds: float
    base_built: bool


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (overlay mounts, namespaces, chroot): run it as root, e.g. `sudo invoke lab.up`"
        )


def host_name(index: int) -> str:
    return f"gpu-{index}"


class Lab:
    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg
        self.paths = LabPaths(cfg)

    # -- locking and the supervisor ----------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        self.paths.state.mkdir(parents=True, exist_ok=True)
        with self.paths.lock.open("w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def supervisor_pid(self) -> int | None:
        try:
            pid = int(self.paths.supervisor_pid.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if b"lab.supervisor" in cmdline else None

    def running_base(self) -> Path | None:
        """The base image the running supervisor boots hosts from (None when no supervisor runs)."""
        pid = self.supervisor_pid()
        if pid is None:
            return None
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            return Path(args[args.index(b"lab.supervisor") + 2].decode())
        except (OSError, ValueError, IndexError):
            return None

    def request(self, op: str, hosts: Sequence[str] = (), timeout: float = 60.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect(str(self.paths.supervisor_socket))
            except OSError as exc:
                raise LabError(
                    f"the lab supervisor is not running ({exc}): start the lab with `invoke lab.up`"
                ) from None
            s.sendall(json.dumps({"op": op, "hosts": list(hosts)}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        reply: dict[str, Any] = json.loads(data or b"{}")
        if not reply.get("ok"):
            raise LabError(f"lab supervisor refused {op}: {reply.get('error')}")
        return reply

    def start_supervisor(self, base: Base) -> None:
        if self.supervisor_pid() is not None:
            return
        log = self.paths.supervisor_log.open("ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH", "")]))
        # setsid --fork: the supervisor is nobody's child here, so it outlives this command and leaves no zombie.
        subprocess.run(
            [
                "setsid",
                "--fork",
                sys.executable,
                "-m",
                "lab.supervisor",
                str(self.paths.state),
                str(base.path),
                str(self.cfg.boot_delay),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(PROJECT_ROOT),
            env=env,
            check=True,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.paths.supervisor_socket.exists() and self.supervisor_pid() is not None:
                return
            time.sleep(0.02)
        raise LabError(f"the lab supervisor did not start; see {self.paths.supervisor_log}")

    # -- hosts on disk -------------------------------------------------------------------------------------
    def existing_hosts(self) -> list[str]:
        if not self.paths.hosts.is_dir():
            return []
        names = [p.name for p in self.paths.hosts.iterdir() if (p / "host.json").exists()]
        return sorted(names, key=lambda n: int(n.split("-")[1]))

    def spec(self, name: str) -> dict[str, Any]:
        path = self.paths.host(name) / "host.json"
        if not path.exists():
            known = ", ".join(self.existing_hosts()) or "none (run `invoke lab.up`)"
            raise LabError(f"host {name!r} is not in the lab at {self.paths.state}; lab hosts: {known}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def _client_key(self) -> None:
        key = self.paths.client_key
        if key.exists():
            return
        self.paths.ssh.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpulab-controller", "-f", str(key)], check=True
        )

    def create_host(
        self, index: int, flavour: str = "generic", secure_boot: bool = False, driver_branch: str = "",
        release: str = "jammy", pynvml: bool = True,
    ) -> None:
        """Create a host's disk, keys and firmware. Its kernel flavour, Ubuntu release, Trusted Launch setting,
        driver branch and whether its image has pynvml are fixed here (the branch is installed once the host runs:
        :meth:`provision_driver_branch`)."""
        name = host_name(index)
        hdir = self.paths.host(name)
        keys = hdir / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        if not (keys / "ssh_host_ed25519_key").exists():
            _write_host_key(keys / "ssh_host_ed25519_key", f"root@{name}")
        self._fresh_upper(name, index, pynvml)
        (hdir / "hw").mkdir(exist_ok=True)
        hardware.write_state(hdir / "hw/gpus", hardware.healthy_state(name, self.cfg.sku))
        (hdir / "faults").write_text("")
        spec = {
            "name": name,
            "index": index,
            "address": self.cfg.address(index),
            "sku": self.cfg.sku,
            "flavour": flavour,
            "secure_boot": secure_boot,
            "driver_branch": packages.check_branch(driver_branch or packages.DRIVER_BRANCH),
            "release": release,
            "pynvml": pynvml,
        }
        # A Trusted Launch host is provisioned with Secure Boot off (its signed NVIDIA module is installed first,
        # see provision_signed_module), then turned on.
        self.set_firmware(name, secure_boot=False)
        (hdir / "panic-above").unlink(missing_ok=True)
        (hdir / "host.json").write_text(json.dumps(spec, indent=2) + "\n")

    def _fresh_upper(self, name: str, index: int, pynvml: bool = True) -> None:
        hdir = self.paths.host(name)
        for d in ("upper", "work"):
            if (hdir / d).exists():
                shutil.rmtree(hdir / d)
            (hdir / d).mkdir()
        (hdir / "root").mkdir(exist_ok=True)
        up = hdir / "upper"
        (up / "etc/ssh/sshd_config.d").mkdir(parents=True)
        (up / "etc/hostname").write_text(name + "\n")
        (up / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n{self.cfg.address(index)}\t{name}\n")
        (up / "etc/ssh/sshd_config.d/20-gpulab-listen.conf").write_text(f"ListenAddress {self.cfg.address(index)}\n")
        if not pynvml:
            # An image without the NVIDIA Python bindings: an overlay whiteout (a 0:0 character device in the
            # upper directory) hides the base's pynvml.py, so the host has no such file, as a stock image has none.
            gone = up / PYNVML_PATH.lstrip("/")
            gone.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(gone, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        for suffix in ("", ".pub"):
            src = hdir / "keys" / f"ssh_host_ed25519_key{suffix}"
            dst = up / "etc/ssh" / src.name
            shutil.copyfile(src, dst)
            dst.chmod(0o600 if not suffix else 0o644)
        key = self.paths.client_key.with_suffix(".pub").read_text().strip()
        # The login user's key, as cloud-init writes it from the VM's admin SSH key.
        home = up / "home" / LOGIN_USER
        for path, mode in ((home, 0o750), (home / ".ssh", 0o700)):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)
            os.chown(path, LOGIN_UID, LOGIN_UID)
        (home / ".ssh/authorized_keys").write_text(key + "\n")
        (home / ".ssh/authorized_keys").chmod(0o600)
        os.chown(home / ".ssh/authorized_keys", LOGIN_UID, LOGIN_UID)
        # Root: cloud-init's disable_root: the same key, forced to a message and exit 142 (no forwarding either).
        ssh = up / "root/.ssh"
        ssh.mkdir(parents=True)
        ssh.chmod(0o700)
        (ssh / "authorized_keys").write_text(ROOT_KEY_OPTIONS.format(user=LOGIN_USER) + " " + key + "\n")
        (ssh / "authorized_keys").chmod(0o600)

    def set_firmware(self, name: str, secure_boot: bool) -> None:
        """The host's firmware settings (Secure Boot), read by the boot loader at the host's next boot."""
        path = self.paths.host(name) / "firmware.json"
        tmp = path.with_name(".firmware.json.tmp")
        tmp.write_text(json.dumps({"secure_boot": secure_boot}) + "\n")
        os.replace(tmp, path)

    def firmware(self, name: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.paths.host(name) / "firmware.json").read_text())
        except (OSError, ValueError):
            return {}
        return data

    def flavour(self, name: str) -> str:
        return str(self.spec(name).get("flavour", "generic"))

    def release(self, name: str) -> str:
        """The host's Ubuntu release (jammy or noble), fixed when it was created."""
        return str(self.spec(name).get("release", "jammy"))

    def driver_branch(self, name: str) -> str:
        return str(self.spec(name).get("driver_branch") or packages.DRIVER_BRANCH)

    def provision_driver_branch(self, name: str, reboot: bool = True) -> None:
        """Install the host's driver branch in place of the base image's ``535``, as the VM's provisioning
        would have installed it: apt swaps the packages (they conflict through the virtual names Ubuntu's
        provide), DKMS builds the new branch's module; the host reboots to load it unless ``reboot`` is False
        (a Trusted Launch host reboots once its signed module is in, :meth:`provision_signed_module`)."""
        branch = self.driver_branch(name)
        if branch == packages.DRIVER_BRANCH:
            return
        ver = packages.driver_version(packages.BOOT_DRIVER, self.release(name))
        shared, old_shared = packages.common_branch(branch), packages.common_branch(packages.DRIVER_BRANCH)
        userspace = ("nvidia-utils", "libnvidia-compute", "nvidia-kernel-common")
        install = [f"nvidia-driver-{branch}={ver}", f"nvidia-dkms-{branch}={ver}"]
        remove = [f"nvidia-driver-{packages.DRIVER_BRANCH}-", f"nvidia-dkms-{packages.DRIVER_BRANCH}-"]
        if shared != old_shared:
            install += [f"{n}-{shared}={ver}" for n in userspace]
            remove += [f"{n}-{old_shared}-" for n in userspace]
        self.run_in_host(name, ["apt-get", "install", "-y", "-q", *install, *remove])
        # As a fresh install leaves them: only the driver package itself is marked manual.
        auto = [f"nvidia-dkms-{branch}", *(f"{n}-{shared}" for n in userspace)]
        self.run_in_host(name, ["apt-mark", "auto", *auto])
        if reboot:
            self.reboot(name)

    def provision_signed_module(self, name: str) -> None:
        """Make a host a Trusted Launch one: the signed NVIDIA module package of its driver branch for its booted
        kernel (built for the installed driver) replaces the DKMS build of that kernel (DKMS stays registered),
        Secure Boot is turned on, the host reboots."""
        flavour = self.flavour(name)
        release, driver = packages.boot_kernel(flavour, self.release(name)), packages.BOOT_DRIVER
        branch = self.driver_branch(name)
        self.run_in_host(
            name,
            [
                "apt-get",
                "install",
                "-y",
                "-q",
                f"linux-modules-nvidia-{branch}-{flavour}={packages.signed_meta_version(release, driver)}",
                f"linux-modules-nvidia-{branch}-{release}={packages.signed_module_version(release, driver)}",
            ],
        )
        self.run_in_host(name, ["dkms", "remove", "-m", "nvidia", "-v", driver, "-k", release])
        self.set_firmware(name, secure_boot=True)
        self.reboot(name)

    def lab_hosts(self) -> list[inventory.LabHost]:
        out = []
        for name in self.existing_hosts():
            spec = self.spec(name)
            key = (self.paths.host(name) / "keys/ssh_host_ed25519_key.pub").read_text().split()
            out.append(
                inventory.LabHost(
                    name, spec["index"], spec["address"], f"{key[0]} {key[1]}", self.driver_branch(name)
                )
            )
        return out

    # -- the verbs -----------------------------------------------------------------------------------------
    def up(
        self,
        count: int,
        flavour: str | None = None,
        secure_boot: bool | None = None,
        driver_branch: str | None = None,
        release: str | None = None,
    ) -> UpResult:
        """Start hosts gpu-1 .. gpu-<count>; hosts created now get ``flavour`` (flag, else ``lab.flavour``,
        else the VM size's), ``driver_branch`` (:meth:`LabConfig.host_driver_branch`), the Ubuntu ``release``
        (``host_overrides``, else the flag, else ``lab.release``) and, with ``secure_boot``, are Trusted Launch
        hosts. Existing hosts keep theirs."""
        require_root()
        self.cfg.check_count(count)
        new_flavour = self.cfg.host_flavour(flavour)
        branches = {host_name(i): self.cfg.host_driver_branch(host_name(i), driver_branch) for i in range(1, count + 1)}
        trusted = self.cfg.secure_boot if secure_boot is None else secure_boot
        releases = {host_name(i): self.cfg.host_release(host_name(i), release) for i in range(1, count + 1)}
        images = {host_name(i): self.cfg.host_pynvml(host_name(i)) for i in range(1, count + 1)}
        for tool in ("unshare", "nsenter", "ssh-keygen", "gcc"):
            if shutil.which(tool) is None:
                raise LabError(f"{tool} not found: install the lab's Debian packages (the README's setup command)")
        with self.locked():
            cached = any(self.cfg.cache.glob("base-*/.gpulab-complete"))
            base = ensure_base(self.cfg)
            for wanted_release in sorted(set(releases.values())):
                ensure_release(self.cfg, base, wanted_release)
            running = self.running_base()
            if running is not None and running != base.path:
                raise LabError(
                    f"the running lab boots from an older base image ({running.name}; the lab's sources changed"
                    f" since): run `invoke lab.down --purge`, then `invoke lab.up` again"
                )
            t0 = time.monotonic()
            self._client_key()
            wanted = [host_name(i) for i in range(1, count + 1)]
            existing = self.existing_hosts()
            busy = self._ports_in_use([i for i in range(1, count + 1) if host_name(i) not in existing])
            if busy:
                raise LabError(
                    f"address(es) {', '.join(busy)} already have a listener on port 22: another lab or sshd uses"
                    " them; set lab.address_prefix (or stop the other lab)"
                )
            created = [host_name(i) for i in range(1, count + 1) if host_name(i) not in existing]
            # A few threads: creating a host is file system calls (they release the GIL) and one key generation.
            with ThreadPoolExecutor(max_workers=4) as pool:
                jobs = [
                    pool.submit(self.create_host, i, new_flavour, trusted, branches[n], releases[n], images[n])
                    for i, n in ((i, host_name(i)) for i in range(1, count + 1))
                    if n not in existing
                ]
                for job in jobs:
                    job.result()
            self.start_supervisor(base)
            extra = [n for n in existing if n not in wanted]
            if extra:
                self.request("stop", extra)
                for n in extra:
                    shutil.rmtree(self.paths.host(n), ignore_errors=True)
            # Both waits grow with the lab: a busy machine boots 1,000 hosts in more than a minute.
            started = self.request("start", wanted, timeout=60.0 + 0.25 * len(wanted))["result"]
            self.wait_ready(wanted, self.cfg.ready_timeout * max(1.0, len(wanted) / 100))
            for n in created:
                self.provision_driver_branch(n, reboot=not trusted)
                if trusted:
                    self.provision_signed_module(n)
            inv = inventory.write(self.cfg, self.paths, self.lab_hosts())
            return UpResult(
                hosts=tuple(wanted),
                started=tuple(n for n, r in started.items() if r == "started"),
                removed=tuple(extra),
                inventory=inv,
                seconds=time.monotonic() - t0,
                base_built=not cached,
            )

    def _ports_in_use(self, indexes: list[int]) -> list[str]:
        listening = ssh_listeners()
        return [addr for addr in (self.cfg.address(i) for i in indexes) if addr in listening]

    def wait_ready(self, names: Sequence[str], timeout: float) -> None:
        """Until every host's sshd listens on its address: one read of the kernel's TCP socket table per round
        (not one connection per host), so a round costs the same at 1,000 hosts as at 10."""
        deadline = time.monotonic() + timeout
        pending = {n: self.spec(n)["address"] for n in names}
        while pending and time.monotonic() < deadline:
            listening = ssh_listeners()
            pending = {n: addr for n, addr in pending.items() if addr not in listening}
            if pending:
                time.sleep(0.05)
        if pending:
            raise LabError(
                f"lab host(s) {', '.join(sorted(pending))} did not answer SSH within {timeout:.0f} s;"
                f" see {self.paths.hosts}/<host>/console.log"
            )

    def down(self, purge: bool = False) -> list[str]:
        require_root()
        with self.locked():
            stopped: list[str] = []
            sup = self.supervisor_pid()
            if sup is not None:
                stopped = sorted(self.request("shutdown", timeout=120)["result"])
                deadline = time.monotonic() + 10
                while _alive(sup) and time.monotonic() < deadline:
                    time.sleep(0.02)  # until the process itself is gone, not just its pid file
            # Hosts left from a supervisor that died: end their namespaces directly.
            for name in self.existing_hosts():
                pid = self._init_pid(name)
                if pid is not None:
                    os.kill(pid, 9)
                    stopped.append(name)
            if purge:
                shutil.rmtree(self.paths.hosts, ignore_errors=True)
                shutil.rmtree(self.paths.ssh, ignore_errors=True)
                self.cfg.inventory_path.unlink(missing_ok=True)
                (self.cfg.inventory_path.parent / "ssh_config").unlink(missing_ok=True)
            return sorted(set(stopped))

    def _init_pid(self, name: str) -> int | None:
        try:
            pid = int((self.paths.host(name) / "init.pid").read_text().strip())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):
            return None
        return pid if comm in ("gpulab-init", "python3", "python") else None

    def init_pid(self, name: str) -> int:
        self.spec(name)
        pid = self._init_pid(name)
        if pid is None:
            raise LabError(f"lab host {name} is not running: start it with `invoke lab.up`")
        return pid

    def status(self) -> list[HostStatus]:
        sup: dict[str, Any] = {}
        if self.supervisor_pid() is not None:
            sup = self.request("status")["result"]
        out = []
        listening = ssh_listeners()
        for name in self.existing_hosts():
            spec = self.spec(name)
            info = sup.get(name, {})
            pid = self._init_pid(name)
            kernel = boot_id = None
            if pid is not None:
                run = Path(f"/proc/{pid}/root/run/gpulab")
                kernel = _read(run / "kernel")
                boot_id = _read(run / "boot_id")
            out.append(
                HostStatus(
                    name=name,
                    address=spec["address"],
                    state=info.get("state", "down"),
                    ssh=spec["address"] in listening,
                    kernel=kernel,
                    boot_id=boot_id,
                    boots=int(info.get("boots", 0)),
                    faults=tuple(self.faults(name)),
                    flavour=str(spec.get("flavour", "generic")),
                    secure_boot=bool(self.firmware(name).get("secure_boot", False)),
                    release=str(spec.get("release", "jammy")),
                    pynvml=bool(spec.get("pynvml", True)),
                )
            )
        return out

    def faults(self, name: str) -> list[str]:
        path = self.paths.host(name) / "faults"
        return [f for f in path.read_text().split() if f] if path.exists() else []

    def record_fault(self, name: str, fault: str) -> None:
        faults = self.faults(name)
        if fault not in faults:
            faults.append(fault)
        (self.paths.host(name) / "faults").write_text("\n".join(faults) + "\n")

    def boot_id(self, name: str) -> str | None:
        pid = self._init_pid(name)
        return _read(Path(f"/proc/{pid}/root/run/gpulab/boot_id")) if pid else None

    def reboot(self, name: str, wait: bool = True, timeout: float = 60.0) -> str | None:
        """Reboot one host the way `reboot` inside it does; return the new boot id."""
        require_root()
        old = self.boot_id(name)
        os.kill(self.init_pid(name), 10)  # SIGUSR1: gpulab-init stops the host and exits 100
        if not wait:
            return None
        return self.wait_rebooted(name, old, timeout)

    def wait_rebooted(self, name: str, old_boot_id: str | None, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        address = self.spec(name)["address"]
        while time.monotonic() < deadline:
            new = self.boot_id(name)
            if new and new != old_boot_id and _ssh_banner(address):
                return new
            time.sleep(0.05)
        raise LabError(f"lab host {name} did not come back within {timeout:.0f} s after reboot")

    def run_in_host(
        self, name: str, argv: Sequence[str], timeout: float = 300.0, check: bool = True, detach: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside a host (its mount, UTS and PID namespaces and its root), like a console."""
        pid = self.init_pid(name)
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LC_ALL": "C",
            "HOME": "/root",
            "DEBIAN_FRONTEND": "noninteractive",
        }
        cmd = ["nsenter", "-t", str(pid), "-m", "-u", "-p", "-r", "-w", "--", *argv]
        if detach:
            cmd = ["nsenter", "-t", str(pid), "-m", "-u", "-p", "-r", "-w", "--", "setsid", "-f", *argv]
        if detach:  # the detached process must not hold our pipes open
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
                timeout=timeout,
                env=env,
                check=False,
            )
            proc.stdout, proc.stderr = "", ""
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        with (self.paths.host(name) / "console.log").open("a") as log:
            log.write(f"\n# lab: {' '.join(argv)} (exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
        if check and proc.returncode != 0:
            raise LabError(
                f"command in lab host {name} failed (exit {proc.returncode}): {' '.join(argv)}:"
                f" {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
            )
        return proc

    def host_path(self, name: str, path: str) -> Path:
        """A path inside a running host, seen from the controller."""
        return Path(f"/proc/{self.init_pid(name)}/root") / path.lstrip("/")

    def append_kmsg(self, name: str, lines: Sequence[str]) -> None:
        pid = self.init_pid(name)
        root = Path(f"/proc/{pid}/root")
        try:
            boot_time = int((root / "run/gpulab/boot_time").read_text())
        except (OSError, ValueError):
            boot_time = int(time.time())
        secs = max(time.time() - boot_time, 0.0)
        with (root / "run/gpulab/kmsg").open("a") as ring, (root / "var/log/kern.log").open("a") as log:
            for line in lines:
                ring.write(f"[{secs:12.6f}] {line}\n")
                stamp = time.strftime("%b %e %H:%M:%S")
                log.write(f"{stamp} {name} kernel: [{secs:12.6f}] {line}\n")

    def clear(self, name: str) -> None:
        """Return a host to its freshly built state: faults, packages and configuration all undone."""
        require_root()
        spec = self.spec(name)
        with self.locked():
            self.request("stop", [name])
            self._fresh_upper(name, spec["index"], bool(spec.get("pynvml", True)))
            hardware.write_state(self.paths.host(name) / "hw/gpus", hardware.healthy_state(name, spec["sku"]))
            (self.paths.host(name) / "faults").write_text("")
            (self.paths.host(name) / "panic-above").unlink(missing_ok=True)
            self.set_firmware(name, secure_boot=False)
            self.request("start", [name])
            self.wait_ready([name], self.cfg.ready_timeout)
            self.provision_driver_branch(name, reboot=not spec.get("secure_boot"))
            if spec.get("secure_boot"):
                self.provision_signed_module(name)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


_LISTEN_22 = re.compile(r" ([0-9A-F]{8}):0016 [0-9A-F]{8}:[0-9A-F]{4} 0A ")


def ssh_listeners(table: str = "/proc/net/tcp") -> set[str]:
    """The IPv4 addresses with a socket listening on port 22, from the kernel's TCP table (lab hosts share the
    controller's network namespace, so their sshds are all in it)."""
    with open(table) as fh:
        text = fh.read()
    # local address (hex, host byte order) :port 22, any remote, state 0A (LISTEN); one linear pass in C.
    return {socket.inet_ntoa(struct.pack("=I", int(h, 16))) for h in _LISTEN_22.findall(text)}


def _write_host_key(path: Path, comment: str) -> None:
    """A new ed25519 host key in OpenSSH's formats (what ``ssh-keygen -t ed25519 -N ''`` writes), generated in
    this process: 1,000 hosts cost 1,000 key generations, not 1,000 ``ssh-keygen`` processes."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    path.with_name(path.name + ".pub").write_bytes(public + f" {comment}\n".encode())


def _ssh_banner(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=0.5) as s:
            s.settimeout(1.0)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False
