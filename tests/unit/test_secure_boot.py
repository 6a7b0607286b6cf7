"""Secure Boot, module signatures and module sources, from the probe (sample host trees in the contract's formats)
to the facts, the checks (GPU-DRV-008, GPU-KRN-001), ``invoke diagnose`` and the restore's module source."""

from __future__ import annotations

import copy
import gzip
import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from remediation.core.checks import Policy, run_checks
from remediation.core.facts import facts_from_dict
from remediation.core.kernelflavour import flavour_metas, is_flavour_meta, meta_pattern, parse_release
from remediation.host.diagnose import diagnose
from remediation.hostside import gpuprobe
from remediation.restore.rules import Action, choose_module_source, decide
from tests.unit.test_probe_host import build_host_tree, run_probe

MAGIC = b"~Module signature appended~\n"
EFIVAR = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
AZ_OLD, AZ_NEW = "6.5.0-1024-azure", "6.5.0-1025-azure"
AZ_KERNELS = {AZ_OLD: "6.5.0-1024.25~22.04.1", AZ_NEW: "6.5.0-1025.26~22.04.1"}


def _ko(version: str, signed: bool) -> bytes:
    body = b"\x7fELF" + b"\x00" * 64 + f"srcversion=ABC\x00version={version}\x00license=NVIDIA\x00".encode()
    if signed:  # PKCS#7 blob, the 12-byte struct module_signature, the magic (scripts/sign-file.c)
        body += b"\x30\x82\x01\x00" + b"\x11" * 256 + bytes([0, 0, 2, 0, 0, 0, 0, 0]) + (260).to_bytes(4, "big") + MAGIC
    return body


def _efivar(root: Path, enabled: bool | None) -> None:
    (root / "sys/firmware").mkdir(parents=True, exist_ok=True)
    if enabled is None:
        return
    path = root / EFIVAR
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x06\x00\x00\x00" + (b"\x01" if enabled else b"\x00"))


def _azure_host(tmp_path: Path, *, secure_boot: bool | None, signed_new: bool, dkms_new: bool = False) -> Path:
    """An azure-flavour host booted on 1024 (DKMS module), with 1025 installed and its module from a signed package
    (``signed_new``) and/or DKMS (``dkms_new``)."""
    modules = {AZ_OLD: "535.183.01", **({AZ_NEW: "535.183.01"} if dkms_new else {})}
    root = build_host_tree(tmp_path / "h", kernels=AZ_KERNELS, module_for=modules)
    status = root / "var/lib/dpkg/status"
    text = status.read_text().replace("Package: linux-generic\n", "Package: linux-azure\n")
    text = text.replace("Package: linux-image-generic\n", "Package: linux-image-azure\n")
    text = text.replace("Package: linux-headers-generic\n", "Package: linux-headers-azure\n")
    if signed_new:
        text += (
            f"\nPackage: linux-modules-nvidia-535-{AZ_NEW}\nStatus: install ok installed\nArchitecture: amd64\n"
            "Version: 6.5.0-1025.26~22.04.1\n\nPackage: linux-modules-nvidia-535-azure\nStatus: install ok installed\n"
            "Architecture: amd64\nVersion: 6.5.0.1025.26~22.04.1\n"
        )
        ko = root / "lib/modules" / AZ_NEW / "kernel/nvidia-535/nvidia.ko"
        ko.parent.mkdir(parents=True, exist_ok=True)
        ko.write_bytes(_ko("535.183.01", signed=True))
    status.write_text(text)
    _efivar(root, secure_boot)
    return root


# --- probe --------------------------------------------------------------------------------------------------------


