"""End to end: ``invoke driver-restore --method azure-extension`` repairs an S1 host through ARM calls.

The local ARM service's VM-extension handler stands in for the Azure VM agent: when NvidiaGpuDriverLinux is re-added
on VM gpu-vm-2 it installs the driver on lab host gpu-2 (headers of the running kernel, the driver reinstalled so
DKMS builds the module) and reboots it. The restore flow around it is the apt method's: the audit decides, the guards
hold (no reboot without --allow-reboot), the NVML gate judges, the journal on the host records the change.
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
from remediation.audit import AuditOptions, run_audit
from remediation.inventory import load
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
SUB = "0c4f6b2a-8e1d-4a3b-9c5d-7e6f8a9b0c1d"
VM_ID = f"/subscriptions/{SUB}/resourceGroups/rg-gpu/providers/Microsoft.Compute/virtualMachines/gpu-vm-2"
AZURE_VARS = {"azure_vm_resource_id": VM_ID, "azure_nvidia_driver_extension_version": "1.9",
              "azure_nvidia_driver_extension_settings": {"updateOS": False}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("azext")
    lab = make_lab(tmp, "127.0.53", 2, flavour="azure", host_overrides={"gpu-2": AZURE_VARS})
    arm = None
    try:
        tls = make_test_ca(tmp / "tls")
        arm = ArmService(tls, retry_after=0, agent=LabDriverAgent(lab, reboot_timeout=60)).start()
        arm.add_subscription(SUB, "gpu-fleet-lab")
        vm = VirtualMachine("eastus", lab_host="gpu-2")
        vm.extensions["nvidiagpudriverlinux"] = Extension("NvidiaGpuDriverLinux", "Microsoft.HpcCompute",
                                                          "NvidiaGpuDriverLinux", "1.6", {}, True)
        arm.add_vm(SUB, "rg-gpu", "gpu-vm-2", vm)
        config = write_az_config(tmp / "az", arm, subscriptions=[(SUB, "gpu-fleet-lab")], default=SUB)
        inject(lab, "gpu-2", "kernel-upgrade")
        yield {"lab": lab, "arm": arm, "tls": tls, "config": config, "tmp": tmp, "vm": vm}
    finally:
        if arm is not None:
            arm.stop()
        lab.down(purge=True)


def _restore(s: dict[str, Any], inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AZURE_CONFIG_DIR": str(s["config"]), "REQUESTS_CA_BUNDLE": str(s["tls"].ca),
           "INVOKE_DRIVER_RESTORE_STATE_DIR": str(s["tmp"] / "state-restore")}
    args = ["driver-restore", "--inventory", str(inventory), "--limit", "gpu-2", "--method", "azure-extension",
            "--yes", "--reboot-timeout", "60", "--report", str(s["tmp"] / "report.md"), *extra]
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600, check=False)
    for secret in (s["arm"].token, s["arm"].client_secret):
        assert secret not in proc.stdout + proc.stderr
    return proc


def _state(lab: Any) -> str:
    return lab.host_path("gpu-2", "/var/lib/dpkg/status").read_text()


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


def test_failed_provisioning_stops_and_puts_the_extension_back(setup: dict[str, Any]) -> None:
    lab, arm, vm = setup["lab"], setup["arm"], setup["vm"]
    arm.clear_requests()
    before, boot = _state(lab), lab.boot_id("gpu-2")
    agent = arm.agent
    # The new version fails on this VM; the version the journal puts back installs as before.
    arm.agent = lambda _vm, ext: (AgentResult(False, ("Enable failed: the driver installer exited 1",))
                                  if ext.version == "1.9" else AgentResult(True, ("Enable succeeded",)))
    try:
        proc = _restore(setup, lab.cfg.inventory_path, "--allow-reboot")
    finally:
        arm.agent = agent
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "apply: NvidiaGpuDriverLinux" in out and "the driver installer exited 1" in out
    # The undo put the extension back as the journal recorded it; nothing else changed on the host.
    ext = vm.extensions["nvidiagpudriverlinux"]
    assert (ext.version, ext.state) == ("1.6", "Succeeded")
    assert [r.method for r in arm.arm_requests() if r.method != "GET"] == ["DELETE", "PUT", "PUT"]
    journal = json.loads(lab.host_path("gpu-2", "/var/lib/gpufleet/driver-restore/journal.json").read_text())
    assert journal["status"] == "undone" and "put back" in journal["undone"][0]
    assert _state(lab) == before and lab.boot_id("gpu-2") == boot


def test_s1_host_restored_through_the_extension(setup: dict[str, Any]) -> None:
    lab, arm, vm = setup["lab"], setup["arm"], setup["vm"]
    arm.clear_requests()
    boot = lab.boot_id("gpu-2")
    proc = _restore(setup, lab.cfg.inventory_path, "--allow-reboot")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [(r.method, r.path.rsplit("/", 2)[-2:]) for r in arm.arm_requests() if r.method != "GET"]
    ext = ["extensions", "NvidiaGpuDriverLinux"]
    assert calls == [("DELETE", ext), ("PUT", ext)]
    put = next(r for r in arm.arm_requests() if r.method == "PUT")
    assert put.body["properties"]["typeHandlerVersion"] == "1.9"
    assert put.body["properties"]["settings"] == {"updateOS": False}
    assert vm.extensions["nvidiagpudriverlinux"].state == "Succeeded"
    # The agent stand-in rebooted the host; the NVML gate passed on it.
    assert lab.boot_id("gpu-2") != boot
    after = run_audit(load(lab.cfg.inventory_path, "gpu", "gpu-2"), AuditOptions(nvml_timeout=5, timeout=30))
    facts = after.host("gpu-2").facts
    assert facts is not None and facts.nvml.ok and facts.nvml.driver_version == "535.183.01"
    assert "GPU-DRV-001" not in {f.id for f in after.host("gpu-2").findings}
    journal = json.loads(lab.host_path("gpu-2", "/var/lib/gpufleet/driver-restore/journal.json").read_text())
    assert journal["status"] == "applied" and journal["changes"][0]["kind"] == "azure_extension"
    assert json.loads(journal["changes"][0]["before"])["typeHandlerVersion"] == "1.6"
    report = (setup["tmp"] / "report.md").read_text()
    what = "VM extension NvidiaGpuDriverLinux re-added (typeHandlerVersion 1.9; before: typeHandlerVersion 1.6)"
    assert what in report
    assert "Enable succeeded" in report
