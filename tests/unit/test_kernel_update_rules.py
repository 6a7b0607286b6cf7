"""The kernel update's per-host plan (pure), from probe documents of sample trees and apt-cache show text."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from remediation.core.checks import Policy, run_checks
from remediation.core.facts import DeviceUser, DeviceUsers, DpkgLock, facts_from_dict
from remediation.kernelupdate import rules
from remediation.kernelupdate.errors import KernelUpdateError
from remediation.kernelupdate.flow import KernelUpdateOptions
from remediation.kernelupdate.rules import available_query, parse_available, plan_host
from tests.unit.test_probe_host import run_probe
from tests.unit.test_secure_boot import AZ_NEW, AZ_OLD, _azure_host

SHOW = f"""\
Package: linux-image-{AZ_NEW}
Version: 6.5.0-1025.26~22.04.1
Depends: linux-modules-{AZ_NEW}
Package: linux-headers-{AZ_NEW}
Version: 6.5.0-1025.26~22.04.1
Package: linux-modules-nvidia-535-{AZ_NEW}
Version: 6.5.0-1025.26~22.04.1+1
Depends: linux-image-{AZ_NEW}, nvidia-kernel-common-535 (>= 535.216.01), nvidia-kernel-common-535 (<= 535.216.01-1)
Package: linux-modules-nvidia-535-{AZ_NEW}
Version: 6.5.0-1025.26~22.04.1
Depends: linux-image-{AZ_NEW}, nvidia-kernel-common-535 (>= 535.183.01), nvidia-kernel-common-535 (<= 535.183.01-1)
Package: linux-image-6.5.0-1023-azure
Version: 6.5.0-1023.24~22.04.1
"""


def _facts(tmp_path: Path, secure_boot: bool | None) -> Any:
    root = _azure_host(tmp_path, secure_boot=secure_boot, signed_new=False)
    for ko in (root / "lib/modules").glob(f"{AZ_NEW}"):
        import shutil

        shutil.rmtree(ko)
    status = root / "var/lib/dpkg/status"
    # Only the booted kernel installed: 1025 is what apt offers.
    text = "\n\n".join(s for s in status.read_text().split("\n\n") if AZ_NEW not in s)
    status.write_text(text)
    doc = run_probe("--root", str(root), "--kernel-release", AZ_OLD, "--skip-nvml")
    doc["nvml"] = {"ok": True, "error_class": "none", "driver_version": "535.183.01", "device_count": 0, "gpus": []}
    doc["device_users"] = {"users": [], "unreadable": 0}
    return facts_from_dict(doc, host="h")


def _plan(facts: Any, show: str = SHOW, **kw: Any) -> Any:
    return plan_host("h", facts, run_checks(facts, Policy()), {}, parse_available(show), **kw)


def test_parse_available_keeps_every_build() -> None:
    offers = parse_available(SHOW)
    assert len(offers[f"linux-modules-nvidia-535-{AZ_NEW}"]) == 2
    assert "apt-cache search --names-only '^linux-image-[0-9].*-azure$'" in available_query("azure", "535")
    with pytest.raises(ValueError):
        available_query("azure; rm -rf /", "535")


def test_secure_boot_host_gets_the_signed_build_of_its_driver(tmp_path: Path) -> None:
    p = _plan(_facts(tmp_path, secure_boot=True))
    assert p.changes_host and p.target_kernel == AZ_NEW and p.flavour == "azure" and p.module_source == "signed"
    assert p.install_specs == (f"linux-image-{AZ_NEW}", f"linux-modules-nvidia-535-{AZ_NEW}=6.5.0-1025.26~22.04.1")
    assert p.install_packages == (f"linux-image-{AZ_NEW}", f"linux-modules-nvidia-535-{AZ_NEW}")
    assert p.unhold_packages == () and "unhold nothing" in p.steps[0]
    assert p.to_dict()["target_entry"] == f"Advanced options for Ubuntu>Ubuntu, with Linux {AZ_NEW}"
    assert f"linux-modules-nvidia-535-{AZ_NEW}" in p.hold_packages


def test_without_secure_boot_dkms_and_headers(tmp_path: Path) -> None:
    p = _plan(_facts(tmp_path, secure_boot=False))
    assert p.module_source == "dkms" and p.install_packages == (f"linux-image-{AZ_NEW}", f"linux-headers-{AZ_NEW}")
    assert any(s.startswith(f"dkms autoinstall -k {AZ_NEW}") for s in p.steps)


def test_no_build_for_the_driver_leaves_the_host_alone(tmp_path: Path) -> None:
    only_new = SHOW.split(f"Package: linux-modules-nvidia-535-{AZ_NEW}\nVersion: 6.5.0-1025.26~22.04.1\n")[0]
    p = _plan(_facts(tmp_path, secure_boot=True), show=only_new)
    assert not p.changes_host and p.blocked and "no build" in p.reason and "535.216.01" in p.reason


def test_kernel_flag_must_name_the_booted_flavour_and_nothing_newer_is_current(tmp_path: Path) -> None:
    facts = _facts(tmp_path, secure_boot=True)
    wrong = _plan(facts, kernel="6.5.0-45-generic")
    assert wrong.blocked and "not a azure kernel release" in wrong.reason
    assert _plan(facts, kernel=AZ_OLD).action == "none"
    assert _plan(facts, show="").action == "none"
    older = _plan(facts, kernel="6.5.0-1023-azure")
    assert older.blocked and "not newer" in older.reason


def test_options_are_checked_before_anything_runs() -> None:
    with pytest.raises(KernelUpdateError, match="--module-source 'sideways'"):
        KernelUpdateOptions(module_source="sideways").validate()
    with pytest.raises(KernelUpdateError, match="--batch 0"):
        KernelUpdateOptions(batch=0).validate()


def test_driver_daemons_are_not_gpu_work_but_jobs_are(tmp_path: Path) -> None:
    facts = _facts(tmp_path, secure_boot=False)
    daemon = {"pid": 812, "comm": "nvidia-persiste", "exe": "nvidia-persistenced", "devices": ["/dev/nvidia0",
              "/dev/nvidiactl"], "gpus": [0], "service": True}
    job = {"pid": 3121, "comm": "python3", "exe": "python3.10", "devices": ["/dev/nvidia0"], "gpus": [0],
           "service": False}
    doc = dict(facts.raw)
    doc["device_users"] = {"users": [daemon], "unreadable": 0}
    assert _plan(facts_from_dict(doc, host="h")).changes_host
    doc["device_users"] = {"users": [daemon, job], "unreadable": 0}
    p = _plan(facts_from_dict(doc, host="h"))
    assert not p.changes_host and "pid 3121 (python3) holds GPU 0" in (p.blocked or "")


def test_every_rule_and_guard_of_the_plan_is_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rule of the first-match table, and each guard, decides at least one host of a small grid of inputs (a
    rule that an earlier one shadows, or whose predicate can never hold, fails this)."""
    healthy = facts_from_dict(json.loads((Path(__file__).parents[1] / "fixtures/facts/healthy.json").read_text()))
    booted, newer = "6.5.0-45-generic", "6.8.0-40-generic"
    assert healthy.system.kernel == booted and healthy.nvml.ok and healthy.packages.driver_branch == "535"
    image = {f"linux-image-{newer}": (rules.Available(f"linux-image-{newer}", "6.8.0-40.40"),)}
    headers = {f"linux-headers-{newer}": (rules.Available(f"linux-headers-{newer}", "6.8.0-40.40"),)}
    signed = f"linux-modules-nvidia-535-{newer}"

    def build(driver: str) -> dict[str, Any]:
        return {signed: (rules.Available(signed, "1", f"nvidia-kernel-common-535 (>= {driver})"),)}

    offers = [{}, image, {**image, **headers}, {**image, **build("535.183.01")}, {**image, **build("535.216.01")}]
    job = DeviceUser(3121, "python3", ("/dev/nvidia0",), (0,), False)
    guards = [{}, {"dpkg_lock": DpkgLock(True, 7, "apt-get")}, {"device_users": DeviceUsers((job,), True, 0)}]
    hosts = [
        healthy,
        dataclasses.replace(healthy, nvml=dataclasses.replace(healthy.nvml, ok=False, error_class="driver_not_loaded")),
        dataclasses.replace(healthy, system=dataclasses.replace(healthy.system, kernel_flavour=None)),
        dataclasses.replace(healthy, packages=dataclasses.replace(healthy.packages, driver_branch=None)),
    ]
    fired: set[str] = set()
    monkeypatch.setattr(rules, "_RULES", tuple(
        dataclasses.replace(r, plan=lambda c, r=r: (fired.add(r.name), r.plan(c))[1]) for r in rules._RULES
    ))
    monkeypatch.setattr(rules, "_GUARDS", tuple(
        dataclasses.replace(g, blocks=lambda c, g=g: (why := g.blocks(c)) and (fired.add(g.name), why)[1])
        for g in rules._GUARDS
    ))
    grid = itertools.product(hosts, guards, offers, [None, booted, newer, "6.9.0-1-generic", "6.5.0-1025-azure"],
                             ["dkms", "signed"], [{}, {"gpufleet_cordoned": True}])
    for facts, guard, available, kernel, source, host_vars in grid:
        plan_host("h", dataclasses.replace(facts, **guard), [], host_vars, available, kernel=kernel,
                  module_source=source)
    names = [r.name for r in rules._RULES] + [g.name for g in rules._GUARDS]
    assert len(set(names)) == len(names), "rule and guard names are unique"
    assert [n for n in names if n not in fired] == []
