"""Every §2 (nvidia-smi/NVML), §3 (kernel log) and §4 (apt history, dkms) sample of the field-text corpus, checked
against the facts the corpus states for it (tests/fixtures/corpus/field-text-dev.md)."""

from __future__ import annotations

import pytest

from remediation.core.parsers import apt_history, dkms, kernel_log, nvml_text
from tests.corpus import blocks as _load

BLOCKS: dict[str, list[str]] = _load()


def block(section: str, index: int = 0) -> str:
    return BLOCKS[section][index]


def sections(prefix: str) -> set[str]:
    return {s for s in BLOCKS if s.startswith(prefix)}


# corpus "kind=" names → the error_class contract of the nvml parser
_KIND = {
    "driver_unreachable": "driver_not_loaded",
    "nvml_driver_library_mismatch": "version_mismatch",
    "no_devices": "no_devices",
    "device_handle_unknown_error": "handle_unknown_error",
}

# ---------------------------------------------------------------------------------------------------------------
# §2 nvidia-smi / NVML

NVML_FACTS: dict[str, dict[str, object]] = {
    "2.2": {"kind": "driver_unreachable"},
    "2.4": {
        "kind": "driver_unreachable",
        "module_missing": True,
        "missing_modules": {"nvidia", "nvidia-uvm"},
        "running_kernel": "3.13.0-116-generic",
        "module_kernels": ("3.13.0-88-generic",),
        "dkms_missing": True,
    },
    "2.6": {"kind": "driver_unreachable"},
    "2.8": {"kind": "nvml_driver_library_mismatch", "nvml_library_version": "550.144"},
    "2.10": {"kind": "nvml_driver_library_mismatch"},
    "2.12": {"kind": "nvml_driver_library_mismatch", "service": "dalle-backend"},
    "2.14": {"kind": "no_devices", "pci": "0000:01:00.0"},
    "2.16": {"kind": "device_handle_unknown_error", "pci": "0000:09:00.0"},
    "2.18": {"kind": "device_handle_unknown_error", "pci": "0000:03:00.0"},
    "2.20": {"kind": "device_handle_unknown_error", "pci": "000:BA:80.0"},
}


def test_every_nvml_sample_has_stated_facts() -> None:
    assert sections("2.") == set(NVML_FACTS)


@pytest.mark.parametrize("section", sorted(NVML_FACTS))
def test_nvml_sample(section: str) -> None:
    facts = NVML_FACTS[section]
    parsed = nvml_text.parse(block(section))
    assert parsed.error_class == _KIND[str(facts["kind"])]
    assert parsed.evidence, "a classified message must carry its evidence lines"
    if "pci" in facts:
        assert facts["pci"] in parsed.pci_bus_ids
    if "nvml_library_version" in facts:
        assert parsed.nvml_library_version == facts["nvml_library_version"]
    else:
        assert parsed.nvml_library_version is None
    assert parsed.module_missing is bool(facts.get("module_missing", False))
    if "missing_modules" in facts:
        assert set(parsed.missing_modules) == facts["missing_modules"]
    assert parsed.running_kernel == facts.get("running_kernel")
    if "module_kernels" in facts:
        assert parsed.module_kernels == facts["module_kernels"]
        assert parsed.running_kernel not in parsed.module_kernels
    assert parsed.dkms_missing is bool(facts.get("dkms_missing", False))
    if "service" in facts:
        assert parsed.service == facts["service"]


def test_nvml_typographic_apostrophe_and_two_line_form() -> None:
    parsed = nvml_text.parse(block("2.2"))
    assert "\u2018" in block("2.2")  # the sample really has the typographic apostrophe
    assert len(parsed.evidence) == 2  # both lines of the split message


def test_nvml_wrapped_container_cli_line_is_evidence() -> None:
    parsed = nvml_text.parse(block("2.12"))
    assert any("nvidia-container-cli" in line for line in parsed.evidence)
    assert any("version mismatch" in line for line in parsed.evidence)


# ---------------------------------------------------------------------------------------------------------------
# §3 kernel log

Xid = tuple[int, str, int | None, str | None]  # code, pci, pid, name


def _xids(log: kernel_log.KernelLog) -> list[Xid]:
    return [(x.code, x.pci, x.pid, x.name) for x in log.xid_events]


def test_3_1_ctime_diff_prefix_unknown_pid() -> None:
    log = kernel_log.parse(block("3.1"))
    assert _xids(log) == [(13, "0000:cb:00", None, None)] * 3 + [(109, "0000:cb:00", 1797828, "pt_main_thread")]
    assert "Graphics Engine" in log.xid_events[0].meaning or "exception" in log.xid_events[0].meaning.lower()
    assert "context switch" in log.xid_events[3].meaning.lower()
    assert "Ch 00000008" in log.xid_events[3].detail
    assert log.xid_events[0].timestamp == "Fri Aug 30 11:43:09 2024"
    assert not any("nvidia-peermem" in x.text for x in log.xid_events)  # first line is not an Xid


