"""Properties of the field-text parsers: they never raise, their output is well-formed, and a real line means the
same thing behind any of the prefixes field text carries."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remediation.core.parsers import (
    KINDS,
    UNKNOWN,
    apt_history,
    detect_kind,
    dkms,
    kernel_log,
    nvml_text,
    unattended_upgrades,
)

REAL_LINES = [
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "Failed to initialize NVML: Driver/library version mismatch",
    "NVML library version: 550.144",
    "Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error",
    "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.5.0-44-generic",
    "[ 7386.259769] NVRM: API mismatch: the client has the version 515.48.07, but",
    "               NVRM: this kernel module has the version 510.73.05.  Please",
    "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception",
    "NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)",
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
    "               NVRM: fallen off the bus and is not responding to commands.",
    "NVRM: GPU 0000:07:00.0: RmInitAdapter failed! (0x61:0x56:1770)",
    "Start-Date: 2021-06-04  06:41:09",
    "Commandline: /usr/bin/unattended-upgrade",
    "Upgrade: libnvidia-common-460:amd64 (460.73.01-0ubuntu0.20.04.1, 460.80-0ubuntu0.20.04.2)",
    "Install: linux-image-6.5.0-44-generic:amd64 (6.5.0-44.44), libllvm15:amd64 (1:15.0.6-3, automatic)",
    "End-Date: 2021-06-04  06:41:09",
    "nvidia, 396.45, 4.17.11-200.fc28.x86_64, x86_64: installed",
    "nvidia/535.86.05, 6.5.0-060500rc5-generic, x86_64: installed (original_module exists)",
    "Error! Bad return status for module build on kernel: 6.17.9-76061709-generic (x86_64)",
    "Consult /var/lib/dkms/nvidia/580.119.02/build/make.log for more information.",
    "   - Installing to /lib/modules/6.1.0-20-cloud-amd64/updates/dkms/",
    "Skipping kernel-4.0.9_1. kernel-headers package not installed...",
    "nvidia, 470.82.00, 5.13.0-28-generic, x86_64: installedWARNING! Diff between built and installed module!",
    "nvmlDeviceGetHandleByIndex(0) failed: Unknown Error",
    "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown",
    "2024-03-01 10:00:00,000 INFO Starting unattended upgrades script",
    "2024-03-01 10:00:00,001 INFO Allowed origins are: o=Ubuntu,a=jammy-security, o=UbuntuESM,a=jammy-infra-security",
    "2024-03-01 10:00:00,001 INFO Initial blacklist: linux- nvidia-",
    "2024-03-01 10:00:01,000 INFO Packages that will be upgraded: linux-image-generic nvidia-driver-535",
    "2024-03-01 10:00:09,000 INFO Package linux-image-generic is blacklisted.",
    "2024-03-01 10:00:09,000 INFO All upgrades installed",
]

PARSERS = (nvml_text.parse, kernel_log.parse, apt_history.parse, dkms.parse, unattended_upgrades.parse)

spliced = st.lists(st.one_of(st.sampled_from(REAL_LINES), st.text(max_size=80)), max_size=30).map("\n".join)
any_text = st.one_of(st.text(max_size=2000), spliced)


def _well_formed_nvml(p: nvml_text.NvmlText) -> None:
    assert p.error_class in nvml_text.ERROR_CLASSES
    assert all(isinstance(x, str) and x for x in p.pci_bus_ids)
    assert all(isinstance(x, str) for x in p.evidence)
    assert isinstance(p.module_missing, bool)


def _well_formed_kernel(k: kernel_log.KernelLog) -> None:
    for x in k.xid_events:
        assert isinstance(x.code, int) and x.code >= 0
        assert isinstance(x.pci, str) and x.pci
        assert x.pid is None or (isinstance(x.pid, int) and x.pid >= 0)
        assert isinstance(x.meaning, str) and x.meaning
        assert "NVRM" in x.text
    for a in k.api_mismatches:
        assert a.client_version[0].isdigit() and a.module_version[0].isdigit()
    for p in k.probe_failures:
        assert p.kind in ("failed", "not_called", "no_adapter", "probe_error")


def _well_formed_apt(h: apt_history.AptHistory) -> None:
    for t in h.transactions:
        assert t.actor in apt_history.ACTORS
        for a in t.actions:
            assert a.action in apt_history.ACTIONS
            assert a.package and " " not in a.package
    for t, a in h.kernel_installs():
        assert not t.dry_run and a.is_kernel


def _well_formed_dkms(d: dkms.Dkms) -> None:
    for e in d.entries:
        assert e.module and e.version and e.state
    for f in d.build_failures:
        assert f.reason
    for s in d.skipped_kernels:
        assert s.kernel


def _well_formed_unattended(log: unattended_upgrades.UnattendedLog) -> None:
    for run in log.runs:
        assert all(p and " " not in p for p in run.packages)
        assert set(run.kernel_packages) <= set(run.packages) and set(run.nvidia_packages) <= set(run.packages)
        assert run.result in (None, "installed", "failed", "nothing to do")
        assert all(k.package and k.reason for k in run.kept_back)
    assert set(log.kernel_packages) <= set(log.packages)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(any_text)
def test_parsers_never_raise_and_are_well_formed(text: str) -> None:
    _well_formed_nvml(nvml_text.parse(text))
    _well_formed_kernel(kernel_log.parse(text))
    _well_formed_apt(apt_history.parse(text))
    _well_formed_dkms(dkms.parse(text))
    _well_formed_unattended(unattended_upgrades.parse(text))
    kind = detect_kind(text)
    assert kind == UNKNOWN or kind in KINDS


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_parsers_accept_any_unicode(text: str) -> None:
    for parse in PARSERS:
        parse(text)


PREFIXES = [
    "",
    "kernel: ",
    "[ 1843.308145] ",
    "[12345678.000001] ",
    "[Fri Aug 30 11:43:09 2024] ",
    "Dec  2 10:43:35 worker4 kernel: ",
    "Dec 12 10:43:35 worker4 kernel: [240314.528856] ",
    "2024-07-15T08:14:47.123456+00:00 gpu-host kernel: ",
    "192.168.11.119: kern: warning: [2026-04-22T21:27:51.291660856Z]: ",
    "+> [Fri Aug 30 11:43:09 2024] ",
    "> ",
    "<4>[   12.014918] ",
    "kern  :warn  : [Fri Aug 30 11:43:09 2024] ",
]


@given(
    prefix=st.sampled_from(PREFIXES),
    code=st.integers(min_value=1, max_value=160),
    pid=st.one_of(st.none(), st.integers(min_value=1, max_value=4_000_000)),
    suffix=st.sampled_from(["", " ", " | |"]),
)
def test_xid_line_means_the_same_behind_any_prefix(prefix: str, code: int, pid: int | None, suffix: str) -> None:
    pid_field = "pid='<unknown>', name=<unknown>, " if pid is None else f"pid={pid}, name=python3, "
    line = f"{prefix}NVRM: Xid (PCI:0000:3b:00): {code}, {pid_field}some detail{suffix}"
    log = kernel_log.parse("some other line\n" + line + "\nr8169 0000:03:00.0 eth0: RTL8125B, XID 641, IRQ 51")
    assert [(x.code, x.pci, x.pid) for x in log.xid_events] == [(code, "0000:3b:00", pid)]
    assert log.xid_events[0].name == (None if pid is None else "python3")


def test_syslog_escaped_newlines_are_lines() -> None:
    text = (
        "Jul  1 22:55:07 gpu kernel: NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
        "#012NVRM: Xid (PCI:0000:02:00): 48, DBE"
    )
    log = kernel_log.parse(text)
    assert [(x.code, x.pci) for x in log.xid_events] == [(79, "0000:01:00"), (48, "0000:02:00")]


def test_non_nvrm_xid_never_matches() -> None:
    text = (
        "[ 21.6] r8169 0000:03:00.0 eth0: RTL8125B, 58:47:ca:7b:55:71, XID 641, IRQ 51\n"
        "something Xid (PCI:0000:01:00): 13, x"
    )
    assert kernel_log.parse(text).xid_events == ()


@pytest.mark.parametrize(
    ("commandline", "actor", "dry_run"),
    [
        ("/usr/bin/unattended-upgrade", "unattended-upgrade", False),
        ("/usr/bin/unattended-upgrade --dry-run", "unattended-upgrade", True),
        ("/usr/bin/python3 /usr/bin/unattended-upgrade -v", "unattended-upgrade", False),
        ("apt-get -y install nvidia-driver-535", "apt-get", False),
        ("apt upgrade", "apt", False),
        ("/usr/bin/apt-get --simulate dist-upgrade", "apt-get", True),
        ("packagekit role='update-packages'", "packagekit", False),
        ("aptdaemon role='role-commit-packages' sender=':1.585'", "aptdaemon", False),
        ("dpkg -i foo.deb", "dpkg", False),
        ("aptitude safe-upgrade", "unknown", False),
    ],
)
def test_actor_and_dry_run_from_commandline(commandline: str, actor: str, dry_run: bool) -> None:
    text = (
        f"Start-Date: 2024-07-13  06:25:01\nCommandline: {commandline}\n"
        "Install: linux-image-6.5.0-44-generic:amd64 (6.5.0-44.44)\nEnd-Date: 2024-07-13  06:25:40\n"
    )
    (t,) = apt_history.parse(text).transactions
    assert (t.actor, t.dry_run) == (actor, dry_run)
    assert len(apt_history.parse(text).kernel_installs()) == (0 if dry_run else 1)
    assert len(apt_history.parse(text).kernel_installs(include_dry_runs=True)) == 1


@pytest.mark.parametrize(
    ("package", "kernel", "nvidia"),
    [
        ("linux-image-6.5.0-44-generic", True, False),
        ("linux-image-unsigned-6.5.0-1025-azure", True, False),
        ("linux-modules-extra-6.5.0-44-generic", True, False),
        ("linux-headers-generic", True, False),
        ("linux-generic-hwe-22.04", True, False),
        ("linux-azure", True, False),
        ("linux-image-azure", True, False),
        ("linux-modules-nvidia-535-azure", False, True),
        ("linux-tools-6.5.0-44-generic", False, False),
        ("linux-libc-dev", False, False),
        ("linux-firmware", False, False),
        ("nvidia-driver-535", False, True),
        ("libnvidia-compute-535", False, True),
        ("nvidia-dkms-580-open", False, True),
        ("libarchive13", False, False),
    ],
)
def test_package_classification(package: str, kernel: bool, nvidia: bool) -> None:
    assert apt_history.is_kernel_package(package) is kernel
    assert apt_history.is_nvidia_package(package) is nvidia


def test_wrapped_package_list_and_parenthesised_commas() -> None:
    text = (
        "Start-Date: 2024-07-13  06:25:01\n"
        "Commandline: /usr/bin/unattended-upgrade\n"
        "Install: linux-modules-6.5.0-44-generic:amd64 (6.5.0-44.44, automatic), linux-image-6.5.0-44-generic:amd64\n"
        " (6.5.0-44.44, automatic)\n"
        "Upgrade: linux-image-generic:amd64 (6.5.0.41.41, 6.5.0.44.44)\n"
        "End-Date: 2024-07-13  06:25:40\n"
    )
    (t,) = apt_history.parse(text).transactions
    assert [(a.action, a.package, a.version, a.old_version, a.automatic) for a in t.actions] == [
        ("Install", "linux-modules-6.5.0-44-generic", "6.5.0-44.44", None, True),
        ("Install", "linux-image-6.5.0-44-generic", "6.5.0-44.44", None, True),
        ("Upgrade", "linux-image-generic", "6.5.0.44.44", "6.5.0.41.41", False),
    ]


def test_dkms_3x_wording() -> None:
    text = (
        "Module build for kernel 6.8.0-40-generic was skipped since the kernel headers for this kernel do not seem "
        "to be installed.\n"
        "Building module(s)....(bad exit status: 2)\n"
        "Error! Bad return status for module build on kernel: 6.8.0-41-generic (x86_64)\n"
        "Consult /var/lib/dkms/nvidia/535.183.01/build/make.log for more information.\n"
    )
    parsed = dkms.parse(text)
    assert [s.kernel for s in parsed.skipped_kernels] == ["6.8.0-40-generic"]
    assert [(f.module, f.version, f.kernel) for f in parsed.build_failures] == [
        ("nvidia", "535.183.01", "6.8.0-41-generic")
    ]
