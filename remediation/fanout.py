"""Fleet fan-out over SSH with Fabric: bounded, timed out, host keys verified, every host kept.

Never a bare ``ThreadingGroup`` over the whole fleet (one thread per host, no timeouts): a bounded pool runs
one Fabric ``Connection`` per host with a connect timeout and a command timeout; a non-zero exit is data
(``warn=True``), not an exception. Host keys are checked against the host's known_hosts file and unknown
keys are rejected (paramiko ``RejectPolicy``), never added.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from .errors import FanoutError
from .inventory import Host


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class HostRun:
    host: str
    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    error: str | None = None


@dataclass(frozen=True)
class FanoutResult:
    runs: Mapping[str, HostRun]
    seconds: float

    def by_status(self, status: Status) -> list[str]:
        return sorted(h for h, r in self.runs.items() if r.status is status)

    @property
    def all_ok(self) -> bool:
        return all(r.status is Status.OK for r in self.runs.values())


@functools.lru_cache(maxsize=64)
def _known_hosts_file(path: str, mtime_ns: int):  # type: ignore[no-untyped-def]
    """Parse a known_hosts file once per run (not once per host: that grows with the square of the fleet)."""
    import paramiko

    keys = paramiko.HostKeys()
    keys.load(path)
    return keys


@functools.lru_cache(maxsize=16)
def _private_key(path: str, mtime_ns: int):  # type: ignore[no-untyped-def]
    import paramiko

    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key_file(path)
        except paramiko.SSHException:
            continue
    raise FanoutError(f"private key {path} is not an unencrypted ed25519, ECDSA or RSA key; use an ssh-agent-free key")


def _connect_kwargs(host: Host) -> dict[str, object]:
    kwargs: dict[str, object] = {"allow_agent": False, "look_for_keys": host.key_file is None}
    if host.key_file:
        try:
            kwargs["pkey"] = _private_key(str(host.key_file), host.key_file.stat().st_mtime_ns)
        except OSError as exc:
            raise FanoutError(f"private key {host.key_file} for {host.name} cannot be read: {exc.strerror}") from None
    return kwargs


def _connection(host: Host, connect_timeout: float):  # type: ignore[no-untyped-def]
    import paramiko
    from fabric import Config, Connection

    config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True}})
    conn = Connection(
        host=host.address,
        user=host.user,
        port=host.port,
        connect_timeout=connect_timeout,
        connect_kwargs=_connect_kwargs(host),
        config=config,
    )
    client = conn.client
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    known = host.known_hosts
    if known is None:
        client.load_system_host_keys()
        return conn
    try:
        shared = _known_hosts_file(str(known), Path(known).stat().st_mtime_ns)
    except OSError:
        raise FanoutError(
            f"known_hosts file {known} for {host.name} cannot be read: run `invoke lab.up` or fix the inventory"
        ) from None
    lookup_name = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    for keytype, key in (shared.lookup(lookup_name) or {}).items():
        client.get_host_keys().add(lookup_name, keytype, key)
    return conn


class CommandTimeout(Exception):
    pass


def _exec(client, command: str, stdin: bytes | None, timeout: float) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    """Run one command on an open connection: stdin sent then closed (EOF), output read until exit."""
    deadline = time.monotonic() + timeout
    chan = client.get_transport().open_session(timeout=timeout)
    try:
        chan.settimeout(0.2)
        chan.exec_command(command)
        if stdin is not None:
            view = memoryview(stdin)
            while view:
                if time.monotonic() > deadline:
                    raise CommandTimeout
                try:
                    sent = chan.send(view[:32768])
                except TimeoutError:
                    continue
                view = view[sent:]
        chan.shutdown_write()
        out, err = bytearray(), bytearray()
        while True:
            if chan.recv_ready():
                out += chan.recv(65536)
                continue
            if chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                continue
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if time.monotonic() > deadline:
                raise CommandTimeout
            chan.status_event.wait(0.05)
        return chan.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")
    finally:
        chan.close()


def run_one(host: Host, command: str, stdin: bytes | None, connect_timeout: float, timeout: float) -> HostRun:
    import paramiko

    t0 = time.monotonic()
    conn = None
    try:
        conn = _connection(host, connect_timeout)
        conn.open()
        code, out, err = _exec(conn.client, command, stdin, timeout)
        status = Status.OK if code == 0 else Status.FAILED
        return HostRun(host.name, status, code, out, err, time.monotonic() - t0)
    except CommandTimeout:
        return HostRun(
            host.name, Status.TIMED_OUT, None, "", "", time.monotonic() - t0, f"command timed out after {timeout:g} s"
        )
    except FanoutError:
        raise
    except Exception as exc:  # one host's failure is a value, not a crash
        name = type(exc).__name__
        elapsed = time.monotonic() - t0
        if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
            return HostRun(
                host.name,
                Status.UNREACHABLE,
                None,
                "",
                "",
                elapsed,
                f"host key not in known_hosts ({exc}); refusing to connect",
            )
        if isinstance(exc, paramiko.BadHostKeyException):
            return HostRun(host.name, Status.UNREACHABLE, None, "", "", elapsed, f"host key mismatch: {exc}")
        if isinstance(exc, (OSError, socket.timeout, paramiko.SSHException, EOFError)):
            return HostRun(host.name, Status.UNREACHABLE, None, "", "", elapsed, f"{name}: {exc}")
        return HostRun(host.name, Status.FAILED, None, "", "", elapsed, f"{name}: {exc}")
    finally:
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection must not mask the result
                conn.close()


def fan_out(
    hosts: Iterable[Host],
    command: str,
    *,
    stdin: bytes | None = None,
    concurrency: int = 32,
    connect_timeout: float = 10.0,
    timeout: float = 60.0,
    progress: Callable[[HostRun], None] | None = None,
) -> FanoutResult:
    """Run ``command`` on every host (at most ``concurrency`` at once); every host is in the result."""
    hosts = list(hosts)
    if concurrency < 1:
        raise FanoutError(f"--concurrency {concurrency} must be at least 1")
    t0 = time.monotonic()
    runs: dict[str, HostRun] = {}
    if not hosts:
        return FanoutResult(runs, 0.0)
    with ThreadPoolExecutor(max_workers=min(concurrency, len(hosts)), thread_name_prefix="fanout") as pool:
        futures = {pool.submit(run_one, h, command, stdin, connect_timeout, timeout): h for h in hosts}
        for fut in as_completed(futures):
            run = fut.result()
            runs[run.host] = run
            if progress is not None:
                progress(run)
    return FanoutResult(dict(sorted(runs.items())), time.monotonic() - t0)