def test_3_3_skedcheck_burst_and_nic_decoy() -> None:
    log = kernel_log.parse(block("3.3"))
    assert _xids(log) == [(13, "0000:07:00", None, None)] * 8
    assert all(x.code != 641 for x in log.xid_events)
    assert not any("r8169" in line for line in log.evidence)


def test_3_5_browser_pids() -> None:
    log = kernel_log.parse(block("3.5"))
    assert _xids(log) == [(31, "0000:08:00", 169800, "chrome"), (31, "0000:08:00", 174421, "chrome")]
    assert "page fault" in log.xid_events[0].meaning.lower()


def test_3_7_old_driver_formats() -> None:
    log = kernel_log.parse(block("3.7"))
    assert _xids(log) == [(32, "0000:01:00", None, None)] * 2 + [(31, "0000:01:00", None, None)]
    assert "push buffer" in log.xid_events[0].meaning.lower()


def test_3_9_syslog_and_secs_prefix_dbe() -> None:
    log = kernel_log.parse(block("3.9"))
    assert _xids(log) == [(48, "0000:07:00", None, None)]
    event = log.xid_events[0]
    assert event.host == "worker4"
    assert "worker4" in log.hosts
    assert "double" in event.meaning.lower() or "DBE" in event.meaning
    assert "physAddr 0x7fdd60000" in event.detail


def test_3_11_fallen_off_bus_block_without_xid() -> None:
    log = kernel_log.parse(block("3.11", 0))
    assert log.xid_events == ()  # no line says Xid
    assert [(f.pci, f.pci_id, f.via_xid) for f in log.fallen_off_bus] == [("0000:b3:00.0", "10de:26b5", False)]
    assert len(log.fallen_off_bus[0].evidence) == 3  # the continuation lines without timestamps
    assert [(p.kind, p.device_count) for p in log.probe_failures] == [("failed", 1)]
    assert log.driver_version == "570.158.01"
    assert log.open_kernel_module is True


def test_3_11_xid_79_line() -> None:
    log = kernel_log.parse(block("3.11", 1))
    assert _xids(log) == [(79, "0000:44:00", None, None)]
    assert [(f.pci, f.via_xid) for f in log.fallen_off_bus] == [("0000:44:00", True)]


def test_3_13_nvlink_and_contained_ecc() -> None:
    expected = [
        (149, "0019:01:00", -1, True),
        (149, "0000:00:00", 0, True),
        (145, "0018:01:00", 13, False),
    ]
    for i, (code, pci, link, fatal) in enumerate(expected):
        log = kernel_log.parse(block("3.13", i))
        assert len(log.xid_events) == 1
        x = log.xid_events[0]
        assert (x.code, x.pci, x.link, x.fatal) == (code, pci, link, fatal)
        assert "nvlink" in x.meaning.lower()
    log = kernel_log.parse(block("3.13", 3))
    assert _xids(log) == [(94, "0000:9b:00", 1234, "python3")]
    assert "contained" in log.xid_events[0].meaning.lower()


def test_3_15_redacted_pci() -> None:
    log = kernel_log.parse(block("3.15"))
    assert [(x.code, x.pci, x.link) for x in log.xid_events] == [(145, "unknown", 11), (137, "unknown", 11)]
    assert log.xid_events[0].fatal is False
    assert "PRIV Error" in log.xid_events[1].detail


def test_3_17_talos_prefix() -> None:
    log = kernel_log.parse(block("3.17"))
    assert log.hosts == ("192.168.11.119",)
    assert len(log.nvrm_lines) == 2
    first = log.nvrm_lines[0]
    assert (first.host, first.facility, first.level) == ("192.168.11.119", "kern", "warning")
    assert first.timestamp == "2026-04-22T21:27:51.291660856Z"
    assert first.message.startswith("NVRM: kflcnCoreDumpNondestructive_IMPL")
    assert log.xid_events == ()


def test_3_19_api_mismatch_with_client_name_and_modinfo() -> None:
    log = kernel_log.parse(block("3.19", 0))
    assert [(a.client_version, a.module_version, a.client_process, a.client_pid) for a in log.api_mismatches] == [
        ("595.84", "595.80", "kwin_wayland", 1005)
    ]
    assert len(log.api_mismatches[0].evidence) == 5
    assert not any("r8169" in line for line in log.evidence)
    info = kernel_log.parse(block("3.19", 1)).modinfo
    assert info is not None
    assert (info.version, info.kernel, info.dkms) == ("595.80", "7.0.12-zen1-1-zen", True)


