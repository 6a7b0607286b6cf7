"""The SSH settings of one inventory host, read from Ansible's connection options the way OpenSSH reads them.

Ansible's ``ssh`` connection plugin runs ``ssh [ssh_args] -o Port=.. -o IdentityFile=.. -o User=..
[ansible_ssh_common_args] [ansible_ssh_extra_args] HOST``. This module splits those pieces the way Ansible does
(``shlex``), reads the options with OpenSSH's own command-line grammar (``getopt`` with ssh's option string), and
keeps OpenSSH's rule that the first value given for an option wins (``IdentityFile`` accumulates). The result,
:class:`SshOptions`, is what the fan-out honours:

* identities: ``-i`` / ``IdentityFile`` / ``ansible_ssh_private_key_file``, ``IdentitiesOnly``, ``IdentityAgent``;
* host keys: ``UserKnownHostsFile`` (default ``~/.ssh/known_hosts``, ``~/.ssh/known_hosts2``),
  ``GlobalKnownHostsFile`` (default ``/etc/ssh/ssh_known_hosts``, ``/etc/ssh/ssh_known_hosts2``), ``HostKeyAlias``;
* the route: ``-J`` / ``ProxyJump`` (``[user@]host[:port]``, comma-separated chains, ``ssh://`` URIs) or
  ``ProxyCommand``; the first of the two given wins, ``none`` turns either off;
* ``HostName``, ``Port`` / ``-p``, ``User`` / ``-l``.

``StrictHostKeyChecking`` is read and ignored: the fan-out always checks host keys strictly. ``-F`` (an ssh_config
file) is refused: the fan-out does not read ssh_config files, so it could not connect the way ``ssh -F`` would.
Everything here is pure: no file is read and nothing is connected.
"""

from __future__ import annotations

import functools
import getopt
import os
import pwd
import re
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from remediation.core.errors import InventoryError

# OpenSSH's ssh(1) option string (ssh.c): the options that take an argument end in ':'.
SSH_OPTSTRING = "1246ab:c:e:fgi:kl:m:no:p:qstvxAB:CD:E:F:GI:J:KL:MNO:P:Q:R:S:TVw:W:XYy"
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
DEFAULT_IDENTITY_FILES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
                          "~/.ssh/id_ed25519_sk")
# Options that take a list of files (whitespace-separated, quotes allowed) or a single path.
_FILE_LIST_OPTIONS = {"userknownhostsfile", "globalknownhostsfile"}
_PATH_OPTIONS = {"identityfile", "identityagent"}


@dataclass(frozen=True)
class JumpHost:
    """One hop of ``ProxyJump``: OpenSSH connects to it with its defaults, not the target's options."""

    host: str
    port: int = 22
    user: str | None = None  # None: the local user name, as ssh(1)

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{user}{host}:{self.port}"


@dataclass(frozen=True)
class SshOptions:
    """What the fan-out takes from a host's SSH command line; ``None`` means OpenSSH's default."""

    identity_files: tuple[Path, ...] = ()
    identities_only: bool = False
    identity_agent: str | None = None  # None: $SSH_AUTH_SOCK; "none": no agent; else the agent's socket
    user_known_hosts: tuple[Path, ...] | None = None
    global_known_hosts: tuple[Path, ...] | None = None
    host_key_alias: str | None = None
    proxy_jump: tuple[JumpHost, ...] = ()
    proxy_command: str | None = None


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to connect, and how."""

    host: str
    port: int
    user: str
    options: SshOptions


def local_user() -> tuple[str, Path]:
    """The local user's name and home directory from the password database, as ssh(1) takes them."""
    return _user_entry(os.getuid())


@functools.lru_cache(maxsize=4)
def _user_entry(uid: int) -> tuple[str, Path]:
    """One password-database read per uid and process: asked for every host and connection of a fleet run."""
    entry = pwd.getpwuid(uid)
    return entry.pw_name, Path(entry.pw_dir)


# OpenSSH 9.6's checks of the host and user names it may expand into a ProxyCommand (ssh.c, valid_hostname and
# valid_ruser; CVE-2023-51385). Users are also refused control characters (a newline ends a shell command).
_HOST_FORBIDDEN = frozenset("'`\"$\\;&<>|(){}")
_USER_FORBIDDEN = frozenset("'`\";&<>|(){}")


