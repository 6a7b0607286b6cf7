"""The lab supervisor: one long-lived process, parent of every lab host.

Each host runs as ``unshare --mount --uts --pid --fork ... python -m lab.boot`` (which becomes gpulab-init,
PID 1 of the host). The supervisor polls every child: exit 100 means the host rebooted itself, so it is
booted again after ``boot_delay``; exit 0 means it was halted and stays down.

It answers one JSON request per connection on a Unix socket in the state directory (mode 0600):
``{"op": "start"|"stop"|"status"|"shutdown", "hosts": [...]}``. Standard library only.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REBOOT_EXIT = 100
STOP_GRACE = 5.0


@dataclass
class HostProc:
    name: str
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    init_pid: int | None = None
    state: str = "down"  # down | up | rebooting | crashed
    boots: int = 0
    restart_at: float | None = None
    last_exit: int | None = None
    stop_requested: bool = False
    log: Any = field(default=None, repr=False)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


class Supervisor:
    def __init__(self, state_dir: Path, base_dir: Path, boot_delay: float) -> None:
        self.state_dir = state_dir
        self.base_dir = base_dir
        self.boot_delay = boot_delay
        self.hosts: dict[str, HostProc] = {}
        self.running = True

    # -- hosts -----------------------------------------------------------------------------------------
    def spawn(self, h: HostProc) -> None:
        h.log = (h.dir / "console.log").open("ab")
        cmd = [
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--propagation",
            "private",
            sys.executable,
            "-m",
            "lab.boot",
            str(h.dir),
            str(self.base_dir),
        ]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        h.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=h.log, stderr=subprocess.STDOUT, env=env)
        h.init_pid = None
        for _ in range(200):
            kids = _children(h.proc.pid)
            if kids:
                h.init_pid = kids[0]
                break
            if h.proc.poll() is not None:
                break
            time.sleep(0.005)
        (h.dir / "init.pid").write_text(f"{h.init_pid or ''}\n")
        h.state, h.restart_at, h.stop_requested = "up", None, False
        h.boots += 1

    def start(self, names: list[str]) -> dict[str, str]:
        out = {}
        for name in names:
            h = self.hosts.get(name) or HostProc(name, self.state_dir / "hosts" / name)
            self.hosts[name] = h
            if h.state in ("up", "rebooting"):
                out[name] = "already up"
                continue
            self.spawn(h)
            out[name] = "started"
        return out

    def stop(self, names: list[str]) -> dict[str, str]:
        targets = [self.hosts[n] for n in names if n in self.hosts]
        for h in targets:
            h.stop_requested = True
            h.restart_at = None
            if h.init_pid and h.proc and h.proc.poll() is None:
                os.kill(h.init_pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for h in targets:
            if h.proc is None:  # down already, or waiting to boot again after a reboot: stays down now
                h.state = "down"
                continue
            while h.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if h.proc.poll() is None and h.init_pid:
                os.kill(h.init_pid, signal.SIGKILL)  # ends the whole PID namespace
                h.proc.wait(timeout=10)
            self._reaped(h)
            h.state = "down"
        return {h.name: "stopped" for h in targets}

    def _reaped(self, h: HostProc) -> None:
        if h.proc is not None:
            h.last_exit = h.proc.returncode
        if h.log is not None:
            h.log.close()
            h.log = None
        h.proc, h.init_pid = None, None
        (h.dir / "init.pid").write_text("\n")

    def poll(self) -> None:
        now = time.monotonic()
        for h in self.hosts.values():
            if h.proc is not None and h.proc.poll() is not None:
                code = h.proc.returncode
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