def test_secure_boot_from_the_efi_variable_and_mokutil_words(tmp_path: Path) -> None:
    assert gpuprobe.parse_secure_boot_efivar(b"\x06\x00\x00\x00\x01") is True
    assert gpuprobe.parse_secure_boot_efivar(b"\x06\x00\x00\x00\x00") is False
    assert gpuprobe.parse_secure_boot_efivar(b"\x06\x00") is None
    assert gpuprobe.parse_mokutil_sb_state("SecureBoot enabled\n") is True
    assert gpuprobe.parse_mokutil_sb_state("SecureBoot disabled\nPlatform is in Setup Mode\n") is False
    assert gpuprobe.parse_mokutil_sb_state("This system doesn't support Secure Boot\n") is False
    assert gpuprobe.parse_mokutil_sb_state("mokutil: command failed") is None
    for state in (True, False):
        root = tmp_path / str(state)
        _efivar(root, state)
        got = gpuprobe.collect_secure_boot(gpuprobe.Options(root=str(root)))
        assert got == {"enabled": state, "source": "efivars", "error": None}
    bios = tmp_path / "bios"
    (bios / "sys/firmware").mkdir(parents=True)  # no efi directory: a BIOS boot has no Secure Boot
    assert gpuprobe.collect_secure_boot(gpuprobe.Options(root=str(bios)))["source"] == "no-efi"
    efi = tmp_path / "efi-no-var"
    (efi / "sys/firmware/efi/efivars").mkdir(parents=True)
    assert gpuprobe.collect_secure_boot(gpuprobe.Options(root=str(efi)))["enabled"] is None


def test_module_signature_magic_plain_and_compressed(tmp_path: Path) -> None:
    for signed in (True, False):
        plain = tmp_path / f"{signed}.ko"
        plain.write_bytes(_ko("535.183.01", signed))
        xz = tmp_path / f"{signed}.ko.xz"
        xz.write_bytes(lzma.compress(_ko("535.183.01", signed)))
        gz = tmp_path / f"{signed}.ko.gz"
        gz.write_bytes(gzip.compress(_ko("535.183.01", signed)))
        assert [gpuprobe.module_signed(str(p)) for p in (plain, xz, gz)] == [signed] * 3
    zst = tmp_path / "nvidia.ko.zst"
    zst.write_bytes(b"(\xb5/\xfd")
    assert gpuprobe.module_signed(str(zst)) is None
    tiny = tmp_path / "tiny.ko"
    tiny.write_bytes(b"x")
    assert gpuprobe.module_signed(str(tiny)) is False


@pytest.mark.parametrize(
    ("present", "signed", "source", "sb", "loads"),
    [
        (False, None, None, True, False),
        (True, True, "package", True, True),
        (True, True, "package", None, True),
        (True, False, "dkms", True, False),
        (True, False, "dkms", False, True),
        (True, False, "dkms", None, None),
        (True, True, "dkms", True, None),  # DKMS's own MOK: loads only if enrolled
        (True, None, "package", True, None),
    ],
)
def test_would_load(
    present: bool, signed: bool | None, source: str | None, sb: bool | None, loads: bool | None
) -> None:
    assert gpuprobe.would_load(present, signed, source, sb) is loads


def test_probe_reports_source_signature_and_loadability_per_kernel(tmp_path: Path) -> None:
    root = _azure_host(tmp_path, secure_boot=True, signed_new=True)
    doc = run_probe("--root", str(root), "--kernel-release", AZ_OLD, "--skip-nvml")
    assert doc["secure_boot"] == {"enabled": True, "source": "efivars", "error": None}
    assert doc["system"]["kernel_flavour"] == "azure"
    kernels = {k["release"]: k for k in doc["packages"]["kernels"]}
    old, new = kernels[AZ_OLD], kernels[AZ_NEW]
    assert old["nvidia_module"]["source"] == "dkms" and old["nvidia_module"]["signed"] is False
    assert old["nvidia_module"]["would_load"] is False  # unsigned under Secure Boot
    assert new["nvidia_module"] == {
        "present": True, "version": "535.183.01", "path": f"/lib/modules/{AZ_NEW}/kernel/nvidia-535/nvidia.ko",
        "error": None, "source": "package", "signed": True, "would_load": True,
    }
    assert new["signed_module_packages"] == [f"linux-modules-nvidia-535-{AZ_NEW}"]
    assert "linux-modules-nvidia-535-azure" in doc["packages"]["kernel_meta"]


