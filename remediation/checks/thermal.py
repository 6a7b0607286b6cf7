"""Temperature and clock event reasons (GPU-THM-00x).

Decisions:
- One temperature finding per GPU: at or above the GPU's own slowdown threshold -> GPU-THM-002 (critical);
  else at or above ``policy.temp_alert_c`` (78 °C, the runbook's alert) -> GPU-THM-001.
- GPU-THM-003 for the throttle reasons that slow work: ``hw_slowdown``, ``hw_thermal_slowdown``,
  ``sw_thermal_slowdown``, ``hw_power_brake_slowdown`` (warning).  ``sw_power_cap`` alone is the driver holding
  the board at its power limit: below ``policy.power_cap_busy_util_pct`` (50 %) utilisation it is not an incident
  (no finding; idle boards report it transiently); at or above it, it is reported as info (the GPU is capped at
  its power limit while busy).  ``gpu_idle``, ``applications_clocks_setting``, ``sync_boost`` and
  ``display_clock_setting`` are never findings.
"""

from __future__ import annotations

from remediation.checks.policy import Policy
from remediation.facts import HostFacts
from remediation.findings import Finding, Severity, make_finding

__all__ = ["THROTTLE_REASONS", "check_temperature", "check_throttle"]

THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")


def _v(value: object) -> str:
    return "?" if value is None else str(value)


def check_temperature(facts: HostFacts, policy: Policy) -> list[Finding]:
    out = []
    for gpu in facts.nvml.gpus:
        temp = gpu.temperature_c
        if not gpu.ok or temp is None:
            continue
        slowdown = gpu.thresholds.slowdown
        limits = f"alert {policy.temp_alert_c} °C, slowdown {slowdown if slowdown is not None else '?'} °C"
        if slowdown is not None and temp >= slowdown:
            out.append(
                make_finding(
                    "GPU-THM-002",
                    f"{gpu.label} at {temp} °C, at or above its slowdown threshold {slowdown} °C",
                    [f"{gpu.label}: temperature {temp} °C ({limits})"],
                    host=facts.host,
                )
            )
        elif temp >= policy.temp_alert_c:
            out.append(
                make_finding(
                    "GPU-THM-001",
                    f"{gpu.label} at {temp} °C, at or above the alert threshold {policy.temp_alert_c} °C",
                    [f"{gpu.label}: temperature {temp} °C ({limits})"],
                    host=facts.host,
                )
            )
    return out


def check_throttle(facts: HostFacts, policy: Policy) -> list[Finding]:
    out = []
    for gpu in facts.nvml.gpus:
        if not gpu.ok:
            continue
        active = set(gpu.clocks_event_reasons)
        throttling = [r for r in THROTTLE_REASONS if r in active]
        util = gpu.utilization_gpu
        capped_busy = "sw_power_cap" in active and util is not None and util >= policy.power_cap_busy_util_pct
        if not throttling and not capped_busy:
            continue
        reasons = throttling + (["sw_power_cap"] if "sw_power_cap" in active else [])
        evidence = [
            f"{gpu.label}: clock event reasons {', '.join(reasons)} (mask {hex(gpu.clocks_event_mask or 0)})",
            f"{gpu.label}: temperature {_v(gpu.temperature_c)} °C, utilisation {_v(util)} %, "
            f"power {_v(gpu.power_w)} W of {_v(gpu.power_limit_w)} W",
        ]
        out.append(
            make_finding(
                "GPU-THM-003",
                f"{gpu.label} clocks reduced: {', '.join(reasons)}",
                evidence,
                host=facts.host,
                severity=None if throttling else Severity.INFO,
            )
        )
    return out
