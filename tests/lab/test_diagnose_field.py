"""``invoke diagnose`` on the field text lab hosts really write (a 2-host lab of its own, 127.0.67.N).

gpu-1 gets the S1 fault (the real ``unattended-upgrade`` installs the newer kernel through the meta-package);
gpu-2 gets the hardening role's Package-Blacklist patterns and then runs ``unattended-upgrade`` itself. Their
``/var/log/unattended-upgrades/unattended-upgrades.log`` and ``/var/log/apt/history.log`` are read over SSH and
diagnosed: the same S1 findings from either log, and none on the hardened host, whose log shows the blacklist.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from lab.faults import inject
from remediation.host.diagnose import diagnose
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

UU_LOG = "/var/log/unattended-upgrades/unattended-upgrades.log"
HISTORY = "/var/log/apt/history.log"
ROLE_DEFAULTS = ROOT / "roles" / "unattended_upgrades_blacklist" / "defaults" / "main.yml"


def remote(lab: Any, host: str, command: str, timeout: float = 120) -> str:
    proc = ssh(lab, host, command, timeout=timeout)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def _role_patterns() -> list[str]:
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    return [
        *defaults["unattended_upgrades_blacklist_kernel_patterns"],
        "^linux-generic$",  # the flavour entries the role derives from the lab's booted generic kernel
        "^linux-generic-",
        *defaults["unattended_upgrades_blacklist_kernel_meta_patterns"],
        *defaults["unattended_upgrades_blacklist_nvidia_patterns"],
    ]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, str]]]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("diagnose-field"), "127.0.67", 2)
    try:
        inject(lab, "gpu-1", "kernel-upgrade")
        entries = "".join(f'    "{p}";\n' for p in _role_patterns())
        conf = lab.host_path("gpu-2", "/etc/apt/apt.conf.d/51gpufleet-package-blacklist")
        conf.write_text(f"Unattended-Upgrade::Package-Blacklist {{\n{entries}}};\n")
        remote(lab, "gpu-2", "apt-get update -q >/dev/null && unattended-upgrade -v >/dev/null", timeout=600)
        texts = {
            "s1-uu": remote(lab, "gpu-1", f"cat {UU_LOG}"),
            "s1-history": remote(lab, "gpu-1", f"cat {HISTORY}"),
            "hardened-uu": remote(lab, "gpu-2", f"cat {UU_LOG}"),
        }
        yield lab, texts
    finally:
        lab.down(purge=True)


def test_s1_hosts_own_unattended_upgrades_log(logs: tuple[Any, dict[str, str]]) -> None:
    _, texts = logs
    result = diagnose(texts["s1-uu"], source=f"gpu-1:{UU_LOG}")
    assert result.kind == "unattended-upgrades-log"
    facts = result.facts
    assert "linux-image-generic" in facts["packages"]
    assert facts["kernel_packages"] == ["linux-image-generic"]  # without -d the log names the meta-package
    assert facts["blacklisted"] == []
    # Ubuntu's stock "${distro_id}:${distro_codename}-security", expanded by the real unattended-upgrade
    assert "o=Ubuntu,a=jammy-security" in facts["allowed_origins"]
    assert [f.id for f in result.findings] == ["GPU-KRN-003", "GPU-KRN-006"]
    assert all("linux-image-generic" in f.summary for f in result.findings)


def test_the_same_s1_findings_from_history_log(logs: tuple[Any, dict[str, str]]) -> None:
    _, texts = logs
    history = diagnose(texts["s1-history"])
    assert history.kind == "apt-history"
    assert [f.id for f in history.findings] == ["GPU-KRN-003", "GPU-KRN-006"]
    assert "linux-image-6.5.0-45-generic" in history.findings[1].summary  # history.log names the kernel itself


def test_hardened_hosts_log_shows_the_blacklist_and_no_finding(logs: tuple[Any, dict[str, str]]) -> None:
    _, texts = logs
    result = diagnose(texts["hardened-uu"])
    assert result.kind == "unattended-upgrades-log"
    facts = result.facts
    assert facts["blacklisted"] == _role_patterns()
    assert "linux-image-generic" in facts["blacklisted_packages"]  # "Package linux-image-generic is blacklisted."
    assert facts["kernel_packages"] == [] and facts["nvidia_packages"] == []
    assert result.findings == ()


def test_cli_reads_the_log_piped_over_ssh(logs: tuple[Any, dict[str, str]]) -> None:
    lab, _ = logs
    command = f"ssh -F {lab.paths.ssh_config} gpu-1 cat {UU_LOG} | {ROOT}/.venv/bin/invoke diagnose - --format json"
    proc = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "unattended-upgrades-log"
    assert {f["id"] for f in doc["findings"]} == {"GPU-KRN-003", "GPU-KRN-006"}