def test_a_dkms_build_shadows_the_signed_module_as_depmod_does(tmp_path: Path) -> None:
    root = _azure_host(tmp_path, secure_boot=True, signed_new=True, dkms_new=True)
    doc = run_probe("--root", str(root), "--kernel-release", AZ_OLD, "--skip-nvml")
    new = next(k for k in doc["packages"]["kernels"] if k["release"] == AZ_NEW)
    assert new["nvidia_module"]["path"].endswith("/updates/dkms/nvidia.ko")
    assert new["nvidia_module"]["would_load"] is False


def test_kernel_log_pattern_keeps_the_lockdown_lines() -> None:
    lines = [
        "[    3.101] Lockdown: systemd-modules-load: unsigned module loading is restricted; see man kernel_lockdown.7",
        "[    3.2] e1000: eth0 NIC Link is Up",
        "systemd-modules-load[412]: Failed to insert module 'nvidia': Key was rejected by service",
    ]
    kept, _ = gpuprobe.filter_kernel_log_lines(lines)
    assert kept == [lines[0], lines[2]]


# --- flavours -----------------------------------------------------------------------------------------------------


def test_flavour_meta_packages() -> None:
    assert parse_release(AZ_NEW).flavour == "azure" and parse_release(AZ_NEW).abi == 1025  # type: ignore[union-attr]
    installed = ["linux-azure", "linux-image-azure", "linux-headers-azure", "linux-modules-nvidia-535-azure",
                 "linux-image-generic", "linux-generic-hwe-22.04", f"linux-image-{AZ_NEW}", "linux-azure-lts-22.04"]
    assert flavour_metas(installed, "azure") == (
        "linux-azure", "linux-azure-lts-22.04", "linux-headers-azure", "linux-image-azure",
        "linux-modules-nvidia-535-azure",
    )
    assert flavour_metas(installed, "generic") == ("linux-generic-hwe-22.04", "linux-image-generic")
    assert not is_flavour_meta("linux-image-azure", None)
    assert meta_pattern("azure").startswith("^")


# --- facts, checks, diagnose --------------------------------------------------------------------------------------


