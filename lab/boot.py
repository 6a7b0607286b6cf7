"""Boot one lab host: run as PID 1 of fresh mount/UTS/PID namespaces, then exec gpulab-init.

The supervisor imports this module once and runs :func:`boot` in a fork of itself that is PID 1 of the new
namespaces (``lab/supervisor.py``), so a (re)boot starts no interpreter; ``python -m lab.boot HOSTDIR BASEDIR``
does the same when run as PID 1 (e.g. under ``unshare --mount --uts --pid --fork``). Standard library only and no
project imports.

What a boot does, like firmware + boot loader + early kernel:
* mounts the host's root (overlay: the shared read-only base below, the host's own upper dir above),
  a fresh ``/proc``, ``/run`` (tmpfs: cleared at every boot, as on a real host), a minimal ``/dev``,
  the lab apt repository read-only, and the host's hardware state read-only at ``/run/gpulab/hw``;
* picks the kernel to boot as GRUB does, from ``/boot/grub/grub.cfg`` (written by ``update-grub``) and
  ``/boot/grub/grubenv`` only, never ``/etc/default/grub``: a one-shot ``next_entry`` (``grub-reboot``) wins
  and is consumed by this boot, else the ``set default=`` of grub.cfg (``${saved_entry}`` for
  ``GRUB_DEFAULT=saved``); an entry is a number, a title, an id or a ``>`` path of them; one that names
  nothing boots entry 0. With no grub.cfg at all the newest installed ``/boot/vmlinuz-*`` boots;
* applies the host's firmware: Secure Boot on or off (``<host>/firmware.json``, set when the host is created or
  by the ``secure-boot`` fault), shown as the EFI variable under ``/sys/firmware/efi/efivars`` and
  ``/sys/kernel/security/lockdown``; under Secure Boot the kernel is locked down;
* panics instead of booting when the ``new-kernel-panic`` fault is set and the chosen kernel is newer than the
  one booted when it was set (``<host>/panic-above``): the kernel log gets the panic, the host stays down a few
  seconds and restarts (``kernel.panic``), choosing from grub.cfg again;
* "loads" the NVIDIA module modprobe would find (``updates/`` before the kernel's own tree, as Ubuntu's
  depmod.conf orders them): a module is signed when its file ends with the kernel's signature magic; under
  Secure Boot an unsigned one is refused (the Lockdown line instead of NVRM's); a loaded module's version goes
  to ``/run/gpulab/module``, which the simulated NVML compares with its own, and the device files it would
  create appear (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia<i>``);
* writes the kernel ring buffer (``/run/gpulab/kmsg``) and appends it to ``/var/log/kern.log``;
* gives the host a new boot id, bound over ``/proc/sys/kernel/random/boot_id``, and its kernel release,
  bound over ``/proc/sys/kernel/osrelease`` (``uname()`` callers see it through the preload library).

Nothing here can reboot the machine: ending a host is always "PID 1 exits", which ends its namespace.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import lzma
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: Path | str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    rc = _libc.mount(
        source.encode(),
        str(target).encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target} ({fstype}, {data}): {os.strerror(err)}")


def bind(src: Path | str, dst: Path | str, readonly: bool = False) -> None:
    mount(str(src), dst, None, MS_BIND)
    if readonly:
        mount("none", dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


GRUBENV = "boot/grub/grubenv"
GRUB_CFG = "boot/grub/grub.cfg"
SIGNATURE_MAGIC = b"~Module signature appended~\n"
EFI_SECURE_BOOT = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
PANIC_DOWN_SECONDS = 3.0
# Compiled once when the supervisor imports this module: every host's boot is a fork of it and inherits them.
_SET_DEFAULT = re.compile(r'set default="([^"]*)"$')
_MENU_ENTRY = re.compile(r"(menuentry|submenu)\s+'([^']*)'.*?(?:\$menuentry_id_option|--id)\s+'([^']*)'.*\{$")
_LINUX_LINE = re.compile(r"linux\s+/boot/vmlinuz-(\S+)")
_NUMBERS = re.compile(r"\d+")
_VARIABLE = re.compile(r"\$\{(\w+)\}")
_MODINFO_VERSION = re.compile(rb"(?:^|\x00)version=([0-9][0-9A-Za-z.+~_-]*)\x00")
_TEXT_VERSION = re.compile(rb"(?m)^version:\s*(\S+)")


def read_grubenv(root: Path) -> dict[str, str]:
    try:
        text = (root / GRUBENV).read_text(errors="replace")
    except OSError:
        return {}
    env = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        env[k] = v
    return env


def write_grubenv(root: Path, env: dict[str, str]) -> None:
    """As GRUB's save_env: a 1024-byte block, header, name=value lines, '#' padding."""
    text = "# GRUB Environment Block\n" + "".join(f"{k}={v}\n" for k, v in env.items())
    path = root / GRUBENV
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".grubenv.gpulab")
    tmp.write_text(text.ljust(1024, "#"))
    os.replace(tmp, path)