@pytest.mark.parametrize(
    ("section", "client", "module", "count"),
    [("3.21", "390.25", "390.12", 1), ("3.23", "515.48.07", "510.73.05", 1), ("3.25", "570.153.02", "570.144", 3)],
)
def test_api_mismatch_bare(section: str, client: str, module: str, count: int) -> None:
    log = kernel_log.parse(block(section))
    assert [(a.client_version, a.module_version) for a in log.api_mismatches] == [(client, module)] * count
    assert all(a.client_process is None and a.client_pid is None for a in log.api_mismatches)


def test_3_25_firmware_and_rminit() -> None:
    log = kernel_log.parse(block("3.25"))
    assert [(f.path, f.error) for f in log.firmware_failures] == [("nvidia/570.144/gsp_ga10x.bin", -2)]
    assert [(r.pci, r.code, r.minor) for r in log.rm_init_failures] == [("0000:07:00.0", "0x61:0x56:1770", 0)]


def test_3_27_probe_not_called() -> None:
    log = kernel_log.parse(block("3.27"))
    not_called = [p for p in log.probe_failures if p.kind == "not_called"]
    assert [(p.device_count, p.conflicting_drivers) for p in not_called] == [
        (3, ("nouveau", "rivafb", "nvidiafb", "rivatv"))
    ]
    assert any(p.kind == "no_adapter" for p in log.probe_failures)


def test_2_14_kernel_lines_inside_nvml_sample() -> None:
    log = kernel_log.parse(block("2.14"))
    assert [(r.pci, r.code, r.minor) for r in log.rm_init_failures] == [("0000:01:00.0", "0x22:0x56:884", 0)]


def test_every_kernel_sample_is_tested() -> None:
    tested = {"3.1", "3.3", "3.5", "3.7", "3.9", "3.11", "3.13", "3.15", "3.17", "3.19", "3.21", "3.23", "3.25", "3.27"}
    assert sections("3.") == tested


# ---------------------------------------------------------------------------------------------------------------
# §4A apt history


def test_4a_1_unattended_upgrade_nvidia_userspace() -> None:
    history = apt_history.parse(block("4A.1"))
    (t,) = history.transactions
    assert (t.actor, t.start, t.end, t.dry_run) == (
        "unattended-upgrade",
        "2021-06-04 06:41:09",
        "2021-06-04 06:41:09",
        False,
    )
    (a,) = t.actions
    assert (a.action, a.package, a.arch, a.old_version, a.version) == (
        "Upgrade",
        "libnvidia-common-460",
        "amd64",
        "460.73.01-0ubuntu0.20.04.1",
        "460.80-0ubuntu0.20.04.2",
    )
    assert history.kernel_installs() == ()
    assert [x.package for _, x in history.nvidia_changes()] == ["libnvidia-common-460"]


def test_4a_2_earlier_bump() -> None:
    (t,) = apt_history.parse(block("4A.2")).transactions
    assert t.actor == "unattended-upgrade"
    assert [(a.package, a.old_version, a.version) for a in t.actions] == [
        ("libnvidia-common-460", "460.56-0ubuntu0.20.04.1", "460.73.01-0ubuntu0.20.04.1")
    ]


def test_4a_3_remove_single_version() -> None:
    (t,) = apt_history.parse(block("4A.3")).transactions
    assert t.actor == "unattended-upgrade"
    assert [(a.action, a.package, a.version, a.old_version) for a in t.actions] == [
        ("Remove", "libspeechd2", "0.8.3-1ubuntu3", None)
    ]


def test_4a_4_packagekit_kernel_with_epochs() -> None:
    history = apt_history.parse(block("4A.4"))
    (t,) = history.transactions
    assert t.actor == "packagekit"
    assert t.requested_by == "username (1000)"
    assert len(t.actions) == 8
    assert [a.version for a in t.actions if a.package == "libllvm15"] == ["1:15.0.6-3~ubuntu0.22.04.2"] * 2
    kernels = {a.package for _, a in history.kernel_installs()}
    assert {
        "linux-image-6.1.11-76060111-generic",
        "linux-modules-6.1.11-76060111-generic",
        "linux-headers-6.1.11-76060111-generic",
    } <= kernels
    assert all(tr.actor == "packagekit" for tr, _ in history.kernel_installs())
    assert "6.1.11-76060111-generic" in {a.kernel_release for _, a in history.kernel_installs()}


