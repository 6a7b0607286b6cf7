"""Fleet fan-out over SSH with Fabric: bounded, timed out, host keys verified, every host kept.

Never a bare ``ThreadingGroup`` over the whole fleet (one thread per host, no timeouts): a bounded pool runs
one Fabric ``Connection`` per host (one Fabric ``Config`` per pool thread) with a connect timeout and a command
timeout; a non-zero exit is data, not an exception.

It connects the way Ansible's ssh connection (that is, ssh(1)) does with the same inventory
(:mod:`remediation.transport.sshopts` reads the options): keys from the SSH agent and from identity files, encrypted
ones through the agent or a passphrase file (:mod:`remediation.transport.sshauth`); ``ProxyJump`` hops reached with
ssh's defaults and shared by every host behind them, or a ``ProxyCommand``. Host keys are checked strictly, for
every hop too, against the files ssh would read (:mod:`remediation.transport.knownhosts`): the inventory's
``UserKnownHostsFile`` (else ``~/.ssh/known_hosts``) and the system's ``/etc/ssh/ssh_known_hosts`` (unless
``GlobalKnownHostsFile`` says otherwise). An unknown, changed or revoked key is refused, never added.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from remediation.core.errors import FanoutError
from remediation.transport import knownhosts
from remediation.transport.inventory import Host
from remediation.transport.sshauth import Identities
from remediation.transport.sshopts import (
    DEFAULT_GLOBAL_KNOWN_HOSTS,
    DEFAULT_USER_KNOWN_HOSTS,
    JumpHost,
    SshOptions,
    known_hosts_name,
    local_user,
)

# ssh(1)'s system-wide known_hosts files, read for every host unless GlobalKnownHostsFile says otherwise.
GLOBAL_KNOWN_HOSTS: tuple[str, ...] = DEFAULT_GLOBAL_KNOWN_HOSTS
SUDO = "sudo -n --"  # never prompts: a password it would need is an error (exit 1), not a hung probe


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


class HostKeyRefused(Exception):
    """The server's host key is unknown, changed or revoked: the connection is refused (strict checking)."""


class GatewayError(Exception):
    """A ProxyJump hop could not be reached, verified or authenticated: every host behind it is unreachable."""


@dataclass(frozen=True)
class _Endpoint:
    """One SSH server to connect to: a fleet host, or one hop of its ProxyJump chain."""

    label: str
    host: str
    port: int
    user: str
    options: SshOptions


def _endpoint(host: Host) -> _Endpoint:
    return _Endpoint(host.name, host.address, host.port, host.user, host.ssh)


def _jump_endpoint(hop: JumpHost) -> _Endpoint:
    """ssh(1) reaches a ProxyJump hop with its own defaults (ssh -W): none of the target's -o options."""
    user = hop.user or local_user()[0]
    return _Endpoint(f"bastion {JumpHost(hop.host, hop.port, user)}", hop.host, hop.port, user, SshOptions())


def _known_hosts_files(options: SshOptions, home: Path) -> tuple[list[Path], list[Path]]:
    """(files named in the inventory, default files) that ssh(1) would read for this endpoint."""
    named: list[Path] = []
    defaults: list[Path] = []
    if options.user_known_hosts is None:
        defaults += [home / p[2:] for p in DEFAULT_USER_KNOWN_HOSTS]
    else:
        named += list(options.user_known_hosts)
    if options.global_known_hosts is None:
        defaults += [Path(p) for p in GLOBAL_KNOWN_HOSTS]
    else:
        named += list(options.global_known_hosts)
    return named, defaults


