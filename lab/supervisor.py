"""The lab supervisor: one long-lived process, parent of every lab host.

Each host is booted by a fork of the supervisor itself: a short-lived middle process unshares the mount, UTS and
PID namespaces (what ``unshare --mount --uts --pid --fork --propagation private`` did) and forks the host's PID 1,
which runs :func:`lab.boot.boot` (already imported here: no interpreter start per host) and then execs
gpulab-init. The middle process exits at once; the supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``),
so the host's PID 1 becomes its direct child: one process fewer per host, and its exit status comes straight to
the supervisor. The supervisor reaps exits as they come (``waitpid(-1)``): exit 100 means the host rebooted
itself, so it is booted again after ``boot_delay``; exit 0 means it was halted and stays down.

It answers one JSON request per connection on a Unix socket in the state directory (mode 0600):
``{"op": "start"|"stop"|"status"|"shutdown", "hosts": [...]}``. Standard library only.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab import boot

REBOOT_EXIT = 100
STOP_GRACE = 5.0
FORK_BATCH = 128  # hosts forked before their PIDs are collected (each holds a pipe until then)
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000

#: The environment a host's PID 1 starts with (gpulab-init sets its own PATH for the start scripts).
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class HostProc:
    name: str
    dir: Path
    init_pid: int | None = None  # the host's PID 1 (gpulab-init), a child of the supervisor
    returncode: int | None = None  # set when init_pid has exited and was reaped
    state: str = "down"  # down | up | rebooting | crashed
    boots: int = 0
    restart_at: float | None = None
    last_exit: int | None = None
    stop_requested: bool = False
    log: Any = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.init_pid is not None and self.returncode is None


def _host_init(host_dir: Path, base_dir: Path, log_fd: int, nofile: tuple[int, int]) -> None:
    """PID 1 of a new host: console to the host's log, the supervisor's descriptors and signal settings dropped,
    then boot (mounts, kernel choice, ...) and exec gpulab-init. Never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.closerange(3, 1 << 20)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
        root, _, panic = boot.boot(host_dir, base_dir)
        sys.stdout.flush()
        if panic:  # the VM stays down, then restarts as kernel.panic makes it (the supervisor boots it again)
            print(f"lab.boot: kernel panic on {host_dir.name}; restarting", flush=True)
            time.sleep(boot.PANIC_DOWN_SECONDS)
            code = REBOOT_EXIT
        else:
            init = str(base_dir / "native/gpulab-init")
            # Becomes PID 1 of the host (no shell involved), with a minimal environment.
            os.execve(init, ["gpulab-init", str(root)], HOST_ENV)  # noqa: S606
    except BaseException:  # whatever failed goes to the host's console log, then PID 1 ends
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


