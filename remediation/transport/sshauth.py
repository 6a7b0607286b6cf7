"""Public key authentication for the fan-out, in the order ssh(1) uses: the SSH agent first, then key files.

Order (OpenSSH's ``pubkey_prepare``): each identity file that the agent holds, through the agent; then the agent's
other keys (not with ``IdentitiesOnly=yes``); then the identity files the agent does not hold, read from disk.
Without an identity file in the inventory, ssh's default files (``~/.ssh/id_ed25519``, ...) that exist are used.

An encrypted key file is used through the agent when the agent holds it (``ssh-add``: the passphrase never
reaches this program). Otherwise its passphrase is read from the file named by ``$GPUFLEET_SSH_KEY_PASSPHRASE_FILE``
(first line; the file must be readable by its owner only, like a private key), the way Ansible takes a vault
password from ``$ANSIBLE_VAULT_PASSWORD_FILE``. The passphrase is never put in a message, a log or a result; a
passphrase that does not decrypt a key is reported by the key's path only.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import socket
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from remediation.core.errors import FanoutError
from remediation.transport.sshopts import DEFAULT_IDENTITY_FILES

PASSPHRASE_FILE_ENV = "GPUFLEET_SSH_KEY_PASSPHRASE_FILE"  # noqa: S105 - the name of a variable, not a secret
_OPENSSH_MAGIC = b"openssh-key-v1\x00"


class KeyUnusable(Exception):
    """An identity file that cannot be used (the reason names the file, never a secret)."""


def _ssh_string(data: bytes, offset: int) -> tuple[bytes, int]:
    if offset + 4 > len(data):
        raise ValueError("truncated")
    n = int.from_bytes(data[offset : offset + 4], "big")
    if offset + 4 + n > len(data):
        raise ValueError("truncated")
    return data[offset + 4 : offset + 4 + n], offset + 4 + n


def _openssh_body(text: str) -> bytes | None:
    lines = text.strip().splitlines()
    if not lines or lines[0].strip() != "-----BEGIN OPENSSH PRIVATE KEY-----":
        return None
    body = "".join(line.strip() for line in lines[1:] if not line.startswith("-----"))
    data = base64.b64decode(body)
    return data if data.startswith(_OPENSSH_MAGIC) else None


def key_file_info(text: str) -> tuple[bool, bytes | None]:
    """(encrypted?, public key blob if the file carries it) for a private key file's text.

    The OpenSSH format keeps the public key in clear next to the (maybe encrypted) private part; PEM files
    say ``Proc-Type: 4,ENCRYPTED`` or ``BEGIN ENCRYPTED PRIVATE KEY`` when encrypted and carry no public key."""
    try:
        data = _openssh_body(text)
    except (ValueError, binascii.Error):
        data = None
    if data is not None:
        try:
            cipher, off = _ssh_string(data, len(_OPENSSH_MAGIC))
            _kdf, off = _ssh_string(data, off)
            _kdf_options, off = _ssh_string(data, off)
            off += 4  # number of keys
            public, _ = _ssh_string(data, off)
        except ValueError:
            return False, None
        return cipher != b"none", public
    encrypted = "ENCRYPTED" in text.split("\n\n", 1)[0] or "BEGIN ENCRYPTED PRIVATE KEY" in text
    return encrypted, None


def _public_from_pub_file(path: Path) -> bytes | None:
    try:
        fields = Path(str(path) + ".pub").read_text().split()
        return base64.b64decode(fields[1]) if len(fields) >= 2 else None
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _identity(path: str, mtime_ns: int) -> tuple[bool, bytes | None]:
    text = Path(path).read_text(errors="replace")
    encrypted, public = key_file_info(text)
    return encrypted, public or _public_from_pub_file(Path(path))


def read_passphrase() -> tuple[bytes, str] | None:
    """The passphrase from ``$GPUFLEET_SSH_KEY_PASSPHRASE_FILE`` and that file's path, or None when unset."""
    name = os.environ.get(PASSPHRASE_FILE_ENV, "").strip()
    if not name:
        return None
    path = Path(name).expanduser()
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise FanoutError(
                f"${PASSPHRASE_FILE_ENV} {path} can be read by others (mode {stat.S_IMODE(st.st_mode):04o}):"
                f" chmod 600 {path}"
            )
        first = path.read_bytes().split(b"\n", 1)[0].rstrip(b"\r")
    except OSError as exc:
        raise FanoutError(f"${PASSPHRASE_FILE_ENV} {path} cannot be read: {exc.strerror}") from None
    return first, str(path)