def _host_key_check(ep: _Endpoint) -> tuple[Callable[[Any], None], list[str]]:
    """(the check of the key the server shows, the host key algorithms to disable) for one endpoint."""
    _, home = local_user()
    named, defaults = _known_hosts_files(ep.options, home)
    parsed = []
    for path in named + defaults:
        try:
            loaded = knownhosts.load(path)
        except OSError as exc:
            raise FanoutError(
                f"known_hosts file {path} for {ep.label} cannot be read ({exc.strerror}): fix the inventory"
                " (UserKnownHostsFile / GlobalKnownHostsFile) or the file's permissions"
            ) from None
        if loaded is None and path in named:
            raise FanoutError(
                f"known_hosts file {path} for {ep.label} does not exist: run `invoke lab.up` or fix the inventory"
            )
        if loaded is not None:
            parsed.append(loaded)
    name = known_hosts_name(ep.host, ep.port, ep.options.host_key_alias)
    found = knownhosts.entries(parsed, name)
    searched = [p for p in named + defaults if p.exists()]

    def verify(key: Any) -> None:
        result = knownhosts.check(found, name, key.asbytes(), searched)
        if not result.ok:
            raise HostKeyRefused(result.detail)

    allowed = knownhosts.allowed_algorithms(found)
    disabled = [] if not allowed else [a for a in _host_key_algorithms() if a not in allowed]
    return verify, disabled


def _host_key_algorithms() -> tuple[str, ...]:
    import paramiko

    return tuple(paramiko.Transport._preferred_keys)


def _policy(verify: Callable[[Any], None]) -> Any:
    import paramiko

    class StrictPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
        """Called for every key (no key is loaded into paramiko's own stores): known -> go on, else refuse."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            verify(key)

    return StrictPolicy()


def _proxy_command(command: str) -> Any:
    """ProxyCommand as ssh(1) runs it: through the shell (``sh -c 'exec COMMAND'``), tokens already expanded."""
    import paramiko

    return paramiko.ProxyCommand(shlex.join(["/bin/sh", "-c", "exec " + command]))


#: Ciphers tried first, in this order: the AEAD modes OpenSSH offers by default (Azure's Ubuntu images included).
#: Their tag is checked in C by ``cryptography``; with paramiko's default first choice (aes128-ctr + hmac-sha2-256)
#: every packet's MAC is compared byte by byte in Python, about a tenth of the controller's CPU per host in the
#: profile (issue 25). Every other cipher paramiko knows stays offered after them, so a server without GCM still
#: negotiates as before: an order, not a restriction.
PREFERRED_CIPHERS: tuple[str, ...] = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


@functools.cache
def _transport_class() -> type:
    import paramiko

    ciphers = tuple(c for c in PREFERRED_CIPHERS if c in paramiko.Transport._preferred_ciphers)
    rest = tuple(c for c in paramiko.Transport._preferred_ciphers if c not in ciphers)

    class AeadFirstTransport(paramiko.Transport):  # type: ignore[misc]
        """paramiko's Transport with :data:`PREFERRED_CIPHERS` first in its cipher preference."""

        _preferred_ciphers = ciphers + rest

        def _parse_debug(self, m: Any) -> None:
            """sshd's SSH_MSG_DEBUG lines (one per authorized_keys option) only go to the debug log: paramiko
            escapes each byte of them in Python first, so they are read only when that log is on."""
            if self.logger.isEnabledFor(logging.DEBUG):
                super()._parse_debug(m)

    return AeadFirstTransport


_THREAD = threading.local()


def _fabric_config() -> Any:
    """The calling thread's Fabric ``Config`` (no ssh_config files: :mod:`sshopts` reads the inventory's options;
    commands hidden and a non-zero exit returned, not raised). Fabric merges a new one for each ``Connection`` built
    without one, about a tenth of the controller's CPU per audited host in the profile (issue 25), so each pool
    thread makes one and reuses it. Not one for the whole process: Fabric's own ``Connection`` wrote
    ``inline_ssh_env`` into its ``Config``, which then re-merged every layer, and another thread reading it mid-merge
    found keys missing (shared, 13 of 1,000 hosts failed with "No attribute or config key found for 'gateway'").
    :func:`_connection_class` no longer writes it; one per thread stays the guard against any other write."""
    config = getattr(_THREAD, "fabric_config", None)
    if config is None:
        from fabric import Config

        config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True}})
        _THREAD.fabric_config = config
    return config


