"""known_hosts matching as ssh(1) does it, and the key files the agent or a passphrase unlocks (pure)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import subprocess
from pathlib import Path

import pytest

from remediation.transport import knownhosts
from remediation.transport.knownhosts import Verdict
from remediation.transport.sshauth import key_file_info


def _blob(kind: str, payload: bytes) -> bytes:
    k = kind.encode()
    return len(k).to_bytes(4, "big") + k + len(payload).to_bytes(4, "big") + payload


ED_A = _blob("ssh-ed25519", b"A" * 32)
ED_B = _blob("ssh-ed25519", b"B" * 32)
RSA = _blob("ssh-rsa", b"R" * 64)


def line(names: str, blob: bytes, marker: str = "") -> str:
    text = f"{names} {knownhosts.key_type(blob)} {base64.b64encode(blob).decode()} comment"
    return f"{marker} {text}" if marker else text


def hashed(name: str) -> str:
    salt = b"0123456789abcdef0123"
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def verdict(text: str, name: str, shown: bytes) -> Verdict:
    found = knownhosts.entries([knownhosts.parse(text, "kh")], name)
    return knownhosts.check(found, name, shown, [Path("kh")]).verdict


def test_plain_names_addresses_and_ports() -> None:
    text = line("gpu-1,10.0.0.1", ED_A) + "\n" + line("[10.0.0.2]:2222", ED_B)
    assert verdict(text, "10.0.0.1", ED_A) is Verdict.TRUSTED
    assert verdict(text, "GPU-1", ED_A) is Verdict.TRUSTED  # names compare case-insensitively
    assert verdict(text, "[10.0.0.2]:2222", ED_B) is Verdict.TRUSTED
    assert verdict(text, "10.0.0.2", ED_B) is Verdict.UNKNOWN  # the port is part of the name off port 22


def test_changed_key_is_refused_and_says_what_was_known() -> None:
    text = line("10.0.0.1", ED_A)
    found = knownhosts.entries([knownhosts.parse(text, "/etc/ssh/ssh_known_hosts")], "10.0.0.1")
    result = knownhosts.check(found, "10.0.0.1", ED_B, [])
    assert result.verdict is Verdict.CHANGED and not result.ok
    assert "host key mismatch" in result.detail and "/etc/ssh/ssh_known_hosts:1" in result.detail


def test_other_key_type_only_is_unknown_and_algorithms_follow_known_types() -> None:
    text = line("10.0.0.1", RSA)
    assert verdict(text, "10.0.0.1", ED_A) is Verdict.UNKNOWN
    found = knownhosts.entries([knownhosts.parse(text, "kh")], "10.0.0.1")
    assert knownhosts.allowed_algorithms(found) == {"rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"}


def test_wildcards_negation_and_hashed_names() -> None:
    text = "\n".join([line("*.fleet.example,!bad.fleet.example", ED_A), line(hashed("[10.0.0.9]:2200"), ED_B)])
    assert verdict(text, "gpu-7.fleet.example", ED_A) is Verdict.TRUSTED
    assert verdict(text, "bad.fleet.example", ED_A) is Verdict.UNKNOWN
    assert verdict(text, "gpu-7.fleet.exampleX", ED_A) is Verdict.UNKNOWN
    assert verdict(text, "[10.0.0.9]:2200", ED_B) is Verdict.TRUSTED
    assert verdict(text, "10.0.0.9", ED_B) is Verdict.UNKNOWN


def test_several_keys_and_files_any_match_is_trusted() -> None:
    files = [knownhosts.parse(line("h", ED_A), "user"), knownhosts.parse(line("h", ED_B), "global")]
    found = knownhosts.entries(files, "h")
    assert knownhosts.check(found, "h", ED_B, []).ok and knownhosts.check(found, "h", ED_A, []).ok


def test_revoked_wins_and_cert_authority_never_trusts() -> None:
    text = "\n".join([line("h", ED_A), line("*", ED_A, "@revoked"), line("*", ED_B, "@cert-authority")])
    assert verdict(text, "h", ED_A) is Verdict.REVOKED
    assert verdict(text, "h", ED_B) is Verdict.CHANGED  # not trusted through the CA line
    assert verdict(text, "other", ED_B) is Verdict.UNKNOWN


def test_broken_lines_are_skipped() -> None:
    text = "\n".join(["# comment", "", "h ssh-ed25519", "h ssh-ed25519 !!!notbase64", line("h", ED_A).replace(
        "ssh-ed25519 ", "ssh-rsa ", 1), "@weird h ssh-ed25519 AAAA"])
    assert verdict(text, "h", ED_A) is Verdict.UNKNOWN


def test_fingerprint_is_ssh_keygen_s(tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    pub = (tmp_path / "k.pub").read_text().split()
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / "k.pub")], capture_output=True, text=True,
                         check=True).stdout.split()
    assert knownhosts.fingerprint(base64.b64decode(pub[1])) == out[1]


@pytest.mark.parametrize("passphrase", ["", "correct horse"])
def test_key_files_say_whether_encrypted_and_carry_the_public_key(tmp_path: Path, passphrase: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(tmp_path / "k")], check=True)
    encrypted, public = key_file_info((tmp_path / "k").read_text())
    assert encrypted is bool(passphrase)
    assert public == base64.b64decode((tmp_path / "k.pub").read_text().split()[1])