def printable(text: str) -> str:
    """``text`` for a one-line message: characters that are not printable shown as escapes (``\\n``)."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _is_control(ch: str) -> bool:
    return ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F or not ch.isprintable()


def hostname_problem(name: str) -> str | None:
    """Why OpenSSH would refuse ``name`` as a host name (``valid_hostname``); None when it would not."""
    if not name:
        return "is empty"
    if name.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    bad = sorted({ch for ch in name if ch in _HOST_FORBIDDEN or _is_control(ch)})
    if bad:
        return f"contains shell metacharacters or spaces ({' '.join(repr(ch) for ch in bad)})"
    return None


def user_problem(name: str) -> str | None:
    """Why OpenSSH would refuse ``name`` as a remote user name (``valid_ruser``, plus control characters)."""
    if not name:
        return "is empty"
    bad = sorted({ch for ch in name if ch in _USER_FORBIDDEN or (_is_control(ch) and ch != " ")})
    if bad:
        return f"contains shell metacharacters or control characters ({' '.join(repr(ch) for ch in bad)})"
    if re.search(r"\s-", name):
        return "has a '-' after a space (it would be read as an option)"
    if name.endswith("\\"):
        return "ends in a backslash"
    return None


def _refuse(where: str, what: str, value: str, problem: str, fix: str) -> InventoryError:
    return InventoryError(
        f"{where}: {what} {value!r} {problem}; OpenSSH refuses such names (CVE-2023-51385) and so does the"
        f" fan-out: {fix}"
    )


def expand_tokens(text: str, tokens: Mapping[str, str], where: str) -> str:
    """OpenSSH's ``%x`` tokens (``%%`` is a percent sign); an unknown token is refused, as ssh(1) does."""

    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "%":
            return "%"
        if key not in tokens:
            raise InventoryError(f"{where}: unknown token %{printable(key)} in {text!r} (known: %%, "
                                 f"{', '.join('%' + k for k in sorted(tokens))})")
        return tokens[key]

    return re.sub(r"%(.)", one, text)


def expand_path(text: str, tokens: Mapping[str, str], home: Path, where: str) -> Path:
    """A path from an SSH option: ``~`` is the local user's home (from the password database), then tokens."""
    if text == "~" or text.startswith("~/"):
        text = str(home) + text[1:]
    elif text.startswith("~"):
        raise InventoryError(f"{where}: {text!r}: ~user paths are not supported; write the full path")
    return Path(expand_tokens(text, tokens, where))


def split_args(text: str, where: str) -> list[str]:
    """Split one ``*_args`` value as Ansible's ssh plugin does (``shlex``; empty pieces dropped)."""
    try:
        return list(_split(text))
    except ValueError as exc:
        raise InventoryError(f"{where}: cannot split {text!r}: {exc}") from None


@functools.lru_cache(maxsize=256)
def _split(text: str) -> tuple[str, ...]:
    """:func:`split_args` once per distinct text: a fleet's hosts mostly share their ``*_args``."""
    return tuple(part.strip() for part in shlex.split(text) if part.strip())


def _option(text: str, where: str) -> tuple[str, str]:
    """``Key=Value`` or ``Key Value`` (an ``-o`` argument) -> (lower-case key, value)."""
    m = re.match(r"\s*([A-Za-z][A-Za-z0-9]*)\s*(?:=\s*|\s+)(.*?)\s*$", text, re.S)
    if not m:
        raise InventoryError(f"{where}: -o {text!r} is not Key=Value")
    return m.group(1).lower(), m.group(2)


def port_number(text: str) -> int | None:
    """A TCP port from ASCII digits (``str.isdigit`` also takes ``²``, which ``int`` refuses); None if not one."""
    if not re.fullmatch(r"[0-9]{1,5}", text):
        return None
    return int(text) if 1 <= int(text) <= 65535 else None