@functools.cache
def _connection_class() -> type:
    from fabric import Connection

    real = frozenset(dir(Connection)) | {"inline_ssh_env"}

    class FleetConnection(Connection):  # type: ignore[misc]  # Fabric is untyped
        """Fabric's ``Connection``, cheaper to build (one per host of every audit) and the same once built.

        - ``inline_ssh_env`` is a real attribute: Fabric's ``__init__`` has no class attribute for it, so invoke's
          ``DataProxy`` wrote it into the (per-thread) ``Config``, which then re-merged all its layers: 8 % of the
          controller's CPU per host in the profile (issue 25);
        - attributes that are the class's own are set directly: ``DataProxy.__setattr__`` tells a real attribute
          from a config key with ``key in dir(self)`` on every one of the 14 sets in ``__init__``. A name that is
          not the class's still goes through ``DataProxy``, as before."""

        inline_ssh_env = None

        def __setattr__(self, key: str, value: Any) -> None:
            if key in real:
                object.__setattr__(self, key, value)
            else:
                super().__setattr__(key, value)

    return FleetConnection


def _connection(ep: _Endpoint, connect_timeout: float, sock: Any = None) -> Any:
    """A Fabric connection (not opened) that checks the host key strictly and authenticates like ssh(1)."""
    Connection = _connection_class()

    verify, disabled = _host_key_check(ep)
    _, home = local_user()
    ids = Identities(ep.user, ep.options.identity_files, ep.options.identities_only, ep.options.identity_agent, home)
    kwargs: dict[str, object] = {"auth_strategy": ids.strategy()}
    if disabled:
        kwargs["disabled_algorithms"] = {"keys": disabled}
    if sock is not None:
        kwargs["sock"] = sock
    kwargs["transport_factory"] = _transport_class()
    conn = Connection(
        host=ep.host,
        user=ep.user,
        port=ep.port,
        connect_timeout=connect_timeout,
        connect_kwargs=kwargs,
        config=_fabric_config(),
    )
    # Fabric's own default is AutoAddPolicy; ours is set before anything connects, and no key is preloaded into
    # paramiko's stores, so every key the server shows goes through verify().
    conn.client.set_missing_host_key_policy(_policy(verify))
    return conn


#: How long a connection run over a bastion's channel gets to stop its own thread before the channel is closed.
TUNNEL_JOIN_S = 5.0


class _Tunnel:
    """A ``direct-tcpip`` channel as the socket of the SSH connection run over it.

    Paramiko's ``Transport.close()`` closes its socket without waiting for its own thread, which may still be
    writing (the CLOSE it answers to the server's CLOSE of the last session). On a channel that would be a data
    packet after the channel's CLOSE, and OpenSSH answers that by dropping the whole bastion connection ("data
    packet referred to nonexistent channel"), cutting every other host behind the bastion mid-run. So the
    transport's ``close()`` of this socket does nothing; :func:`_close` stops the transport, waits for its thread
    (at most :data:`TUNNEL_JOIN_S`), then closes the channel."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def __getattr__(self, name: str) -> Any:  # send, recv, settimeout, ...: the channel's own
        return getattr(self.channel, name)

    def close(self) -> None:
        """Left to :meth:`shut`: called by the transport while its thread may still write."""

    def shut(self, transport: Any = None) -> None:
        if transport is not None and transport is not threading.current_thread():
            with contextlib.suppress(Exception):
                transport.join(TUNNEL_JOIN_S)
        with contextlib.suppress(Exception):
            self.channel.close()


def _shut(sock: Any) -> None:
    """Close a connection's socket that was never handed to a transport (a failed connect)."""
    with contextlib.suppress(Exception):
        if isinstance(sock, _Tunnel):
            sock.shut()
        elif sock is not None:
            sock.close()


def _close(conn: Any) -> None:
    """Close a connection; one run over a bastion's channel closes that channel only once its transport's
    thread has stopped (:class:`_Tunnel`)."""
    transport = None
    with contextlib.suppress(Exception):
        transport = conn.client.get_transport()
    with contextlib.suppress(Exception):
        conn.close()
    sock = getattr(transport, "sock", None)
    if isinstance(sock, _Tunnel):
        sock.shut(transport)