MenuNode = tuple[str, str, "str | list[MenuNode]"]  # (title, id, kernel release | children)


def parse_grub_cfg(text: str) -> tuple[str, bool, list[MenuNode]]:
    """The default expression of grub.cfg's 00_header, whether it honours ``next_entry``, and the menu tree."""
    default = "0"
    next_entry = False
    top: list[MenuNode] = []
    stack: list[list[MenuNode]] = [top]
    current: list[str | None] | None = None  # [title, id, kernel] of the menuentry being read
    depth_kinds: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith('if [ "${next_entry}" ]'):
            next_entry = True
        m = _SET_DEFAULT.match(line)
        if m and m.group(1) != "${next_entry}":
            default = m.group(1)
        m = _MENU_ENTRY.match(line)
        if m:
            kind, title, ident = m.groups()
            if kind == "submenu":
                children: list[MenuNode] = []
                stack[-1].append((title, ident, children))
                stack.append(children)
                depth_kinds.append("submenu")
            else:
                current = [title, ident, None]
                depth_kinds.append("menuentry")
            continue
        m = _LINUX_LINE.match(line)
        if m and current is not None:
            current[2] = m.group(1)
            continue
        if line == "}" and depth_kinds:
            kind = depth_kinds.pop()
            if kind == "submenu":
                stack.pop()
            elif current is not None:
                stack[-1].append((str(current[0]), str(current[1]), str(current[2] or "")))
                current = None
    return default, next_entry, top


def resolve_entry(menu: list[MenuNode], entry: str) -> str | None:
    """The kernel release an entry (number, title, id, or a ``>`` path of them) boots; None if it names none."""
    level: list[MenuNode] | str = menu
    for part in entry.split(">"):
        if isinstance(level, str):
            return None
        node = None
        if part.isdigit():
            node = level[int(part)] if int(part) < len(level) else None
        else:
            node = next((n for n in level if part in (n[0], n[1])), None)
        if node is None:
            return None
        level = node[2]
    return level if isinstance(level, str) and level else None


def version_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in _NUMBERS.findall(release))


def installed_kernels(root: Path) -> list[str]:
    boot = root / "boot"
    if not boot.is_dir():
        return []
    return sorted((p.name[len("vmlinuz-") :] for p in boot.glob("vmlinuz-*")), key=version_key)


def grub_choice(root: Path) -> tuple[str | None, bool]:
    """(kernel to boot, whether a one-shot ``next_entry`` chose it), as GRUB reads grub.cfg and grubenv."""
    kernels = installed_kernels(root)
    try:
        text = (root / GRUB_CFG).read_text(errors="replace")
    except OSError:
        return (kernels[-1] if kernels else None), False
    default, honours_next, menu = parse_grub_cfg(text)
    env = read_grubenv(root)
    once = honours_next and bool(env.get("next_entry"))
    entry = env["next_entry"] if once else default
    entry = _VARIABLE.sub(lambda m: env.get(m.group(1), ""), entry)
    chosen = resolve_entry(menu, entry) if entry else None
    if chosen is None:
        chosen = resolve_entry(menu, "0")  # GRUB boots entry 0 when the default names nothing
    if chosen is None or chosen not in kernels:
        chosen = kernels[-1] if kernels else None  # a stale grub.cfg; the lab still boots something
    return chosen, once


def choose_kernel(root: Path) -> str | None:
    return grub_choice(root)[0]


def consume_next_entry(root: Path) -> None:
    """grub.cfg's ``set next_entry=`` + ``save_env next_entry``: the one-shot entry is used up."""
    env = read_grubenv(root)
    env["next_entry"] = ""
    write_grubenv(root, env)


def find_module(root: Path, kernel: str, name: str = "nvidia") -> Path | None:
    """The file modprobe would load for ``name``: ``updates/`` first, then the kernel's own tree."""
    base = root / "lib/modules" / kernel
    for top in ("updates", "ubuntu", "kernel"):
        found = sorted(
            p for p in (base / top).rglob("*.ko*") if p.name.split(".ko", 1)[0].replace("-", "_") == name
        ) if (base / top).is_dir() else []
        if found:
            return found[0]
    return None


