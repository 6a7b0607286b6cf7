"""Checks: pure functions of :class:`~remediation.facts.HostFacts` -> findings.

Each check takes ``(facts, policy)`` and returns the findings it concludes, each with ``host`` set and evidence
lines quoting the facts it rests on.  :func:`run_checks` runs the per-host registry :data:`HOST_CHECKS`;
:func:`run_fleet_checks` adds the cross-host checks (driver drift against the fleet majority).

Guarantee: a host whose NVML failed never comes out healthy: if no check produced a critical finding for it, a
critical GPU-DRV-004 is added.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from remediation.checks import driver, hardware, kernel, thermal, usage
from remediation.checks.policy import Policy
from remediation.facts import HostFacts
from remediation.findings import Finding, Severity, make_finding

__all__ = ["HOST_CHECKS", "Check", "Policy", "run_checks", "run_fleet_checks"]

Check = Callable[[HostFacts, Policy], list[Finding]]

HOST_CHECKS: tuple[Check, ...] = (
    driver.check_nvml,
    driver.check_api_mismatch_log,
    kernel.check_newer_kernel_without_module,
    kernel.check_kernel_hold,
    kernel.check_unattended_kernel,
    kernel.check_unattended_nvidia,
    kernel.check_reboot_required,
    kernel.check_unattended_installs,
    kernel.check_dpkg_lock,
    hardware.check_fallen_off_bus,
    hardware.check_gpu_count,
    hardware.check_ecc,
    hardware.check_memory_health,
    hardware.check_xid_events,
    thermal.check_temperature,
    thermal.check_throttle,
    usage.check_persistence_mode,
    usage.check_memory_full,
)


def _dedupe(findings: list[Finding]) -> tuple[Finding, ...]:
    return tuple(dict.fromkeys(findings))


def run_checks(facts: HostFacts, policy: Policy) -> tuple[Finding, ...]:
    """Every per-host check, in registry order (duplicates dropped)."""
    findings: list[Finding] = []
    for check in HOST_CHECKS:
        findings.extend(check(facts, policy))
    if facts.nvml.failed and not any(f.severity is Severity.CRITICAL for f in findings):
        findings.append(
            make_finding(
                "GPU-DRV-004",
                "NVML failed and no specific cause was found",
                [f"NVML: {facts.nvml.error_class}: {facts.nvml.error or 'no message'}"],
                host=facts.host,
                severity=Severity.CRITICAL,
            )
        )
    return _dedupe(findings)


def run_fleet_checks(all_facts: Mapping[str, HostFacts], policy: Policy) -> dict[str, tuple[Finding, ...]]:
    """Per-host checks for every host plus the cross-host ones; every host is a key, healthy ones map to ()."""
    drift = driver.check_driver_drift(all_facts, policy)
    out: dict[str, tuple[Finding, ...]] = {}
    for host, facts in all_facts.items():
        out[host] = _dedupe([*run_checks(facts, policy), *drift.get(host, [])])
    return out