class Supervisor:
    def __init__(self, state_dir: Path, base_dir: Path, boot_delay: float) -> None:
        self.state_dir = state_dir
        self.base_dir = base_dir
        self.boot_delay = boot_delay
        self.hosts: dict[str, HostProc] = {}
        self.by_pid: dict[int, HostProc] = {}
        self.running = True
        # What hosts get (the limit this process was started with); the supervisor itself keeps one console log
        # open per host, so it raises its own soft limit to the hard one (1,000 hosts > a 1,024 default).
        self.nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile[1], self.nofile[1]))

    # -- hosts -----------------------------------------------------------------------------------------
    def spawn(self, h: HostProc) -> None:
        self._spawned([self._fork(h)])

    def _fork(self, h: HostProc) -> tuple[HostProc, int, int]:
        """Start booting ``h``; returns (host, middle process, read end of the pipe that brings the host's PID)."""
        h.log = (h.dir / "console.log").open("ab")
        read_end, write_end = os.pipe()
        middle = os.fork()
        if middle == 0:  # new namespaces for the children of this process, one child (the host's PID 1), exit
            code = 1
            try:
                os.close(read_end)
                if _libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWPID) != 0:
                    raise OSError(ctypes.get_errno(), "unshare(mount, uts, pid)")
                pid = os.fork()
                if pid == 0:
                    os.close(write_end)
                    _host_init(h.dir, self.base_dir, h.log.fileno(), self.nofile)
                os.write(write_end, f"{pid}\n".encode())
                code = 0
            except BaseException:  # the host stays down; the reason is in its console log
                os.write(h.log.fileno(), traceback.format_exc().encode())
            finally:
                os._exit(code)
        os.close(write_end)
        return h, middle, read_end

    def _spawned(self, forks: list[tuple[HostProc, int, int]]) -> None:
        """Record the hosts' PIDs once their middle processes are done (all forked first, then collected, so a
        busy machine's scheduling delay is paid once per batch, not once per host)."""
        for h, middle, read_end in forks:
            with os.fdopen(read_end, "rb") as pipe:
                data = pipe.read()
            os.waitpid(middle, 0)  # the host's PID 1 is now our child (we are its subreaper)
            h.init_pid = int(data) if data.strip() else None
            h.returncode = None
            h.restart_at, h.stop_requested = None, False
            h.boots += 1
            if h.init_pid is None:  # the namespaces could not be made: the reason is in the host's console log
                self._reaped(h)
                h.state, h.last_exit = "crashed", 1
                continue
            self.by_pid[h.init_pid] = h
            (h.dir / "init.pid").write_text(f"{h.init_pid}\n")
            h.state = "up"

    def reap(self) -> None:
        """Collect every exited child (one ``waitpid`` per exit, not one per host)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            h = self.by_pid.pop(pid, None)
            if h is not None and h.init_pid == pid:
                h.returncode = os.waitstatus_to_exitcode(status)

    def start(self, names: list[str]) -> dict[str, str]:
        out = {}
        forks = []
        for name in names:
            h = self.hosts.get(name) or HostProc(name, self.state_dir / "hosts" / name)
            self.hosts[name] = h
            if h.state in ("up", "rebooting"):
                out[name] = "already up"
                continue
            forks.append(self._fork(h))
            out[name] = "started"
            if len(forks) == FORK_BATCH:
                self._spawned(forks)
                forks = []
        self._spawned(forks)
        return out

    def stop(self, names: list[str]) -> dict[str, str]:
        targets = [self.hosts[n] for n in names if n in self.hosts]
        for h in targets:
            h.stop_requested = True
            h.restart_at = None
            if h.running and h.init_pid:
                os.kill(h.init_pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while any(h.running for h in targets) and time.monotonic() < deadline:
            time.sleep(0.02)
            self.reap()
        for h in targets:
            if h.running and h.init_pid:
                os.kill(h.init_pid, signal.SIGKILL)  # ends the whole PID namespace
                _, status = os.waitpid(h.init_pid, 0)
                self.by_pid.pop(h.init_pid, None)
                h.returncode = os.waitstatus_to_exitcode(status)
            self._reaped(h)  # down already, or waiting to boot again after a reboot: stays down now
            h.state = "down"
        return {h.name: "stopped" for h in targets}

    def _reaped(self, h: HostProc) -> None:
        if h.init_pid is not None:
            h.last_exit = h.returncode
        if h.log is not None:
            h.log.close()
            h.log = None
        h.init_pid, h.returncode = None, None
        (h.dir / "init.pid").write_text("\n")

    def poll(self) -> None:
        self.reap()
        now = time.monotonic()
        for h in self.hosts.values():
            if h.init_pid is not None and h.returncode is not None:
                code = h.returncode
                self._reaped(h)
                if h.stop_requested:
                    h.state = "down"
                elif code == REBOOT_EXIT:
                    h.state, h.restart_at = "rebooting", now + self.boot_delay
                elif code == 0:
                    h.state = "down"
                else:
                    h.state = "crashed"
            if h.state == "rebooting" and h.restart_at is not None and now >= h.restart_at:
                self.spawn(h)

    def status(self) -> dict[str, Any]:
        return {
            n: {"state": h.state, "init_pid": h.init_pid, "boots": h.boots, "last_exit": h.last_exit}
            for n, h in sorted(self.hosts.items())
        }

    # -- requests --------------------------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        names = [str(n) for n in req.get("hosts", [])]
        if op == "start":
            return {"ok": True, "result": self.start(names)}
        if op == "stop":
            return {"ok": True, "result": self.stop(names)}
        if op == "status":
            return {"ok": True, "result": self.status()}
        if op == "shutdown":
            result = self.stop(list(self.hosts))
            self.running = False
            return {"ok": True, "result": result}
        return {"ok": False, "error": f"unknown op {op!r}"}

    def serve(self) -> None:
        sock_path = self.state_dir / "supervisor.sock"
        sock_path.unlink(missing_ok=True)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        srv.bind(str(sock_path))
        os.umask(old)
        srv.listen(16)
        srv.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        (self.state_dir / "supervisor.pid").write_text(f"{os.getpid()}\n")
        try:
            while self.running:
                for _key, _ in sel.select(timeout=0.1):
                    conn, _ = srv.accept()
                    with conn:
                        conn.settimeout(30)
                        data = b""
                        while not data.endswith(b"\n"):
                            chunk = conn.recv(65536)
                            if not chunk:
                                break
                            data += chunk
                        try:
                            reply = self.handle(json.loads(data or b"{}"))
                        except Exception as exc:  # a bad request must not take the lab down
                            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                        conn.sendall(json.dumps(reply).encode() + b"\n")
                self.poll()
        finally:
            self.stop(list(self.hosts))
            sel.close()
            srv.close()
            sock_path.unlink(missing_ok=True)
            (self.state_dir / "supervisor.pid").unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    state_dir, base_dir, delay = Path(argv[1]), Path(argv[2]), float(argv[3])
    Supervisor(state_dir, base_dir, delay).serve()


if __name__ == "__main__":
    main(sys.argv)
