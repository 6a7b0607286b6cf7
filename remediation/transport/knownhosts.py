"""known_hosts files read and matched the way OpenSSH does, for strict host key checks in the fan-out.

What ssh(1) honours and this module does too: comma-separated host patterns with ``*`` and ``?`` wildcards and
``!`` negation (a negated match drops the line), hashed names (``|1|salt|hash``, ``HashKnownHosts``),
``[host]:port`` names off port 22, several keys per name and several files (a key found in any file is trusted),
and ``@revoked`` lines (a revoked key is refused even if another line trusts it). ``@cert-authority`` lines are
skipped: the fan-out does not verify host certificates, so a host known only through a CA is refused, never
trusted. Keys are compared as their public key blobs, so a known ``ssh-rsa`` key matches an
``rsa-sha2-256/512`` handshake.

Each file is parsed once per (path, size, mtime) and indexed by plain host name, so a fleet of N hosts costs one
parse and N lookups, not N parses.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import functools
import hashlib
import hmac
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

# Host key algorithms a known key of each type may be presented with.
_ALGORITHMS = {
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"),
}


class Verdict(StrEnum):
    TRUSTED = "trusted"
    UNKNOWN = "unknown"  # no key of that type for that name
    CHANGED = "changed"  # keys of that type known, none of them is this one
    REVOKED = "revoked"


@dataclass(frozen=True)
class Entry:
    keytype: str
    blob: bytes
    where: str  # "path:line"
    revoked: bool = False


@dataclass(frozen=True)
class Check:
    verdict: Verdict
    name: str
    key: str  # "ED25519 SHA256:..." of the key the server showed
    detail: str

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.TRUSTED


@dataclass
class _Parsed:
    exact: dict[str, list[Entry]] = field(default_factory=dict)  # plain names, no wildcard or negation
    patterned: list[tuple[tuple[str, ...], Entry]] = field(default_factory=list)
    hashed: list[tuple[bytes, bytes, Entry]] = field(default_factory=list)


def fingerprint(blob: bytes) -> str:
    """``SHA256:...`` as ssh-keygen -l prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def key_type(blob: bytes) -> str:
    """The key type named inside a public key blob (its first SSH string)."""
    if len(blob) < 4:
        return ""
    n = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + n].decode("ascii", "replace")


def describe(blob: bytes) -> str:
    kind = key_type(blob)
    short = {"ssh-ed25519": "ED25519", "ssh-rsa": "RSA"}.get(kind, kind.split("-")[0].upper() if kind else "?")
    if kind.startswith("ecdsa-"):
        short = "ECDSA"
    return f"{short} {fingerprint(blob)}"


def _match_patterns(name: str, patterns: Sequence[str]) -> bool:
    """OpenSSH's match_hostname: any negated match -> no; else any positive match -> yes (case-insensitive)."""
    name = name.lower()
    positive = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pat = pattern[1:] if negated else pattern
        if fnmatch.fnmatchcase(name, pat.lower().replace("[", "[[]")):
            if negated:
                return False
            positive = True
    return positive


def parse(text: str, source: str) -> _Parsed:
    out = _Parsed()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = None
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
            if marker not in ("@revoked", "@cert-authority"):
                continue  # OpenSSH ignores lines with an unknown marker
        if len(fields) < 3:
            continue
        names, keytype, data = fields[0], fields[1], fields[2]
        try:
            blob = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            continue
        if key_type(blob) != keytype:
            continue  # the line's type and the key disagree: OpenSSH skips it too
        if marker == "@cert-authority":
            continue  # host certificates are not verified here: never trusted through a CA
        entry = Entry(keytype, blob, f"{source}:{number}", revoked=marker == "@revoked")
        if names.startswith("|1|"):
            parts = names.split("|")
            if len(parts) != 4:
                continue
            try:
                salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
            except (binascii.Error, ValueError):
                continue
            out.hashed.append((salt, digest, entry))
            continue
        patterns = tuple(p for p in names.split(",") if p)
        if any(c in p for p in patterns for c in "*?!"):
            out.patterned.append((patterns, entry))
        else:
            for p in patterns:
                out.exact.setdefault(p.lower(), []).append(entry)
    return out


@functools.lru_cache(maxsize=64)
def _parsed_file(path: str, size: int, mtime_ns: int) -> _Parsed:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse(handle.read(), path)


def load(path: Path) -> _Parsed | None:
    """The parsed file, or None when it does not exist (OpenSSH skips missing files). Other errors raise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return _parsed_file(str(path), st.st_size, st.st_mtime_ns)


def entries(files: Iterable[_Parsed], name: str) -> list[Entry]:
    """Every line of every file that applies to ``name`` (revoked ones included)."""
    name_l = name.lower()
    found: list[Entry] = []
    for parsed in files:
        found.extend(parsed.exact.get(name_l, ()))
        found.extend(e for patterns, e in parsed.patterned if _match_patterns(name, patterns))
        for salt, digest, e in parsed.hashed:
            if hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest):
                found.append(e)
    return found


def allowed_algorithms(found: Sequence[Entry]) -> set[str]:
    """Host key algorithms to offer so that the server shows a key we know (OpenSSH prefers known types)."""
    out: set[str] = set()
    for e in found:
        if not e.revoked:
            out.update(_ALGORITHMS.get(e.keytype, (e.keytype,)))
    return out


def check(found: Sequence[Entry], name: str, blob: bytes, searched: Sequence[Path]) -> Check:
    """Decide on the key a server showed, as ``StrictHostKeyChecking=yes`` would."""
    shown = describe(blob)
    where = ", ".join(str(p) for p in searched) or "no known_hosts file"
    for e in found:
        if e.revoked and e.blob == blob:
            return Check(Verdict.REVOKED, name, shown, f"host key {shown} for {name} is revoked ({e.where})")
    for e in found:
        if not e.revoked and e.blob == blob:
            return Check(Verdict.TRUSTED, name, shown, f"host key {shown} for {name} known at {e.where}")
    same_type = [e for e in found if not e.revoked and key_type(e.blob) == key_type(blob)]
    if same_type:
        known = "; ".join(f"{describe(e.blob)} at {e.where}" for e in same_type)
        return Check(Verdict.CHANGED, name, shown,
                     f"host key mismatch for {name}: the server shows {shown}, known_hosts has {known}")
    return Check(Verdict.UNKNOWN, name, shown,
                 f"host key {shown} for {name} not found in known_hosts ({where}); refusing to connect")
