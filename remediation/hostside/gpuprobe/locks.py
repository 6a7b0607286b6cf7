"""``dkms status`` and the dpkg locks (who holds them)."""

import errno
import fcntl
import os

from .common import (
    Options,  # noqa: F401 - type comments
    _proc_comm,
    _read_text,
    _unrooted,
    _which,
    run_command,
)

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Dict, List, Optional  # noqa: F401 - type comments

DKMS_TIMEOUT_S = 20.0


def collect_dkms_status(options):
    # type: (Options) -> Optional[Dict[str, Any]]
    dkms = _which("dkms")
    if dkms is None:
        return None
    run = run_command([dkms, "status"], DKMS_TIMEOUT_S)
    return {"rc": run["rc"], "output": run["stdout"] + run["stderr"], "error": run["error"]}


def _proc_locks_holders(path_stat, proc_locks_text):
    # type: (os.stat_result, str) -> List[int]
    major, minor = os.major(path_stat.st_dev), os.minor(path_stat.st_dev)
    holders = []
    for line in proc_locks_text.splitlines():
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:131075 0 EOF"; blocked waiters carry "->" after the id
        if len(parts) < 6 or parts[1] == "->":
            continue
        try:
            pid = int(parts[4])
            dev_major, dev_minor, inode = parts[5].split(":")
            if int(inode) != path_stat.st_ino:
                continue
            if (int(dev_major, 16), int(dev_minor, 16)) != (major, minor):
                continue
        except ValueError:
            continue
        holders.append(pid)
    return holders


def lock_state(path, proc_locks_path="/proc/locks"):
    # type: (str, str) -> Dict[str, Any]
    """Is ``path`` locked by someone else?  Takes a non-blocking POSIX write lock and drops it at once
    (dpkg and apt use fcntl locks).  Opens O_RDWR, never creates or truncates."""
    state = {"path": path, "exists": False, "held": False, "holder_pid": None, "holder_comm": None, "error": None}  # type: Dict[str, Any]
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return state
        state["exists"] = True
        state["held"] = None
        state["error"] = "%s: %s" % (path, exc.strerror)
        return state
    state["exists"] = True
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                state["held"] = None
                state["error"] = "%s: %s" % (path, exc.strerror)
                return state
            state["held"] = True
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return state
        try:
            holders = _proc_locks_holders(os.fstat(fd), _read_text(proc_locks_path))
        except (IOError, OSError):
            holders = []
        if holders:
            state["holder_pid"] = holders[0]
            state["holder_comm"] = _proc_comm(holders[0])
        return state
    finally:
        os.close(fd)


def collect_dpkg_lock(options):
    # type: (Options) -> Dict[str, Any]
    locks = [lock_state(options.path(p)) for p in ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")]
    held_locks = [lock for lock in locks if lock["held"]]
    unknown = [lock for lock in locks if lock["held"] is None]
    holder = held_locks[0] if held_locks else None
    return {
        "held": True if held_locks else (None if unknown else False),
        "holder_pid": holder["holder_pid"] if holder else None,
        "holder_comm": holder["holder_comm"] if holder else None,
        "locks": [dict(lock, path=_unrooted(options, lock["path"])) for lock in locks],
    }