def test_4a_5_rendered_page_single_space_and_table_residue() -> None:
    history = apt_history.parse(block("4A.5"))
    assert [(t.actor, t.start) for t in history.transactions] == [
        ("unattended-upgrade", "2020-03-03 06:00:08"),
        ("aptdaemon", "2020-03-06 12:39:45"),
    ]
    first = history.transactions[0]
    assert first.end == "2020-03-03 06:00:09"
    assert [(a.package, a.old_version, a.version) for a in first.actions] == [
        ("libarchive13", "3.2.2-3.1ubuntu0.5", "3.2.2-3.1ubuntu0.6")
    ]


def test_every_apt_sample_is_tested() -> None:
    assert sections("4A.") == {"4A.1", "4A.2", "4A.3", "4A.4", "4A.5"}


# ---------------------------------------------------------------------------------------------------------------
# §4C dkms


def test_4c_1_status_formats_and_error() -> None:
    healthy = dkms.parse(block("4C.1", 0))
    assert [(e.module, e.version, e.kernel, e.arch, e.state) for e in healthy.entries] == [
        ("nvidia", "396.45", k, "x86_64", "installed")
        for k in ("4.17.11-200.fc28.x86_64", "4.17.12-200.fc28.x86_64", "4.17.14-202.fc28.x86_64")
    ]
    stale = dkms.parse(block("4C.1", 1))
    assert stale.entries == ()
    assert [(e.module, e.version) for e in stale.errors] == [("nvidia", "390.48")]
    assert "dkms.conf" in stale.errors[0].message
    fixed = dkms.parse(block("4C.1", 2))
    assert [(e.kernel, e.state, e.note) for e in fixed.entries] == [
        ("4.17.14-202.fc28.x86_64", "installed", "original_module exists")
    ]
    assert fixed.installed_kernels() == ("4.17.14-202.fc28.x86_64",)


def test_4c_2_new_slash_format() -> None:
    parsed = dkms.parse(block("4C.2"))
    assert [(e.module, e.version, e.kernel, e.state) for e in parsed.entries] == [
        ("nvidia", "535.86.05", "6.5.0-060500rc5-generic", "installed"),
        ("rtl8852bu", "1.19.3", "6.5.0-060500rc5-generic", "installed"),
    ]


def test_4c_3_void_skips_and_failure_despite_success_line() -> None:
    parsed = dkms.parse(block("4C.3"))
    assert [(s.kernel, s.module, s.version) for s in parsed.skipped_kernels] == [
        ("4.0.9_1", "nvidia", "367.35"),
        ("4.1.13_1", "nvidia", "367.35"),
        ("4.3.6_1", "nvidia", "367.35"),
    ]
    assert all("headers" in s.reason for s in parsed.skipped_kernels)
    assert [(f.module, f.version, f.kernel) for f in parsed.build_failures] == [("nvidia", "367.35", "4.7.2_1")]
    assert "headers" not in parsed.build_failures[0].reason  # the skip reason does not leak into the failure
    assert parsed.installs == ()


def test_4c_4_headers_not_supported_and_dpkg_status() -> None:
    parsed = dkms.parse(block("4C.4"))
    assert [(f.module, f.version, f.kernel) for f in parsed.build_failures] == [
        ("nvidia", "580.119.02", "6.17.9-76061709-generic")
    ]
    assert "not supported" in parsed.build_failures[0].reason
    assert [(d.package, d.exit_status) for d in parsed.dpkg_errors] == [("nvidia-dkms-580-open", 10)]


def test_4c_5_postinst_trigger_make_exit_2() -> None:
    parsed = dkms.parse(block("4C.5"))
    assert parsed.kernel_triggers == ("linux-image-6.12.10-76061203-generic",)
    assert [(f.module, f.version, f.kernel) for f in parsed.build_failures] == [
        ("nvidia", "565.77", "6.12.10-76061203-generic")
    ]
    assert "exit status 2" in parsed.build_failures[0].reason


def test_4c_6_successful_build_and_install() -> None:
    parsed = dkms.parse(block("4C.6"))
    assert parsed.build_failures == ()
    assert {(i.module, i.version, i.kernel) for i in parsed.installs} == {
        ("nvidia", "550.54.15", "6.1.0-20-cloud-amd64")
    }
    assert {i.ko for i in parsed.installs} == {"nvidia.ko", "nvidia-uvm.ko"}
    assert parsed.installed_kernels() == ("6.1.0-20-cloud-amd64",)


def test_every_dkms_sample_is_tested() -> None:
    assert sections("4C.") == {"4C.1", "4C.2", "4C.3", "4C.4", "4C.5", "4C.6"}
