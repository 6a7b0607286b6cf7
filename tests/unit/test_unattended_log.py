"""``/var/log/unattended-upgrades/unattended-upgrades.log``: the kind, its facts and findings (the same rules as apt
history). The fixtures are logs the lab's real unattended-upgrade 2.9.1 wrote (tests/lab/test_diagnose_field.py
checks the same on a live host); the other samples follow the grammar of older versions' source."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.core.parsers import detect_kind, scores
from remediation.core.parsers import unattended_upgrades as uu
from remediation.host.diagnose import diagnose
from tests.corpus import blocks as corpus_blocks

FIELD = Path(__file__).resolve().parents[1] / "fixtures" / "field"
KERNEL_RUN = (FIELD / "unattended-upgrades-kernel.log").read_text()
HARDENED = (FIELD / "unattended-upgrades-hardened.log").read_text()
KIND = "unattended-upgrades-log"

# unattended-upgrades 1.x (Ubuntu 18.04/20.04): the initial lists before "Starting", origins as a Python list,
# auto-removals quoted; with the package names NVIDIA and kernel updates carry.
OLD_FORMAT = """\
2021-06-04 06:40:51,335 INFO Initial blacklisted packages: 
2021-06-04 06:40:51,337 INFO Initial whitelisted packages: 
2021-06-04 06:40:51,337 INFO Starting unattended upgrades script
2021-06-04 06:40:51,338 INFO Allowed origins are: ORIGINS
2021-06-04 06:41:02,114 INFO Packages that will be upgraded: PACKAGES
2021-06-04 06:41:02,115 INFO Writing dpkg log to /var/log/unattended-upgrades/unattended-upgrades-dpkg.log
2021-06-04 06:42:30,870 INFO All upgrades installed
2021-06-04 06:42:41,016 INFO Packages that are auto removed: 'linux-headers-5.4.0-73 linux-headers-5.4.0-73-generic'
""".replace(  # noqa: W291 - the log writes "Initial blacklisted packages: " with a trailing space when empty
    "ORIGINS",
    "['o=Ubuntu,a=focal', 'o=Ubuntu,a=focal-security', 'o=UbuntuESMApps,a=focal-apps-security', "
    "'o=UbuntuESM,a=focal-infra-security']",
).replace("PACKAGES", "libnvidia-common-460 linux-generic linux-headers-generic linux-image-generic")


def _ids(text: str) -> list[str]:
    return [f.id for f in diagnose(text).findings]


def test_lab_kernel_run_is_the_kind_with_its_facts() -> None:
    assert detect_kind(KERNEL_RUN) == KIND
    result = diagnose(KERNEL_RUN)
    facts = result.facts
    assert result.kind == KIND
    assert facts["packages"] == ["linux-image-generic", "walinuxagent"]
    assert facts["kernel_packages"] == ["linux-image-generic"]
    assert facts["nvidia_packages"] == []
    assert facts["blacklisted"] == []  # "Initial blacklist: " (empty): known, and empty
    assert "origin=GpuLab,archive=jammy-security" in facts["allowed_origins"]
    assert "origin=Debian,codename=bookworm,label=Debian-Security" in facts["allowed_origins"]
    assert facts["runs"][0]["result"] == "installed" and facts["runs"][0]["dry_run"] is False


def test_lab_kernel_run_gives_the_s1_findings_of_apt_history() -> None:
    result = diagnose(KERNEL_RUN)
    assert [f.id for f in result.findings] == ["GPU-KRN-003", "GPU-KRN-006"]
    krn3, krn6 = result.findings
    assert "linux-image-generic" in krn3.summary and "2026-12-02 17:37:00" in krn3.summary
    assert any("Packages that will be upgraded: linux-image-generic" in line for line in krn3.evidence)
    assert "newest Initial blacklist in the log: empty" in krn3.evidence
    assert krn6.severity.value == "info" and "linux-image-generic" in krn6.summary
    assert "walinuxagent" not in krn6.summary  # neither a kernel nor an NVIDIA package


def test_hardened_log_blacklist_lines() -> None:
    result = diagnose(HARDENED)
    facts = result.facts
    assert result.kind == KIND
    assert facts["blacklisted"] == ["^linux-image", "^linux-headers", "^linux-modules", "^nvidia-", "^libnvidia-"]
    assert facts["blacklisted_packages"] == ["linux-image-generic"]  # "Package linux-image-generic is blacklisted."
    assert facts["kernel_packages"] == [] and facts["packages"] == ["walinuxagent"]
    assert [r["dry_run"] for r in facts["runs"]] == [False, True]
    assert facts["runs"][1]["result"] == "nothing to do"
    assert {"package": "linux-image-generic", "reason": "blacklisted"} in facts["runs"][1]["kept_back"]
    assert result.findings == ()  # protected: nothing installed, nothing that would be


def test_kernel_installed_then_hardened_is_history_not_a_gap() -> None:
    """The newest run's blacklist covers the kernel an earlier run installed: GPU-KRN-006 (what happened) stays,
    GPU-KRN-003 (it would happen again) does not."""
    ids = _ids(KERNEL_RUN + HARDENED)
    assert ids == ["GPU-KRN-006"]
    # ... and the other way round (the blacklist removed later) is a gap again
    assert _ids(HARDENED + KERNEL_RUN) == ["GPU-KRN-003", "GPU-KRN-006"]


def test_old_format_nvidia_and_kernel_packages() -> None:
    result = diagnose(OLD_FORMAT)
    facts = result.facts
    assert result.kind == KIND
    assert facts["allowed_origins"] == [
        "o=Ubuntu,a=focal",
        "o=Ubuntu,a=focal-security",
        "o=UbuntuESMApps,a=focal-apps-security",
        "o=UbuntuESM,a=focal-infra-security",
    ]
    assert facts["blacklisted"] == []
    assert facts["nvidia_packages"] == ["libnvidia-common-460"]
    assert facts["kernel_packages"] == ["linux-generic", "linux-headers-generic", "linux-image-generic"]
    assert facts["removed"] == ["linux-headers-5.4.0-73", "linux-headers-5.4.0-73-generic"]
    assert len(facts["runs"]) == 1 and facts["runs"][0]["start"] == "2021-06-04 06:40:51"
    assert [f.id for f in result.findings] == ["GPU-KRN-003", "GPU-KRN-004", "GPU-KRN-006"]
    krn4 = result.findings[1]
    assert "libnvidia-common-460" in krn4.summary and "2021-06-04 06:40:51" in krn4.summary


def test_dry_runs_never_count_as_installs() -> None:
    dry = (
        "2024-03-01 10:00:00,000 INFO Starting unattended upgrades script\n"
        "2024-03-01 10:00:00,001 INFO Allowed origins are: o=Ubuntu,a=jammy-security\n"
        "2024-03-01 10:00:00,001 INFO Initial blacklist: \n"
        "2024-03-01 10:00:01,000 INFO Option --dry-run given, *not* performing real actions\n"
        "2024-03-01 10:00:01,000 INFO Packages that will be upgraded: linux-image-generic nvidia-driver-535\n"
        "2024-03-01 10:00:02,000 INFO All upgrades installed\n"
    )
    result = diagnose(dry)
    assert result.kind == KIND and result.facts["dry_run"] is True
    assert result.facts["kernel_packages"] == ["linux-image-generic"]
    assert result.findings == ()  # as with apt history: a dry run installed nothing


def test_syslog_and_terminal_forms() -> None:
    syslog = (
        "Mar  1 06:25:01 gpu-7 unattended-upgrade[4242]: Starting unattended upgrades script\n"
        "Mar  1 06:25:01 gpu-7 unattended-upgrade[4242]: Allowed origins are: o=Ubuntu,a=jammy-security\n"
        "Mar  1 06:25:09 gpu-7 unattended-upgrade[4242]: Packages that will be upgraded: linux-image-azure\n"
        "Mar  1 06:26:40 gpu-7 unattended-upgrade[4242]: All upgrades installed\n"
    )
    terminal = (
        "Starting unattended upgrades script\n"
        "Allowed origins are: o=Ubuntu,a=jammy-security\n"
        "Initial blacklist: nvidia- libnvidia-\n"
        "Packages that will be upgraded: linux-image-azure\n"
        "Preparing to unpack .../linux-image-azure_6.5.0.1025.27_amd64.deb ...\n"
        "All upgrades installed\n"
    )
    for text in (syslog, terminal):
        result = diagnose(text)
        assert result.kind == KIND
        assert result.facts["kernel_packages"] == ["linux-image-azure"]
        assert [f.id for f in result.findings] == ["GPU-KRN-003", "GPU-KRN-006"]
    assert diagnose(terminal).facts["blacklisted"] == ["nvidia-", "libnvidia-"]


def test_kept_back_reasons_and_failures() -> None:
    text = (
        "2024-05-02 06:10:00,000 INFO Starting unattended upgrades script\n"
        "2024-05-02 06:10:00,001 INFO Allowed origins are: o=Debian,a=stable\n"
        "2024-05-02 06:10:00,001 INFO Initial blacklist: linux-\n"
        "2024-05-02 06:10:00,001 INFO Initial whitelist (not strict): \n"
        "2024-05-02 06:10:03,000 INFO Packages that will be upgraded: nvidia-kernel-dkms\n"
        "2024-05-02 06:10:50,000 ERROR Installing the upgrades failed!\n"
        "2024-05-02 06:10:50,000 ERROR error message: installArchives() failed\n"
        "2024-05-02 06:10:50,000 ERROR dpkg returned a error! See /var/log/unattended-upgrades/"
        "unattended-upgrades-dpkg.log for details\n"
        "2024-05-02 06:10:51,000 INFO Package linux-image-amd64 is blacklisted.\n"
        "2024-05-02 06:10:51,000 INFO Package nvidia-driver is marked to be held back.\n"
        "2024-05-02 06:10:51,000 INFO Package libfoo1's origin is not trusted.\n"
    )
    log = uu.parse(text)
    (run,) = log.runs
    assert run.result == "failed" and len(run.errors) == 3
    assert [(k.package, k.reason) for k in run.kept_back] == [
        ("linux-image-amd64", "blacklisted"),
        ("nvidia-driver", "held"),
        ("libfoo1", "origin not trusted"),
    ]
    result = diagnose(text)
    assert result.facts["held_packages"] == ["nvidia-driver"]
    assert result.facts["nvidia_packages"] == ["nvidia-kernel-dkms"]
    assert [f.id for f in result.findings] == ["GPU-KRN-004", "GPU-KRN-006"]  # attempted: it tried to install it


def test_apt_history_and_other_kinds_are_not_taken() -> None:
    stanza = (
        "Start-Date: 2024-07-13  06:25:01\n"
        "Commandline: /usr/bin/unattended-upgrade\n"
        "Upgrade: linux-image-generic:amd64 (6.5.0.41.41, 6.5.0.44.44)\n"
        "End-Date: 2024-07-13  06:25:40\n"
    )
    assert detect_kind(stanza) == "apt-history"
    assert scores(stanza)[KIND] == 0
    assert scores("nvidia/535.104.05, 6.2.0-33-generic, x86_64: installed")[KIND] == 0
    assert uu.parse(stanza).is_empty and uu.parse("").is_empty


def test_corpus_unattended_upgrades_samples_when_present() -> None:
    """Any unattended-upgrades.log sample in the corpus (none in the development half) is this kind."""
    samples = [
        b
        for section, found in corpus_blocks().items()
        for b in found
        if section.startswith("4") and ("Packages that will be upgraded" in b or "Allowed origins are" in b)
    ]
    for text in samples:
        assert detect_kind(text) == KIND, text[:200]
        assert diagnose(text).facts["packages"] or diagnose(text).facts["allowed_origins"]


@pytest.mark.parametrize("text", [KERNEL_RUN, HARDENED, OLD_FORMAT])
def test_parse_never_raises_on_cut_logs(text: str) -> None:
    for cut in range(0, len(text), 37):
        uu.parse(text[cut:])
        uu.parse(text[:cut])


def test_mailed_report_lists_on_the_next_line() -> None:
    report = (
        "Unattended upgrade result: All upgrades installed\n"
        "\n"
        "Packages that were upgraded:\n"
        " linux-generic linux-image-generic nvidia-driver-535\n"
        "\n"
        "Packages with upgradable origin but kept back:\n"
        " linux-headers-generic\n"
    )
    result = diagnose(report)
    assert result.kind == KIND
    assert result.facts["packages"] == ["linux-generic", "linux-image-generic", "nvidia-driver-535"]
    assert result.facts["nvidia_packages"] == ["nvidia-driver-535"]
    assert result.facts["runs"][0]["kept_back"] == [{"package": "linux-headers-generic", "reason": "kept back"}]
    assert [f.id for f in result.findings] == ["GPU-KRN-003", "GPU-KRN-004", "GPU-KRN-006"]
