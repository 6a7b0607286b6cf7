"""Boot one lab host: run as PID 1 of fresh mount/UTS/PID namespaces, then exec gpulab-init.

Invoked by the supervisor as
``unshare --mount --uts --pid --fork --propagation private python -m lab.boot HOSTDIR BASEDIR``.
Standard library only and no project imports: it runs once per (re)boot of every host, so it must start fast.

What a boot does, like firmware + boot loader + early kernel:
* mounts the host's root (overlay: the shared read-only base below, the host's own upper dir above),
  a fresh ``/proc``, ``/run`` (tmpfs: cleared at every boot, as on a real host), a minimal ``/dev``,
  the lab apt repository read-only, and the host's hardware state read-only at ``/run/gpulab/hw``;
* picks the kernel to boot: the one named by ``GRUB_DEFAULT`` in ``/etc/default/grub`` when installed,
  else the newest installed ``/boot/vmlinuz-*``;
* "loads" the NVIDIA module when ``/lib/modules/<kernel>/updates/dkms/nvidia.ko`` exists (the version it
  carries goes to ``/run/gpulab/module``, which the simulated NVML compares with its own) and creates the
  device files it would (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia<i>``);
* writes the kernel ring buffer (``/run/gpulab/kmsg``) and appends it to ``/var/log/kern.log``;
* gives the host a new boot id, bound over ``/proc/sys/kernel/random/boot_id``, and its kernel release,
  bound over ``/proc/sys/kernel/osrelease`` (``uname()`` callers see it through the preload library).

Nothing here can reboot the machine: ending a host is always "PID 1 exits", which ends its namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
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


def version_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", release))


def installed_kernels(root: Path) -> list[str]:
    boot = root / "boot"
    if not boot.is_dir():
        return []
    return sorted((p.name[len("vmlinuz-") :] for p in boot.glob("vmlinuz-*")), key=version_key)


def grub_default(root: Path) -> str | None:
    try:
        text = (root / "etc/default/grub").read_text()
    except OSError:
        return None
    value = None
    for line in text.splitlines():
        m = re.match(r"\s*GRUB_DEFAULT=(.*)$", line)
        if m:
            value = m.group(1).strip().strip("\"'")
    if value:
        m = re.search(r"with Linux (\S+?)(?:\s|$|\))", value)
        if m:
            return m.group(1)
    return None


def choose_kernel(root: Path) -> str | None:
    kernels = installed_kernels(root)
    pinned = grub_default(root)
    if pinned and pinned in kernels:
        return pinned
    return kernels[-1] if kernels else None


def module_version(root: Path, kernel: str) -> str | None:
    ko = root / "lib/modules" / kernel / "updates/dkms/nvidia.ko"
    try:
        text = ko.read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"^version:\s*(\S+)", text, re.M)
    return m.group(1) if m else "unknown"


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


def kmsg_lines(kernel: str, module: str | None, hw: dict[str, str], boot_id: str) -> list[tuple[float, str]]:
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
    ]
    t = 4.212345
    if module is None:
        lines.append((t, "systemd-modules-load[312]: Failed to find module 'nvidia'"))
        lines.append((t + 0.001, "systemd-modules-load[312]: Failed to find module 'nvidia-uvm'"))
        return lines
    lines += [
        (t, "nvidia: loading out-of-tree module taints kernel."),
        (t + 0.000004, "nvidia: module license 'NVIDIA' taints kernel."),
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


def boot(host_dir: Path, base_dir: Path) -> tuple[Path, str]:
    if os.getpid() != 1:
        raise SystemExit("lab.boot: must run as PID 1 of a new PID namespace (the lab supervisor starts it)")
    spec = json.loads((host_dir / "host.json").read_text())
    name = spec["name"]
    root = host_dir / "root"
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount(
        "overlay",
        root,
        "overlay",
        0,
        f"lowerdir={base_dir / 'root'},upperdir={host_dir / 'upper'},workdir={host_dir / 'work'}",
    )
    mount("proc", root / "proc", "proc", 0, None)
    mount("tmpfs", root / "run", "tmpfs", 0, "mode=755,size=32m")
    run = root / "run/gpulab"
    for d in (run / "hw", root / "run/sshd", root / "run/lock"):
        d.mkdir(parents=True)
    bind(host_dir / "hw", run / "hw", readonly=True)
    make_dev(root)
    repo = root / "srv/gpulab-repo"
    bind(base_dir / "repo", repo, readonly=True)
    socket.sethostname(name)

    boot_id = str(uuid.uuid4())
    boot_time = time.time()
    kernel = choose_kernel(root) or "unknown"
    module = module_version(root, kernel)
    hw = read_hw(host_dir / "hw/gpus")
    (run / "boot_id").write_text(boot_id + "\n")
    (run / "boot_time").write_text(f"{int(boot_time)}\n")
    (run / "kernel").write_text(kernel + "\n")
    (run / "osrelease").write_text(kernel + "\n")
    if module is not None:
        (run / "module").write_text(module + "\n")
        make_nvidia_devices(root, hw)
    bind(run / "boot_id", root / "proc/sys/kernel/random/boot_id", readonly=True)
    bind(run / "osrelease", root / "proc/sys/kernel/osrelease", readonly=True)
    write_kmsg(root, name, kmsg_lines(kernel, module, hw, boot_id), boot_time)
    record = {"time": boot_time, "boot_id": boot_id, "kernel": kernel, "module": module}
    with (host_dir / "boots.log").open("a") as out:
        out.write(json.dumps(record) + "\n")
    return root, boot_id


def main(argv: list[str]) -> None:
    host_dir, base_dir = Path(argv[1]), Path(argv[2])
    root, _ = boot(host_dir, base_dir)
    init = str(base_dir / "native/gpulab-init")
    sys.stdout.flush()
    os.execv(init, ["gpulab-init", str(root)])  # noqa: S606 - becomes PID 1 of the host, no shell involved


if __name__ == "__main__":
    main(sys.argv)