def parse_jump(spec: str, where: str) -> tuple[JumpHost, ...]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]``, comma-separated (the first hop first)."""
    hops = []
    for raw in spec.split(","):
        item = raw.strip()
        if item.startswith("ssh://"):
            item = item[len("ssh://"):].rstrip("/")
        user = None
        if "@" in item:
            user, item = item.rsplit("@", 1)
        port = 22
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", item)
        if m:
            host, port_text = m.group(1), m.group(2)
        elif item.count(":") == 1:
            host, port_text = item.split(":")
        else:
            host, port_text = item, None
        if port_text is not None:
            if (number := port_number(port_text)) is None:
                raise InventoryError(f"{where}: ProxyJump {spec!r}: port {port_text!r} is not 1-65535")
            port = number
        if not host or (user is not None and not user) or re.search(r"[\s/]", host):
            raise InventoryError(f"{where}: ProxyJump {spec!r} is not [user@]host[:port][,...]")
        fix = "fix ProxyJump / -J in ansible_ssh_common_args or ansible_ssh_extra_args"
        if (problem := hostname_problem(host)) is not None:
            raise _refuse(where, "ProxyJump host", host, problem, fix)
        if user is not None and (problem := user_problem(user)) is not None:
            raise _refuse(where, "ProxyJump user", user, problem, fix)
        hops.append(JumpHost(host, port, user))
    return tuple(hops)


def _parse(argv: Sequence[str], where: str) -> tuple[dict[str, str], list[str], list[str]]:
    """argv -> (first value of each option, IdentityFile values in order, option order)."""
    try:
        opts, rest = getopt.getopt(list(argv), SSH_OPTSTRING)
    except getopt.GetoptError as exc:
        raise InventoryError(
            f"{where}: {printable(str(exc))}; an ssh option Ansible would pass on is not one ssh(1) knows"
        ) from None
    if rest:
        raise InventoryError(f"{where}: unexpected argument {rest[0]!r} (only ssh options belong here)")
    first: dict[str, str] = {}
    identity: list[str] = []
    order: list[str] = []

    def put(key: str, value: str) -> None:
        if key == "identityfile":
            identity.append(value)
            return
        if key not in first:
            first[key] = value
            order.append(key)

    for flag, value in opts:
        if flag == "-o":
            put(*_option(value, where))
        elif flag == "-i":
            put("identityfile", value)
        elif flag == "-l":
            put("user", value)
        elif flag == "-p":
            put("port", value)
        elif flag == "-J":
            put("proxyjump", value)
        elif flag == "-F":
            raise InventoryError(
                f"{where}: -F {printable(value)} (an ssh_config file) is not read by the fan-out; put ProxyJump,"
                " UserKnownHostsFile, IdentityFile, ... in ansible_ssh_common_args instead"
            )
    return first, identity, order


def _one_path(value: str, where: str) -> str:
    parts = split_args(value, where)
    if len(parts) != 1:
        raise InventoryError(f"{where}: {value!r} must be one path")
    return parts[0]


def _yes(value: str, key: str, where: str) -> bool:
    text = value.strip().lower()
    if text in ("yes", "true"):
        return True
    if text in ("no", "false"):
        return False
    raise InventoryError(f"{where}: {key} {value!r} must be yes or no")


def ssh_target(
    *,
    host: str,
    port: int | None,
    user: str | None,
    private_key_file: str | None,
    ssh_args: str = "",
    common_args: str = "",
    extra_args: str = "",
    where: str,
    host_var: str = "ansible_host",
) -> SshTarget:
    """Read a host's connection settings as ``ssh`` would get them from Ansible's ssh connection plugin.

    ``where`` names the host in errors. ``port``/``user``/``private_key_file`` are Ansible's own options
    (``ansible_port``, ``ansible_user``, ``ansible_ssh_private_key_file``): Ansible passes them before the
    ``*_args``, so they win over a ``-o Port=`` there (first value wins). ``host_var`` names the variable
    ``host`` came from, for errors.

    As OpenSSH 9.6+ does (CVE-2023-51385), a host or user name with shell metacharacters is refused
    (:class:`InventoryError`) before anything is expanded or run; and every token expanded into a ``ProxyCommand``
    is quoted for the shell (``shlex.quote``), so no name reaches ``/bin/sh`` as shell text."""
    argv = split_args(ssh_args, f"{where}: ssh_args")
    if port is not None:
        argv += ["-o", f"Port={port}"]
    if private_key_file:
        argv += ["-o", f"IdentityFile={shlex.quote(os.path.expanduser(private_key_file))}"]
    if user:
        argv += ["-o", f"User={user}"]
    argv += split_args(common_args, f"{where}: ansible_ssh_common_args")
    argv += split_args(extra_args, f"{where}: ansible_ssh_extra_args")
    first, identity, order = _parse(argv, where)

    args_vars = "ansible_ssh_common_args / ansible_ssh_extra_args"
    if (problem := hostname_problem(host)) is not None:
        raise _refuse(where, host_var, host, problem, f"fix {host_var} in the inventory (a DNS name or an IP address)")
    if "user" in first and (problem := user_problem(first["user"])) is not None:
        var = "ansible_user" if user else f"-l / -o User in {args_vars}"
        raise _refuse(where, var, first["user"], problem, f"fix {var} in the inventory")
    local_name, home = local_user()
    hostname = first.get("hostname", host)
    port_text = first.get("port", "22")
    if (number := port_number(port_text)) is None:
        raise InventoryError(f"{where}: port {port_text!r} is not 1-65535")
    the_port = number
    the_user = first.get("user") or local_name
    alias = first.get("hostkeyalias")
    tokens = {
        "d": str(home), "u": local_name, "h": hostname, "n": host, "p": str(the_port), "r": the_user,
        "k": alias or hostname, "i": str(os.getuid()), "l": socket.gethostname(),
        "L": socket.gethostname().split(".")[0],
    }
    if "hostname" in first:  # ssh expands tokens in a HostName option, not in the destination it was given
        hostname = expand_tokens(hostname, {**tokens, "h": host}, where)
        if (problem := hostname_problem(hostname)) is not None:
            raise _refuse(where, f"-o HostName in {args_vars}", hostname, problem,
                          "fix the HostName option in the inventory")
        tokens.update(h=hostname, k=alias or hostname)

    def files(key: str) -> tuple[Path, ...] | None:
        if key not in first:
            return None
        parts = split_args(first[key], where)
        if [p.lower() for p in parts] == ["none"]:
            return ()
        return tuple(expand_path(p, tokens, home, f"{where}: {key}") for p in parts)

    agent = first.get("identityagent")
    if agent is not None:
        agent = _one_path(agent, where)
        if agent.lower() == "none":
            agent = "none"
        elif agent == "SSH_AUTH_SOCK":
            agent = None
        elif agent.startswith("$"):
            agent = os.environ.get(agent[1:].strip("{}")) or "none"
        else:
            agent = str(expand_path(agent, tokens, home, f"{where}: IdentityAgent"))

    jump: tuple[JumpHost, ...] = ()
    command: str | None = None
    route = next((k for k in order if k in ("proxyjump", "proxycommand")), None)  # the first given wins
    if route == "proxyjump" and first["proxyjump"].strip().lower() != "none":
        jump = parse_jump(first["proxyjump"], where)
    elif route == "proxycommand" and first["proxycommand"].strip().lower() != "none":
        quoted = {key: shlex.quote(value) for key, value in tokens.items()}  # defence in depth: never shell text
        command = expand_tokens(first["proxycommand"].strip(), quoted, f"{where}: ProxyCommand")

    options = SshOptions(
        identity_files=tuple(expand_path(_one_path(v, where), tokens, home, f"{where}: IdentityFile")
                             for v in identity),
        identities_only=_yes(first["identitiesonly"], "IdentitiesOnly", where) if "identitiesonly" in first else False,
        identity_agent=agent,
        user_known_hosts=files("userknownhostsfile"),
        global_known_hosts=files("globalknownhostsfile"),
        host_key_alias=alias,
        proxy_jump=jump,
        proxy_command=command,
    )
    return SshTarget(hostname, the_port, the_user, options)


def known_hosts_name(host: str, port: int, alias: str | None = None) -> str:
    """The name a host's key is looked up under in known_hosts files (``[host]:port`` off port 22)."""
    if alias:
        return alias
    return host if port == 22 else f"[{host}]:{port}"
