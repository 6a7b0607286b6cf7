"""End to end: ``invoke driver-restore --method azure-extension`` repairs an S1 host through ARM calls.

The local ARM service's VM-extension handler stands in for the Azure VM agent: when NvidiaGpuDriverLinux is re-added
on VM gpu-vm-2 it installs the latest driver of the host's branch on lab host gpu-2 (headers of the running kernel,
the driver upgraded so DKMS builds the module) and reboots it. The restore flow around it is the apt method's: the
audit decides, the guards hold (no reboot without --allow-reboot), the gate judges (NVML answers with the driver the
extension reported, whatever the inventory pins), the journal on the host records the change.

gpu-3 (VM gpu-vm-3) is an S1 host whose gate fails after the extension (its GPU falls off the bus): the undo brings
the previous driver packages back with apt. gpu-4 (VM gpu-vm-4) is a Trusted Launch host whose DKMS module Secure
Boot refuses: the method is refused there at plan time, with the reason and the signed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.faults import inject
from lab.services.arm import (
    AgentResult,
    ArmService,
    Extension,
    LabDriverAgent,
    VirtualMachine,
    make_test_ca,
    write_az_config,
)
from remediation.host.audit import AuditOptions, run_audit
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
SUB = "0c4f6b2a-8e1d-4a3b-9c5d-7e6f8a9b0c1d"
VM_ID = f"/subscriptions/{SUB}/resourceGroups/rg-gpu/providers/Microsoft.Compute/virtualMachines/gpu-vm-2"
AZURE_VARS = {"azure_vm_resource_id": VM_ID, "azure_nvidia_driver_extension_version": "1.9",
              "azure_nvidia_driver_extension_settings": {"updateOS": False}}
JOURNAL = "/var/lib/gpufleet/driver-restore/journal.json"


def _vars(vm: str) -> dict[str, Any]:
    return {**AZURE_VARS, "azure_vm_resource_id": VM_ID.replace("gpu-vm-2", vm)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("azext")
    overrides = {"gpu-2": AZURE_VARS, "gpu-3": _vars("gpu-vm-3"), "gpu-4": _vars("gpu-vm-4")}
    lab = make_lab(tmp, "127.0.53", 4, flavour="azure", host_overrides=overrides)
    arm = None
    try:
        tls = make_test_ca(tmp / "tls")
        arm = ArmService(tls, retry_after=0, agent=LabDriverAgent(lab, reboot_timeout=60)).start()
        arm.add_subscription(SUB, "gpu-fleet-lab")
        vms = {}
        for host in ("gpu-2", "gpu-3", "gpu-4"):
            vm = VirtualMachine("eastus", lab_host=host, secure_boot=host == "gpu-4")
            vm.extensions["nvidiagpudriverlinux"] = Extension("NvidiaGpuDriverLinux", "Microsoft.HpcCompute",
                                                              "NvidiaGpuDriverLinux", "1.6", {}, True)
            arm.add_vm(SUB, "rg-gpu", host.replace("gpu-", "gpu-vm-"), vm)
            vms[host] = vm
        config = write_az_config(tmp / "az", arm, subscriptions=[(SUB, "gpu-fleet-lab")], default=SUB)
        inject(lab, "gpu-2", "kernel-upgrade")
        inject(lab, "gpu-3", "kernel-upgrade")
        inject(lab, "gpu-4", "secure-boot")  # Trusted Launch from the next boot: the DKMS module is refused
        lab.reboot("gpu-4", wait=True, timeout=60)
        yield {"lab": lab, "arm": arm, "tls": tls, "config": config, "tmp": tmp, "vm": vms["gpu-2"], "vms": vms}
    finally:
        if arm is not None:
            arm.stop()
        lab.down(purge=True)


def _restore(s: dict[str, Any], inventory: Path, *extra: str, host: str = "gpu-2") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AZURE_CONFIG_DIR": str(s["config"]), "REQUESTS_CA_BUNDLE": str(s["tls"].ca),
           "INVOKE_DRIVER_RESTORE_STATE_DIR": str(s["tmp"] / "state-restore")}
    args = ["driver-restore", "--inventory", str(inventory), "--limit", host, "--method", "azure-extension",
            "--yes", "--reboot-timeout", "60", "--report", str(s["tmp"] / "report.md"), *extra]
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600, check=False)
    for secret in (s["arm"].token, s["arm"].client_secret):
        assert secret not in proc.stdout + proc.stderr
    return proc


def _state(lab: Any, host: str = "gpu-2") -> str:
    return lab.host_path(host, "/var/lib/dpkg/status").read_text()


def _driver(lab: Any, host: str) -> str:
    """The installed nvidia-driver-535's Debian version on ``host``."""
    return str(lab.run_in_host(host, ["dpkg-query", "-W", "-f", "${Version}", "nvidia-driver-535"]).stdout.strip())