def _facts_doc(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    root = _azure_host(tmp_path, **kw)
    doc = run_probe("--root", str(root), "--kernel-release", AZ_OLD, "--skip-nvml")
    doc["nvml"] = {"ok": True, "error_class": "none", "driver_version": "535.183.01", "device_count": 0, "gpus": []}
    return doc


def test_rejected_module_is_gpu_drv_008_not_drv_001(tmp_path: Path) -> None:
    doc = _facts_doc(tmp_path, secure_boot=True, signed_new=False)
    doc["nvml"] = {"ok": False, "error_class": "driver_not_loaded", "error": "Driver Not Loaded", "error_code": 9}
    doc["kernel_log"] = {"source": "dmesg", "lines": [
        "[    3.101] Lockdown: systemd-modules-load: unsigned module loading is restricted; see man kernel_lockdown.7"]}
    facts = facts_from_dict(doc, host="gpu-9")
    assert facts.secure_boot.state == "enabled"
    assert facts.booted_kernel is not None and facts.booted_kernel.nvidia_module.rejected_by_secure_boot
    found = {f.id: f for f in run_checks(facts, Policy())}
    assert "GPU-DRV-008" in found and "GPU-DRV-001" not in found and "GPU-DRV-004" not in found
    f = found["GPU-DRV-008"]
    assert f.severity.value == "critical"
    assert "unsigned, built by DKMS" in f.summary
    assert any("Secure Boot enabled (efivars)" in e for e in f.evidence)
    assert any(e.startswith("kernel log: ") and "Lockdown: systemd-modules-load" in e for e in f.evidence)


def test_unsigned_module_without_secure_boot_is_healthy(tmp_path: Path) -> None:
    facts = facts_from_dict(_facts_doc(tmp_path, secure_boot=False, signed_new=False), host="gpu-9")
    ids = {f.id for f in run_checks(facts, Policy())}
    assert "GPU-DRV-008" not in ids


def test_predictive_check_names_a_newer_kernel_whose_module_secure_boot_will_refuse(tmp_path: Path) -> None:
    doc = _facts_doc(tmp_path, secure_boot=True, signed_new=False, dkms_new=True)
    found = {f.id: f for f in run_checks(facts_from_dict(doc, host="h"), Policy())}
    assert "Secure Boot will refuse" in found["GPU-KRN-001"].summary
    signed = _facts_doc(tmp_path / "s", secure_boot=True, signed_new=True)
    assert "GPU-KRN-001" not in {f.id for f in run_checks(facts_from_dict(signed, host="h"), Policy())}


def test_kernel_hold_check_follows_the_booted_flavour(tmp_path: Path) -> None:
    doc = _facts_doc(tmp_path, secure_boot=False, signed_new=True)
    found = {f.id: f for f in run_checks(facts_from_dict(doc, host="h"), Policy())}
    not_held = found["GPU-KRN-002"].evidence[0]
    for name in ("linux-azure", "linux-image-azure", "linux-headers-azure", "linux-modules-nvidia-535-azure"):
        assert name in not_held
    held = copy.deepcopy(doc)
    held["packages"]["held"] = [f"linux-image-{AZ_OLD}", f"linux-headers-{AZ_OLD}", "linux-azure",
                                "linux-image-azure", "linux-headers-azure", "linux-modules-nvidia-535-azure"]
    assert "GPU-KRN-002" not in {f.id for f in run_checks(facts_from_dict(held, host="h"), Policy())}


MODPROBE_ON_TRUSTED_LAUNCH = """\
azureuser@gpu-vm-7:~$ nvidia-smi
NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.

azureuser@gpu-vm-7:~$ sudo modprobe nvidia
modprobe: ERROR: could not insert 'nvidia': Key was rejected by service
azureuser@gpu-vm-7:~$ sudo dmesg | tail -2
[  412.884211] Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7
"""  # noqa: E501 - real nvidia-smi wording

BOOT_JOURNAL = """\
Dec 03 06:12:40 gpu-vm-7 kernel: Lockdown: systemd-modules-load: unsigned module loading is restricted; see man kernel_lockdown.7
Dec 03 06:12:40 gpu-vm-7 systemd-modules-load[412]: Failed to insert module 'nvidia': Key was rejected by service
Dec 03 06:12:40 gpu-vm-7 systemd-modules-load[412]: Failed to insert module 'nvidia_uvm': Key was rejected by service
"""  # noqa: E501

OLD_KERNEL = (
    "Mar 14 09:01:55 gpu-vm-7 kernel: [    5.120004] modprobe: ERROR: could not insert 'nvidia': "
    "Required key not available\n"
)


def test_diagnose_recognises_a_secure_boot_rejection_in_nvidia_smi_text() -> None:
    r = diagnose(MODPROBE_ON_TRUSTED_LAUNCH)
    assert r.kind == "nvml"
    ids = [f.id for f in r.findings]
    assert "GPU-DRV-008" in ids and "GPU-DRV-001" not in ids and "GPU-DRV-004" not in ids
    f = next(f for f in r.findings if f.id == "GPU-DRV-008")
    assert "Key was rejected by service" in f.summary and "linux-modules-nvidia" in f.summary
    assert "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service" in f.evidence
    rejections = r.facts["kernel_log"]["module_rejections"]
    assert {"module": "nvidia", "reason": "key-rejected", "program": "modprobe"} in rejections


def test_diagnose_recognises_the_boot_journal_and_older_kernels() -> None:
    r = diagnose(BOOT_JOURNAL)
    assert r.kind == "kernel-log"
    assert [f.id for f in r.findings] == ["GPU-DRV-008"]
    assert r.facts["module_rejections"][0] == {"module": None, "reason": "lockdown", "program": "systemd-modules-load"}
    old = diagnose(OLD_KERNEL)
    assert old.kind == "kernel-log" and [f.id for f in old.findings] == ["GPU-DRV-008"]
    assert old.facts["module_rejections"][0]["reason"] == "key-unavailable"


def test_a_rejection_of_another_module_is_not_an_nvidia_finding() -> None:
    text = (
        "[ 9.1] modprobe: ERROR: could not insert 'vboxdrv': Key was rejected by service\n"
        "[ 9.2] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01\n"
    )
    assert "GPU-DRV-008" not in {f.id for f in diagnose(text, kind="kernel-log").findings}


# --- restore: the module source -----------------------------------------------------------------------------------

VARS = {"nvidia_driver_expected_version": "535.183.01", "nvidia_driver_branch": "535"}


def test_choose_module_source() -> None:
    assert choose_module_source("auto", True)[0] == "signed"
    assert choose_module_source("auto", False) == ("dkms", "Secure Boot is off: DKMS builds the module")
    assert choose_module_source("auto", None)[0] == "dkms"
    assert choose_module_source("signed", False)[0] == "signed"
    assert choose_module_source("dkms", True)[1] == "module_source: dkms (configured)"
    with pytest.raises(ValueError, match="module_source 'sideways'"):
        choose_module_source("sideways", None)


def _s1_on_azure(tmp_path: Path, secure_boot: bool) -> Any:
    """Booted into 1025 which has no module at all (S1 on an azure host)."""
    root = _azure_host(tmp_path, secure_boot=secure_boot, signed_new=False)
    doc = run_probe("--root", str(root), "--kernel-release", AZ_NEW, "--skip-nvml")
    doc["nvml"] = {"ok": False, "error_class": "driver_not_loaded", "error": "Driver Not Loaded", "error_code": 9}
    doc["device_users"] = {"users": [], "unreadable": 0}
    return facts_from_dict(doc, host="h")


def test_restore_picks_the_signed_package_under_secure_boot_and_says_why(tmp_path: Path) -> None:
    facts = _s1_on_azure(tmp_path, secure_boot=True)
    d = decide("h", facts, run_checks(facts, Policy()), VARS)
    assert d.action is Action.REBUILD and d.module_source == "signed"
    assert d.install_packages == (f"linux-modules-nvidia-535-{AZ_NEW}",)
    assert "Secure Boot is on" in d.reason and "signed precompiled" in d.reason
    assert f"linux-modules-nvidia-535-{AZ_NEW}" in d.hold_packages
    assert {"linux-azure", "linux-image-azure", "linux-headers-azure"} <= set(d.hold_packages)
    assert not any(p.endswith("-generic") for p in d.hold_packages)
    off = _s1_on_azure(tmp_path / "off", secure_boot=False)
    d_off = decide("h", off, run_checks(off, Policy()), VARS)
    assert d_off.module_source == "dkms" and d_off.install_packages == ()  # headers of 1025 installed
    assert d_off.steps[1].startswith("dkms autoinstall -k ") and "nvidia-driver-535" in d_off.steps[1]
    forced = decide("h", off, run_checks(off, Policy()), VARS, module_source="signed")
    assert forced.module_source == "signed" and "configured" in forced.module_source_reason
    assert json.loads(json.dumps(d.to_dict()))["module_source"] == "signed"


def test_restore_of_a_rejected_dkms_module_removes_it_or_refuses_with_dkms(tmp_path: Path) -> None:
    root = _azure_host(tmp_path, secure_boot=True, signed_new=False, dkms_new=True)
    doc = run_probe("--root", str(root), "--kernel-release", AZ_NEW, "--skip-nvml")
    doc["nvml"] = {"ok": False, "error_class": "driver_not_loaded", "error": "Driver Not Loaded", "error_code": 9}
    doc["device_users"] = {"users": [], "unreadable": 0}
    facts = facts_from_dict(doc, host="h")
    findings = run_checks(facts, Policy())
    d = decide("h", facts, findings, VARS)
    assert d.module_source == "signed" and d.dkms_remove == "535.183.01"
    assert any("remove the DKMS build nvidia/535.183.01" in step for step in d.steps)
    manual = decide("h", facts, findings, VARS, module_source="dkms")
    assert manual.action is Action.MANUAL and manual.blocked and "Secure Boot rejection" in manual.blocked