class Gateways:
    """ProxyJump hops, opened once per fan-out and shared by every host behind them (one SSH connection to a
    bastion, one ``direct-tcpip`` channel per host: a bastion's MaxStartups is not hit by the fleet's size).
    A hop that fails is remembered for the run: every host behind it is unreachable with the hop's reason."""

    def __init__(self, connect_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._locks: dict[tuple[JumpHost, ...], threading.Lock] = {}
        self._open: dict[tuple[JumpHost, ...], Any] = {}
        self._failed: dict[tuple[JumpHost, ...], str] = {}
        self._order: list[Any] = []

    def channel(self, chain: tuple[JumpHost, ...], dest: tuple[str, int]) -> Any:
        """A ``direct-tcpip`` channel to ``dest`` through the last hop of ``chain``."""
        conn = self._hop(chain)
        label = _jump_endpoint(chain[-1]).label
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise GatewayError(f"{label}: connection lost")
        try:
            return _Tunnel(transport.open_channel(
                "direct-tcpip", dest_addr=dest, src_addr=("", 0), timeout=self.connect_timeout
            ))
        except Exception as exc:
            raise GatewayError(f"{label} could not reach {dest[0]}:{dest[1]}: {_describe(exc)}") from None

    def _hop(self, chain: tuple[JumpHost, ...]) -> Any:
        with self._lock:
            lock = self._locks.setdefault(chain, threading.Lock())
        with lock:
            if chain in self._failed:
                raise GatewayError(self._failed[chain])
            if chain in self._open:
                return self._open[chain]
            ep = _jump_endpoint(chain[-1])
            sock = conn = None
            try:
                sock = self.channel(chain[:-1], (ep.host, ep.port)) if len(chain) > 1 else None
                conn = _connection(ep, self.connect_timeout, sock)
                conn.open()
            except BaseException as exc:
                if conn is not None:
                    _close(conn)
                _shut(sock)
                self._record(chain, ep, exc)
                raise self._error(chain, exc) from None
            self._open[chain] = conn
            self._order.append(conn)
            return conn

    def _record(self, chain: tuple[JumpHost, ...], ep: _Endpoint, exc: BaseException) -> None:
        if isinstance(exc, GatewayError):
            self._failed[chain] = str(exc)
        elif isinstance(exc, Exception) and not isinstance(exc, FanoutError):
            self._failed[chain] = f"{ep.label}: {_describe(exc)}"

    def _error(self, chain: tuple[JumpHost, ...], exc: BaseException) -> BaseException:
        return GatewayError(self._failed[chain]) if chain in self._failed else exc

    def close(self) -> None:
        for conn in reversed(self._order):  # the farthest hop first: it runs over a channel of the one before
            _close(conn)
        self._order.clear()
        self._open.clear()


def _describe(exc: BaseException) -> str:
    import paramiko

    if isinstance(exc, HostKeyRefused | GatewayError):
        return str(exc)
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed: {exc}"
    if isinstance(exc, paramiko.ChannelException):
        return f"channel refused ({exc.code}): {exc.text}"
    return f"{type(exc).__name__}: {exc}"


def _open_target(host: Host, connect_timeout: float, gateways: Gateways) -> Any:
    ep = _endpoint(host)
    sock = None
    if ep.options.proxy_jump:
        sock = gateways.channel(ep.options.proxy_jump, (ep.host, ep.port))
    elif ep.options.proxy_command:
        sock = _proxy_command(ep.options.proxy_command)
    conn = None
    try:
        conn = _connection(ep, connect_timeout, sock)
        conn.open()
    except BaseException:
        # A failed connect must not leave a ProxyCommand process running or a channel open on the bastion.
        if conn is not None:
            _close(conn)
        _shut(sock)
        raise
    return conn


# --- privilege escalation (Ansible's become) ---------------------------------------------------------------------


def become_problem(host: Host) -> str | None:
    """Why the fan-out cannot escalate on ``host`` as its inventory asks (None when it can, or need not)."""
    become = host.become
    if not become.enabled:
        return None
    if become.method != "sudo":
        return (f"host {host.name}: ansible_become_method {become.method!r} is not supported by the fan-out (it"
                " escalates with sudo only): set ansible_become_method: sudo, or log in as root")
    if become.user != "root":
        return (f"host {host.name}: ansible_become_user {become.user!r}: the fan-out's probe and leases need root;"
                " set ansible_become_user: root (or remove it)")
    return None


def remote_command(host: Host, command: str) -> str:
    """``command`` as it is sent to ``host``: through ``sudo -n`` when the host's inventory escalates.

    A simple command (words only, as :func:`shlex.join` writes them) is run by sudo directly, so a sudoers rule
    for that program (``NOPASSWD: /usr/bin/python3``) allows it; anything else (redirections, ``||``) through
    ``sh -c``, so the whole of it runs with the privilege, never half of it."""
    if not host.become.enabled:
        return command
    return f"{SUDO} {command}" if _simple(command) else f"{SUDO} sh -c {shlex.quote(command)}"


#: Words the shell runs itself (keywords and builtins with no program of that name): sudo cannot exec them.
_SHELL_ONLY = frozenset({"!", "{", ".", "alias", "case", "cd", "eval", "exec", "export", "for", "if", "local",
                         "read", "readonly", "set", "shift", "source", "trap", "ulimit", "umask", "unset", "until",
                         "wait", "while"})


def _simple(command: str) -> bool:
    """A program and its words, as :func:`shlex.join` writes them: something sudo can exec itself. A leading
    ``NAME=value`` (``DEBIAN_FRONTEND=noninteractive apt-get ...``) or a shell keyword needs the shell."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    if not words or shlex.join(words) != command or words[0] in _SHELL_ONLY:
        return False
    name, eq, _ = words[0].partition("=")
    return not (eq and name.isidentifier())


def _program(command: str) -> str:
    """The program sudo runs for :func:`remote_command`'s ``command`` (``python3``, ``sh``), for messages."""
    return shlex.split(command)[0] if _simple(command) else "sh"


def sudo_problem(host: Host, command: str, exit_code: int | None, stderr: str) -> str | None:
    """The one line for a command that ``sudo -n`` itself refused on ``host`` (None: sudo ran it, or no sudo).

    sudo reports on stderr with a ``sudo:`` prefix and exit 1 (a password needed, no sudoers entry), or the shell
    says it is not there (exit 127). Only the leading lines are looked at: what the program printed is not sudo's."""
    if not host.become.enabled or exit_code not in (1, 127):
        return None
    user, program = host.user, _program(command)
    fix = f"give {user} passwordless sudo (NOPASSWD) for {program}, or log in as root"
    for line in stderr.splitlines()[:5]:
        text = line.strip()
        if exit_code == 1 and text.startswith("sudo:") and "a password is required" in text:
            return f"{host.name}: sudo asks for a password for {user} (sudo -n); {fix}"
        if exit_code == 1 and ("is not in the sudoers file" in text or "is not allowed to execute" in text
                               or "may not run sudo" in text):
            return f"{host.name}: sudo refuses {user} (not in sudoers for {program}); {fix}"
        if exit_code == 127 and "sudo" in text and "not found" in text:
            return (f"{host.name}: sudo is not installed, and {host.become.source} asks for it (become): install sudo"
                    " on the host, or log in as root")
    return None


EOF_GRACE_S = 2.0  # how long output may trail the exit status before the command's output is taken as complete
MIB = 1024 * 1024
MAX_STDOUT = 16 * MIB  # the most read from one host's stdout (the probe's JSON is a few hundred KiB)
MAX_STDERR = 1 * MIB


class CommandTimeout(Exception):
    pass


class OutputTooLarge(Exception):
    """A host sent more than the fan-out reads from one host: that host's error, not the controller's memory."""

    def __init__(self, stream: str, cap: int) -> None:
        super().__init__(f"probe output over {cap / MIB:g} MiB on {stream} (the fan-out reads no more from one host)")


def _exec(  # type: ignore[no-untyped-def]
    client, command: str, stdin: bytes | None, timeout: float, max_stdout: int = MAX_STDOUT,
    max_stderr: int = MAX_STDERR,
) -> tuple[int, str, str]:
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
        out, err = read_output(chan, deadline, max_stdout, max_stderr)
        return chan.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")
    finally:
        chan.close()


#: The longest a reader sleeps on :func:`_output_event` before it looks again (an exit status with no output after it).
OUTPUT_WAIT_S = 0.25


def _output_event(chan: Any) -> threading.Event | None:
    """An event paramiko sets when the channel's stdout or stderr gets data or reaches EOF (None for a channel
    that is not paramiko's). The reader used to wake every 50 ms per host while the probe ran: at a few hundred
    hosts in flight, a share of the controller's CPU spent on finding nothing to read (issue 25)."""
    buffers = (getattr(chan, "in_buffer", None), getattr(chan, "in_stderr_buffer", None))
    if any(b is None or not hasattr(b, "set_event") for b in buffers):
        return None
    event = threading.Event()
    for b in buffers:
        b.set_event(event)  # type: ignore[union-attr]
    # set_event cleared it if that buffer was empty: data the other buffer already holds must not wait.
    if any(b.read_ready() for b in buffers):  # type: ignore[union-attr]
        event.set()
    return event


def read_output(chan: Any, deadline: float, max_stdout: int, max_stderr: int) -> tuple[bytes, bytes]:
    """A channel's stdout and stderr until the command exits: at most ``max_stdout`` / ``max_stderr`` bytes each
    (:class:`OutputTooLarge` past that: nothing more is read), :class:`CommandTimeout` past ``deadline``."""
    out, err = bytearray(), bytearray()
    exited_at = None
    wake = _output_event(chan)
    while True:
        if chan.recv_ready():
            out += chan.recv(min(65536, max_stdout + 1 - len(out)))
            if len(out) > max_stdout:
                raise OutputTooLarge("stdout", max_stdout)
            continue
        if chan.recv_stderr_ready():
            err += chan.recv_stderr(min(65536, max_stderr + 1 - len(err)))
            if len(err) > max_stderr:
                raise OutputTooLarge("stderr", max_stderr)
            continue
        if chan.exit_status_ready():
            # sshd may send the exit status before the last output it still reads from the command's pipe:
            # the output is complete at EOF. A background child that keeps the pipe open gets a short grace.
            if chan.eof_received or chan.closed:
                break
            exited_at = exited_at or time.monotonic()
            if time.monotonic() - exited_at > EOF_GRACE_S:
                break
            time.sleep(0.005)
        elif wake is not None and not chan.eof_received:
            wake.wait(OUTPUT_WAIT_S)  # set by paramiko when output arrives or ends: no polling while the probe runs
        else:
            chan.status_event.wait(0.05)
        if time.monotonic() > deadline:
            raise CommandTimeout
    return bytes(out), bytes(err)


def run_one(
    host: Host,
    command: str,
    stdin: bytes | None,
    connect_timeout: float,
    timeout: float,
    gateways: Gateways | None = None,
    max_stdout: int = MAX_STDOUT,
    max_stderr: int = MAX_STDERR,
) -> HostRun:
    import paramiko

    if (problem := become_problem(host)) is not None:
        raise FanoutError(problem)
    t0 = time.monotonic()
    conn = None
    own = gateways is None
    hops = gateways if gateways is not None else Gateways(connect_timeout)
    try:
        conn = _open_target(host, connect_timeout, hops)
        code, out, err = _exec(conn.client, remote_command(host, command), stdin, timeout, max_stdout, max_stderr)
        status = Status.OK if code == 0 else Status.FAILED
        refused = sudo_problem(host, command, code, err) if status is Status.FAILED else None
        return HostRun(host.name, status, code, out, err, time.monotonic() - t0, refused)
    except CommandTimeout:
        return HostRun(
            host.name, Status.TIMED_OUT, None, "", "", time.monotonic() - t0, f"command timed out after {timeout:g} s"
        )
    except OutputTooLarge as exc:
        return HostRun(host.name, Status.FAILED, None, "", "", time.monotonic() - t0, str(exc))
    except FanoutError:
        raise
    except Exception as exc:  # one host's failure is a value, not a crash
        elapsed = time.monotonic() - t0
        if isinstance(exc, HostKeyRefused | GatewayError):
            return HostRun(host.name, Status.UNREACHABLE, None, "", "", elapsed, str(exc))
        if isinstance(exc, OSError | socket.timeout | paramiko.SSHException | EOFError):
            return HostRun(host.name, Status.UNREACHABLE, None, "", "", elapsed, _describe(exc))
        return HostRun(host.name, Status.FAILED, None, "", "", elapsed, _describe(exc))
    finally:
        if conn is not None:
            _close(conn)  # closing a broken connection must not mask the result
        if own:
            hops.close()


#: Hosts in flight per CPU of the controller, and the most at once whatever the machine. A host in flight is
#: mostly waiting (handshake round trips, the probe running on the host): one controller CPU keeps this many busy.
HOSTS_PER_CPU = 64
MAX_CONCURRENCY = 512
#: Open files one host in flight may need: its socket, a ProxyCommand's two pipes, a known_hosts or key file read.
FDS_PER_HOST = 4
FDS_RESERVED = 64  # the controller's own files (logs, the inventory, the report, Python's imports)


def auto_concurrency(hosts: int, cpus: int | None = None, fd_limit: int | None = None) -> int:
    """How many hosts the fan-out runs at once when neither ``--concurrency`` nor ``audit.concurrency`` says:

    ``min(hosts, HOSTS_PER_CPU x CPUs, (open-file soft limit - FDS_RESERVED) / FDS_PER_HOST, MAX_CONCURRENCY)``,
    at least 1. The CPUs are those this process may run on (its affinity), the limit is ``RLIMIT_NOFILE``'s soft one:
    a fleet never opens more connections than the process can hold, and a small fleet never starts idle threads."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    if fd_limit is None:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        fd_limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    by_fds = (fd_limit - FDS_RESERVED) // FDS_PER_HOST
    return max(1, min(hosts, HOSTS_PER_CPU * max(1, cpus), by_fds, MAX_CONCURRENCY))


def fan_out(
    hosts: Iterable[Host],
    command: str,
    *,
    stdin: bytes | None = None,
    concurrency: int | None = None,
    connect_timeout: float = 10.0,
    timeout: float = 60.0,
    progress: Callable[[HostRun], None] | None = None,
    max_stdout: int = MAX_STDOUT,
    max_stderr: int = MAX_STDERR,
) -> FanoutResult:
    """Run ``command`` on every host (at most ``concurrency`` at once, :func:`auto_concurrency` when None); every
    host is in the result.

    On a host whose inventory escalates (:class:`~remediation.transport.inventory.Become`) it runs through ``sudo -n``
    (:func:`remote_command`); sudo refusing it (a password needed, no sudoers entry) is that host's error (FAILED,
    one line naming the user and the fix). A become method other than sudo, or a become user other than root, is
    :class:`FanoutError` before any host is reached.

    At most ``max_stdout`` / ``max_stderr`` bytes are read from one host: a host that sends more is that host's
    error (FAILED, ``probe output over N MiB``), never the controller's memory."""
    hosts = list(hosts)
    if concurrency is None:
        concurrency = auto_concurrency(len(hosts))
    if concurrency < 1:
        raise FanoutError(f"--concurrency {concurrency} must be at least 1")
    for host in hosts:  # before any host is reached: nothing runs on one host of a run another cannot take
        if (problem := become_problem(host)) is not None:
            raise FanoutError(problem)
    t0 = time.monotonic()
    runs: dict[str, HostRun] = {}
    if not hosts:
        return FanoutResult(runs, 0.0)
    gateways = Gateways(connect_timeout)
    try:
        with ThreadPoolExecutor(max_workers=min(concurrency, len(hosts)), thread_name_prefix="fanout") as pool:
            futures = {
                pool.submit(run_one, h, command, stdin, connect_timeout, timeout, gateways, max_stdout, max_stderr): h
                for h in hosts
            }
            for fut in as_completed(futures):
                run = fut.result()
                runs[run.host] = run
                if progress is not None:
                    progress(run)
    finally:
        gateways.close()
    return FanoutResult(dict(sorted(runs.items())), time.monotonic() - t0)