def module_data(path: Path) -> bytes:
    """A module file's bytes as the kernel loads them: ``.ko.zst`` (Ubuntu 24.04's kernels and DKMS 3) is
    decompressed with the zstd program, ``.ko.xz`` / ``.ko.gz`` with the standard library."""
    if path.name.endswith(".zst"):
        proc = subprocess.run(
            ["zstd", "-q", "-d", "-c", "--", str(path)], stdin=subprocess.DEVNULL, capture_output=True,
            timeout=60, check=False,
        )
        if proc.returncode != 0:
            raise OSError(f"{path}: zstd: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout
    if path.name.endswith(".xz"):
        with lzma.open(path, "rb") as xz:
            return xz.read()
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as gz:
            return gz.read()
    return path.read_bytes()


def module_signed(path: Path) -> bool:
    try:
        return module_data(path).endswith(SIGNATURE_MAGIC)
    except (OSError, EOFError, lzma.LZMAError, subprocess.TimeoutExpired):
        return False


def module_file_version(path: Path) -> str:
    try:
        data = module_data(path)
    except (OSError, EOFError, lzma.LZMAError, subprocess.TimeoutExpired):
        return "unknown"
    m = _MODINFO_VERSION.search(data) or _TEXT_VERSION.search(data)
    return m.group(1).decode() if m else "unknown"


def module_version(root: Path, kernel: str) -> str | None:
    """The version of the NVIDIA module modprobe would load for ``kernel`` (None: no module)."""
    path = find_module(root, kernel)
    return None if path is None else module_file_version(path)


def read_firmware(host_dir: Path) -> dict[str, object]:
    try:
        data = json.loads((host_dir / "firmware.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def make_sys(root: Path, secure_boot: bool) -> None:
    """A read-only /sys with what the firmware and the kernel say about Secure Boot and lockdown."""
    sys_dir = root / "sys"
    mount("tmpfs", sys_dir, "tmpfs", 0, "mode=755,size=64k")
    efivars = sys_dir / "firmware/efi/efivars"
    efivars.mkdir(parents=True)
    (efivars / EFI_SECURE_BOOT).write_bytes(b"\x06\x00\x00\x00" + (b"\x01" if secure_boot else b"\x00"))
    security = sys_dir / "kernel/security"
    security.mkdir(parents=True)
    (security / "lockdown").write_text(
        "none [integrity] confidentiality\n" if secure_boot else "[none] integrity confidentiality\n"
    )
    mount("none", sys_dir, None, MS_REMOUNT | MS_RDONLY)


def read_hw(hw_file: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        for line in hw_file.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                k, v = line.split("=", 1)
                values[k.strip()] = v.strip()
    except OSError:
        pass
    return values


def kmsg_lines(
    kernel: str,
    module: str | None,
    hw: dict[str, str],
    boot_id: str,
    secure_boot: bool = False,
    signed: bool = False,
    panic: bool = False,
) -> list[tuple[float, str]]:
    abi = kernel.split("-")[1] if "-" in kernel else "0"
    lines = [
        (
            0.0,
            f"Linux version {kernel} (buildd@lcy02-amd64-051) (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04)"
            f" 12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #{abi}~22.04.1-Ubuntu SMP PREEMPT_DYNAMIC",
        ),
        (
            0.0,
            f"Command line: BOOT_IMAGE=/boot/vmlinuz-{kernel} root=PARTUUID={boot_id[:8]}-01 ro console=tty1"
            " console=ttyS0 earlyprintk=ttyS0",
        ),
        (0.412303, "Hypervisor detected: Microsoft Hyper-V"),
        (0.501207, f"secureboot: Secure boot {'enabled' if secure_boot else 'disabled'}"),
    ]
    if secure_boot:
        lines.append((0.501209, "Kernel is locked down from EFI Secure Boot mode; see man kernel_lockdown.7"))
    if panic:
        abi_tag = f"#{abi}~22.04.1-Ubuntu"
        return [
            *lines,
            (1.873113, f'VFS: Cannot open root device "PARTUUID={boot_id[:8]}-01" or unknown-block(0,0): error -6'),
            (1.873120, 'Please append a correct "root=" boot option; here are the available partitions:'),
            (1.873201, "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)"),
            (1.873245, f"CPU: 0 PID: 1 Comm: swapper/0 Not tainted {kernel} {abi_tag}"),
            (1.873290, "Hardware name: Microsoft Corporation Virtual Machine/Virtual Machine, BIOS Hyper-V UEFI"),
            (1.874012, "---[ end Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0) ]---"),
        ]
    t = 4.212345
    if module is not None and secure_boot and not signed:
        return [
            *lines,
            (t, "Lockdown: systemd-modules: unsigned module loading is restricted; see man kernel_lockdown.7"),
            (t + 0.000113, "systemd-modules-load[312]: Failed to insert module 'nvidia': Key was rejected by service"),
        ]
    if module is None:
        lines.append((t, "systemd-modules-load[312]: Failed to find module 'nvidia'"))
        lines.append((t + 0.001, "systemd-modules-load[312]: Failed to find module 'nvidia-uvm'"))
        return lines
    lines += [
        (t, "nvidia: loading out-of-tree module taints kernel."),
        (t + 0.000004, "nvidia: module license 'NVIDIA' taints kernel."),
    ]
    if not signed:
        why = "signature and/or required key missing - tainting kernel"
        lines.append((t + 0.000009, f"nvidia: module verification failed: {why}"))
    lines += [
        (t + 0.051, "nvidia-nvlink: Nvlink Core is being initialized, major device number 235"),
        (t + 0.062, f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {module}  Thu May 30 19:13:58 UTC 2024"),
    ]
    count = int(hw.get("gpu_count", "0") or 0)
    for i in range(count):
        if hw.get(f"gpu.{i}.lost") == "1":
            pci = hw.get(f"gpu.{i}.pci_bus_id", f"0000000{i + 1}:00:00.0")[4:]
            lines.append((t + 0.2 + i / 100, f"NVRM: GPU {pci}: RmInitAdapter failed! (0x23:0x65:1417)"))
            lines.append((t + 0.2 + i / 100, f"NVRM: GPU {pci}: rm_init_adapter failed, device minor number {i}"))
    return lines


def write_kmsg(root: Path, host: str, entries: list[tuple[float, str]], boot_time: float) -> None:
    ring = root / "run/gpulab/kmsg"
    with ring.open("w") as out:
        for secs, text in entries:
            out.write(f"[{secs:12.6f}] {text}\n")
    with (root / "var/log/kern.log").open("a") as log:
        for secs, text in entries:
            stamp = time.strftime("%b %e %H:%M:%S", time.localtime(boot_time + secs))
            log.write(f"{stamp} {host} kernel: [{secs:12.6f}] {text}\n")


def make_dev(root: Path) -> None:
    dev = root / "dev"
    mount("tmpfs", dev, "tmpfs", 0, "mode=755,size=64k")
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        (dev / name).touch()
        bind(f"/dev/{name}", dev / name)
    (dev / "pts").mkdir()
    (dev / "shm").mkdir()
    mount("devpts", dev / "pts", "devpts", 0, "newinstance,ptmxmode=0666,mode=620")
    (dev / "ptmx").symlink_to("pts/ptmx")
    mount("tmpfs", dev / "shm", "tmpfs", 0, "mode=1777,size=16m")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        (dev / name).symlink_to(target)


def make_nvidia_devices(root: Path, hw: dict[str, str]) -> None:
    """The device files the loaded NVIDIA module creates: ``/dev/nvidiactl``, ``/dev/nvidia-uvm(-tools)`` and
    ``/dev/nvidia<i>`` per GPU on the bus. Plain files here (the machine's kernel has no NVIDIA driver to back
    character devices), so a job can hold them open and ``/proc/<pid>/fd`` shows what it shows on a real host."""
    dev = root / "dev"
    names = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    names += [f"nvidia{i}" for i in range(int(hw.get("gpu_count", "0") or 0)) if hw.get(f"gpu.{i}.lost") != "1"]
    for name in names:
        path = dev / name
        path.touch()
        path.chmod(0o666)


def flavour_root(base_dir: Path, flavour: str, release: str = "jammy") -> Path:
    """The base's host root for a kernel flavour and Ubuntu release (lab/base.py: ``root`` generic,
    ``root-<flavour>``; another release than jammy adds ``-<release>``: ``root-noble``, ``root-azure-noble``)."""
    name = "root" if flavour == "generic" else f"root-{flavour}"
    return base_dir / (name if release == "jammy" else f"{name}-{release}")


def release_repo(base_dir: Path, release: str = "jammy") -> Path:
    """The lab repository of an Ubuntu release (lab/base.py: ``repo``, ``repo-<release>``)."""
    return base_dir / ("repo" if release == "jammy" else f"repo-{release}")


def panics(host_dir: Path, kernel: str) -> bool:
    """The ``new-kernel-panic`` fault: any kernel newer than the one booted when it was set panics."""
    try:
        above = (host_dir / "panic-above").read_text().strip()
    except OSError:
        return False
    return bool(above) and version_key(kernel) > version_key(above)


def boot(host_dir: Path, base_dir: Path) -> tuple[Path, str, bool]:
    """Boot the host; returns its root, the boot id and whether this boot panicked."""
    if os.getpid() != 1:
        raise SystemExit("lab.boot: must run as PID 1 of a new PID namespace (the lab supervisor starts it)")
    spec = json.loads((host_dir / "host.json").read_text())
    name = spec["name"]
    root = host_dir / "root"
    release = str(spec.get("release", "jammy"))
    lower = flavour_root(base_dir, str(spec.get("flavour", "generic")), release)
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount(
        "overlay",
        root,
        "overlay",
        0,
        f"lowerdir={lower},upperdir={host_dir / 'upper'},workdir={host_dir / 'work'}",
    )
    mount("proc", root / "proc", "proc", 0, None)
    mount("tmpfs", root / "run", "tmpfs", 0, "mode=755,size=32m")
    run = root / "run/gpulab"
    for d in (run / "hw", root / "run/sshd", root / "run/lock"):
        d.mkdir(parents=True)
    # What Ubuntu's tmpfiles.d/sudo.conf makes at boot (the lab runs no sudo start script: see lab/base.py).
    (root / "run/sudo").mkdir(mode=0o711)
    (root / "run/sudo/ts").mkdir(mode=0o700)
    bind(host_dir / "hw", run / "hw", readonly=True)
    make_dev(root)
    repo = root / "srv/gpulab-repo"
    bind(release_repo(base_dir, release), repo, readonly=True)
    socket.sethostname(name)
    secure_boot = bool(read_firmware(host_dir).get("secure_boot", False))
    make_sys(root, secure_boot)

    boot_id = str(uuid.uuid4())
    boot_time = time.time()
    chosen, once = grub_choice(root)
    if once:
        consume_next_entry(root)
    kernel = chosen or "unknown"
    panic = panics(host_dir, kernel)
    path = None if panic else find_module(root, kernel)
    signed = path is not None and module_signed(path)
    module = None if path is None else module_file_version(path)
    rejected = module is not None and secure_boot and not signed
    hw = read_hw(host_dir / "hw/gpus")
    (run / "boot_id").write_text(boot_id + "\n")
    (run / "boot_time").write_text(f"{int(boot_time)}\n")
    (run / "kernel").write_text(kernel + "\n")
    (run / "osrelease").write_text(kernel + "\n")
    if module is not None and not rejected:
        (run / "module").write_text(module + "\n")
        make_nvidia_devices(root, hw)
    bind(run / "boot_id", root / "proc/sys/kernel/random/boot_id", readonly=True)
    bind(run / "osrelease", root / "proc/sys/kernel/osrelease", readonly=True)
    write_kmsg(root, name, kmsg_lines(kernel, module, hw, boot_id, secure_boot, signed, panic), boot_time)
    record = {
        "time": boot_time,
        "boot_id": boot_id,
        "kernel": kernel,
        "module": None if rejected else module,
        "module_path": None if path is None else str(path.relative_to(root)),
        "signed": signed,
        "secure_boot": secure_boot,
        "next_entry": once,
        "panic": panic,
    }
    with (host_dir / "boots.log").open("a") as out:
        out.write(json.dumps(record) + "\n")
    return root, boot_id, panic


def main(argv: list[str]) -> None:
    host_dir, base_dir = Path(argv[1]), Path(argv[2])
    root, _, panic = boot(host_dir, base_dir)
    sys.stdout.flush()
    if panic:  # the VM stays down, then restarts as kernel.panic makes it (the supervisor boots it again)
        print(f"lab.boot: kernel panic on {host_dir.name}; restarting", flush=True)
        time.sleep(PANIC_DOWN_SECONDS)
        sys.exit(100)
    init = str(base_dir / "native/gpulab-init")
    os.execv(init, ["gpulab-init", str(root)])  # noqa: S606 - becomes PID 1 of the host, no shell involved


if __name__ == "__main__":
    main(sys.argv)