def test_a_secure_boot_host_is_refused_with_its_reason_and_nothing_is_sent(setup: dict[str, Any]) -> None:
    lab, arm = setup["lab"], setup["arm"]
    before, boot = _state(lab, "gpu-4"), lab.boot_id("gpu-4")
    kernel = lab.run_in_host("gpu-4", ["uname", "-r"]).stdout.strip()
    arm.clear_requests()
    proc = _restore(setup, lab.cfg.inventory_path, "--allow-reboot", host="gpu-4")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.replace("\u2502", " ").split())  # the table's cell walls out of the text
    assert "--method azure-extension refused: Secure Boot is on (efivars): the NvidiaGpuDriverLinux extension does" \
        " not support Secure Boot" in out, out
    assert f"restore it with --method apt (driver_restore_method: apt), which installs Canonical's signed module" \
        f" linux-modules-nvidia-535-{kernel}" in out, out
    # Refused at plan time: not one request reached ARM, nothing changed on the host.
    assert arm.requests == [] and setup["vms"]["gpu-4"].extensions["nvidiagpudriverlinux"].version == "1.6"
    assert _state(lab, "gpu-4") == before and lab.boot_id("gpu-4") == boot
    assert not lab.host_path("gpu-4", JOURNAL).exists()


def test_vm_not_mapped_is_one_line_and_nothing_is_sent(setup: dict[str, Any]) -> None:
    lab, arm = setup["lab"], setup["arm"]
    inv = yaml.safe_load(lab.cfg.inventory_path.read_text())
    for key in AZURE_VARS:
        if key != "azure_nvidia_driver_extension_version":
            inv["all"]["children"]["gpu"]["hosts"]["gpu-2"].pop(key)
    unmapped = setup["tmp"] / "unmapped.yml"
    unmapped.write_text(yaml.safe_dump(inv))
    before = _state(lab)
    arm.clear_requests()
    proc = _restore(setup, unmapped, "--allow-reboot")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(errors) == 1 and "gpu-2 is not mapped to an Azure VM: set azure_vm_resource_id" in errors[0]
    assert arm.requests == [] and _state(lab) == before