@functools.lru_cache(maxsize=32)
def _decrypted(path: str, mtime_ns: int, passphrase_file: str | None, pf_mtime_ns: int) -> Any:
    import paramiko

    secret = read_passphrase() if passphrase_file else None
    try:
        return paramiko.PKey.from_path(path, secret[0] if secret else None)
    except Exception:
        if secret:
            raise KeyUnusable(
                f"the passphrase in ${PASSPHRASE_FILE_ENV} ({secret[1]}) does not decrypt {path}"
            ) from None
        raise KeyUnusable(f"{path} is not a private key paramiko can read (ed25519, ECDSA, RSA)") from None


def load_key(path: Path) -> Any:
    """A private key from disk, decrypted with the passphrase file when it is encrypted (cached per run)."""
    try:
        st = path.stat()
        encrypted, _ = _identity(str(path), st.st_mtime_ns)
    except OSError as exc:
        raise KeyUnusable(f"{path} cannot be read: {exc.strerror}") from None
    if not encrypted:
        return _decrypted(str(path), st.st_mtime_ns, None, 0)
    secret = read_passphrase()
    if secret is None:
        raise KeyUnusable(
            f"{path} is encrypted and the SSH agent does not hold it: ssh-add it to the agent"
            f" (SSH_AUTH_SOCK), or name a file holding its passphrase in ${PASSPHRASE_FILE_ENV}"
        )
    return _decrypted(str(path), st.st_mtime_ns, secret[1], Path(secret[1]).stat().st_mtime_ns)


def public_blob(path: Path) -> bytes | None:
    try:
        return _identity(str(path), path.stat().st_mtime_ns)[1]
    except OSError:
        return None


def open_agent(socket_path: str | None) -> Any:
    """An agent connection (``paramiko.agent.AgentSSH``) or None: ``socket_path`` None means ``$SSH_AUTH_SOCK``."""
    from paramiko.agent import AgentSSH

    if socket_path == "none":
        return None
    path = socket_path or os.environ.get("SSH_AUTH_SOCK")
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10)
        sock.connect(path)
        sock.settimeout(None)
    except OSError:
        sock.close()
        return None  # ssh(1) warns and goes on without the agent
    agent = AgentSSH()
    agent._connect(sock)  # the documented Agent() connects only to $SSH_AUTH_SOCK
    return agent


def _strategy_base() -> type:
    from paramiko.auth_strategy import AuthStrategy

    return AuthStrategy  # type: ignore[no-any-return]


class Identities:
    """Builds the paramiko ``AuthStrategy`` of one connection (agent keys, then files)."""

    def __init__(
        self, user: str, files: Sequence[Path], identities_only: bool, agent_socket: str | None, home: Path
    ) -> None:
        self.user = user
        explicit = tuple(files)
        self.files = explicit or tuple(
            p for p in (home / d[2:] for d in DEFAULT_IDENTITY_FILES) if p.exists()
        )
        self.explicit = bool(explicit)
        self.identities_only = identities_only
        self.agent_socket = agent_socket

    def strategy(self) -> Any:
        return _make_strategy(self)


def _make_strategy(ids: Identities) -> Any:
    import paramiko
    from paramiko.auth_strategy import InMemoryPrivateKey

    base = _strategy_base()

    class Strategy(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__(ssh_config=paramiko.SSHConfig())
            self.notes: list[str] = []
            self.agent: Any = None

        def get_sources(self) -> Iterator[Any]:
            self.agent = open_agent(ids.agent_socket)
            agent_keys = list(self.agent.get_keys()) if self.agent is not None else []
            by_blob = {k.asbytes(): k for k in agent_keys}
            used: set[bytes] = set()
            from_disk = []
            for path in ids.files:
                blob = public_blob(path)
                if blob is not None and blob in by_blob:
                    used.add(blob)
                    yield InMemoryPrivateKey(ids.user, by_blob[blob])
                else:
                    from_disk.append(path)
            if not ids.identities_only:
                for key in agent_keys:
                    if key.asbytes() not in used:
                        yield InMemoryPrivateKey(ids.user, key)
            for path in from_disk:
                if ids.explicit and not path.exists():
                    self.notes.append(f"identity file {path} does not exist")
                    continue
                try:
                    key = load_key(path)
                except KeyUnusable as exc:
                    self.notes.append(str(exc))
                    continue
                yield InMemoryPrivateKey(ids.user, key)

        def authenticate(self, transport: Any) -> Any:
            tried = 0
            try:
                for source in self.get_sources():
                    tried += 1
                    try:
                        remaining = source.authenticate(transport)
                    except paramiko.AuthenticationException:
                        continue
                    if not remaining:
                        return []
                    self.notes.append(f"the server wants more than a public key ({', '.join(remaining)})")
            finally:
                if self.agent is not None:
                    self.agent._close()  # AgentSSH has no public close(); paramiko.Agent.close() calls this
            where = "no agent" if self.agent is None else "the agent"
            detail = "; ".join(self.notes) or f"no identity file and nothing in {where}"
            raise paramiko.AuthenticationException(
                f"no key was accepted for {ids.user} ({tried} tried): {detail}"
            )

    return Strategy()
