"""Processes that hold the GPU device files open (works when NVML does not)."""

import errno
import os
import re

from .common import (
    Options,  # noqa: F401 - type comments
    _read_text,
)

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Dict, List, Optional  # noqa: F401 - type comments

# /dev/nvidia0.., /dev/nvidiactl, /dev/nvidia-uvm(-tools), /dev/nvidia-modeset, /dev/nvidia-caps/*: every CUDA
# process opens nvidiactl and the device of each GPU it uses, so this finds jobs even while NVML fails
# (driver/library mismatch, NVML hung) and the loaded module still runs them.
_DEVICE_RE = re.compile(r"^/dev/nvidia(?:[0-9]+|ctl|-uvm|-uvm-tools|-modeset|-caps/.*)$")
# Driver services that hold the devices on every healthy GPU host; they are not workloads. Matched on the basename
# of the process's executable (see _executable_name), never on /proc/<pid>/comm alone: comm is cut to 15
# characters ("nvidia-persiste", "nv-fabricmanage"). The controller reads this set from here (one list).
DRIVER_SERVICES = frozenset(
    ("nvidia-persistenced", "nv-fabricmanager", "nv-hostengine", "dcgm-exporter", "nvidia-smi", "nvidia-powerd")
)
DEVICE_USERS_MAX = 256


def collect_device_users(options):
    # type: (Options) -> Optional[Dict[str, Any]]
    """Processes holding an NVIDIA device file open, from /proc/<pid>/fd (this probe and its children excluded).

    None where there is no /proc to read (a probe of an image or a test tree): unknown, not "no users"."""
    proc = options.path("/proc")
    if not os.path.isdir(proc):
        return None
    me = os.getpid()
    users = []  # type: List[Dict[str, Any]]
    unreadable = 0
    for name in sorted(os.listdir(proc), key=lambda n: (len(n), n)):
        if not name.isdigit() or int(name) == me:
            continue
        fd_dir = os.path.join(proc, name, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                unreadable += 1  # not ours to read: counted, never guessed
            continue  # else gone (exited during the scan): nothing held
        devices = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if _DEVICE_RE.match(target):
                devices.add(target)
        if not devices:
            continue
        comm = (_read_text_quiet(os.path.join(proc, name, "comm")) or "").strip()
        if _parent_pid(os.path.join(proc, name, "stat")) == me:
            continue  # the probe's own NVML child
        exe = _executable_name(os.path.join(proc, name))
        users.append(
            {
                "pid": int(name),
                "comm": comm or None,
                "exe": exe,
                "devices": sorted(devices),
                "gpus": sorted(int(d[len("/dev/nvidia") :]) for d in devices if d[len("/dev/nvidia") :].isdigit()),
                "service": _is_driver_service(exe, comm),
            }
        )
        if len(users) >= DEVICE_USERS_MAX:
            break
    return {"users": users, "unreadable": unreadable, "truncated": len(users) >= DEVICE_USERS_MAX}


COMM_MAX = 15  # /proc/<pid>/comm: TASK_COMM_LEN - 1 characters of the executable's name


def _executable_name(pid_dir):
    # type: (str) -> Optional[str]
    """The basename of the process's executable: the ``exe`` link (" (deleted)" stripped: a binary replaced by an
    upgrade while it runs), else argv[0] from ``cmdline``; None when neither is readable (a kernel thread, a
    process of another user without privileges, one that exited)."""
    try:
        target = os.readlink(os.path.join(pid_dir, "exe"))
    except OSError:
        target = ""
    if target.endswith(" (deleted)"):
        target = target[: -len(" (deleted)")]
    if not target:
        raw = _read_text_quiet(os.path.join(pid_dir, "cmdline")) or ""
        target = raw.split("\0", 1)[0]
    name = target.rstrip("/").rsplit("/", 1)[-1]
    return name or None


def _is_driver_service(exe, comm):
    # type: (Optional[str], str) -> bool
    """A driver daemon, by executable; by comm only when the executable is unknown and comm is not cut short (a
    truncated comm could be anything that starts the same way: it is counted as work)."""
    if exe is not None:
        return exe in DRIVER_SERVICES
    return len(comm) < COMM_MAX and comm in DRIVER_SERVICES


def _read_text_quiet(path):
    # type: (str) -> Optional[str]
    try:
        return _read_text(path)
    except (IOError, OSError):
        return None


def _parent_pid(stat_path):
    # type: (str) -> Optional[int]
    text = _read_text_quiet(stat_path)
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None