def test_no_reboot_allowed_leaves_the_host_alone(setup: dict[str, Any]) -> None:
    arm = setup["arm"]
    arm.clear_requests()
    proc = _restore(setup, setup["lab"].cfg.inventory_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "--allow-reboot" in proc.stdout and arm.requests == []


def test_check_shows_the_extension_plan_and_changes_nothing(setup: dict[str, Any]) -> None:
    lab, arm = setup["lab"], setup["arm"]
    arm.clear_requests()
    before, boot = _state(lab), lab.boot_id("gpu-2")
    proc = _restore(setup, lab.cfg.inventory_path, "--allow-reboot", "--check")
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NvidiaGpuDriverLinux" in out and "re-add" in out
    assert [r.method for r in arm.arm_requests() if r.method != "GET"] == []
    assert _state(lab) == before and lab.boot_id("gpu-2") == boot


def test_failed_provisioning_stops_and_says_what_the_host_is_left_with(setup: dict[str, Any]) -> None:
    lab, arm, vm = setup["lab"], setup["arm"], setup["vm"]
    arm.clear_requests()
    before, boot, driver = _state(lab), lab.boot_id("gpu-2"), _driver(lab, "gpu-2")
    agent = arm.agent
    arm.agent = lambda _vm, ext: AgentResult(False, ("Enable failed: the driver installer exited 1",))
    try:
        proc = _restore(setup, lab.cfg.inventory_path, "--allow-reboot")
    finally:
        arm.agent = agent
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "apply: NvidiaGpuDriverLinux" in out and "the driver installer exited 1" in out
    # The undo does not run the extension again (the old settings would install the latest driver, not the old one):
    # no PUT after the failed one; it says what the host and the resource are left as.
    ext = vm.extensions["nvidiagpudriverlinux"]
    assert (ext.version, ext.state) == ("1.9", "Failed")
    assert [r.method for r in arm.arm_requests() if r.method != "GET"] == ["DELETE", "PUT"]
    journal = json.loads(lab.host_path("gpu-2", JOURNAL).read_text())
    assert journal["status"] == "undone"
    assert journal["undone"][0] == (f"NVIDIA packages as before this run (nvidia-driver-535 {driver}): nothing to"
                                    " bring back")
    assert journal["undone"][1].startswith("the NvidiaGpuDriverLinux extension resource stays as this run left it"
                                           " (typeHandlerVersion 1.9, provisioning Failed; before the run:"
                                           " typeHandlerVersion 1.6)")
    assert _state(lab) == before and lab.boot_id("gpu-2") == boot


def test_a_failed_gate_brings_the_previous_driver_back(setup: dict[str, Any]) -> None:
    lab, arm = setup["lab"], setup["arm"]
    old = _driver(lab, "gpu-3")
    assert old.startswith("535.183.01-")
    agent = arm.agent

    def install_then_lose_the_gpu(vm: VirtualMachine, ext: Extension) -> AgentResult:
        assert agent is not None
        result = agent(vm, ext)
        inject(lab, "gpu-3", "xid-79")  # the GPU falls off the bus after the extension's reboot
        return result

    arm.agent = install_then_lose_the_gpu
    try:
        proc = _restore(setup, lab.cfg.inventory_path, "--allow-reboot", host="gpu-3")
    finally:
        arm.agent = agent
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gate: NVML" in out, out
    journal = json.loads(lab.host_path("gpu-3", JOURNAL).read_text())
    assert journal["status"] == "undone", proc.stdout[-3000:] + proc.stderr[-2000:]
    new = json.loads(journal["changes"][1]["after"])["reportedDriverVersion"]
    assert new == "535.216.01"
    assert journal["undone"][0].startswith("brought the previous NVIDIA packages back with apt (nvidia-driver-535 "
                                           "535.216.01-")
    assert f"-> nvidia-driver-535 {old})" in journal["undone"][0]
    assert "the running kernel module stays the extension's until the host reboots" in journal["undone"][0]
    assert _driver(lab, "gpu-3") == old


def test_s1_host_restored_through_the_extension(setup: dict[str, Any]) -> None:
    lab, arm, vm = setup["lab"], setup["arm"], setup["vm"]
    arm.clear_requests()
    boot = lab.boot_id("gpu-2")
    inventory = yaml.safe_load(lab.cfg.inventory_path.read_text())
    assert inventory["all"]["children"]["gpu"]["vars"]["nvidia_driver_expected_version"] == "535.183.01"
    proc = _restore(setup, lab.cfg.inventory_path, "--allow-reboot")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [(r.method, r.path.rsplit("/", 2)[-2:]) for r in arm.arm_requests() if r.method != "GET"]
    ext = ["extensions", "NvidiaGpuDriverLinux"]
    assert calls == [("DELETE", ext), ("PUT", ext)]
    put = next(r for r in arm.arm_requests() if r.method == "PUT")
    assert put.body["properties"]["typeHandlerVersion"] == "1.9"
    assert put.body["properties"]["settings"] == {"updateOS": False}
    assert vm.extensions["nvidiagpudriverlinux"].state == "Succeeded"
    # The agent stand-in installed the latest driver of the branch and rebooted the host; the gate took the version
    # the extension reported, not the inventory's pinned 535.183.01.
    assert lab.boot_id("gpu-2") != boot
    after = run_audit(load(lab.cfg.inventory_path, "gpu", "gpu-2"), AuditOptions(nvml_timeout=5, timeout=30))
    facts = after.host("gpu-2").facts
    assert facts is not None and facts.nvml.ok and facts.nvml.driver_version == "535.216.01"
    assert "GPU-DRV-001" not in {f.id for f in after.host("gpu-2").findings}
    journal = json.loads(lab.host_path("gpu-2", JOURNAL).read_text())
    assert journal["status"] == "applied"
    assert [c["kind"] for c in journal["changes"]] == ["driver_packages", "azure_extension"]
    assert json.loads(journal["changes"][0]["before"])["nvidia-driver-535"].startswith("535.183.01-")
    assert json.loads(journal["changes"][1]["before"])["typeHandlerVersion"] == "1.9"  # the failed test's
    report = " ".join((setup["tmp"] / "report.md").read_text().split())
    assert "NVML ok, driver 535.216.01, the version the extension reported" in report, report
    what = "VM extension NvidiaGpuDriverLinux re-added (typeHandlerVersion 1.9; before: typeHandlerVersion 1.9)"
    assert what in report
    assert "Enable succeeded: NVIDIA driver 535.216.01 installed" in report
