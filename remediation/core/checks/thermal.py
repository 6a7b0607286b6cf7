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

from remediation.core.checks.evidence import Evidence
from remediation.core.checks.registry import rule
from remediation.core.findings import Finding, Severity, make_finding

__all__ = ["THROTTLE_REASONS", "temperature_alert", "temperature_slowdown", "throttle"]

THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")


def _v(value: object) -> str:
    return "?" if value is None else str(value)


def _temperatures(ev: Evidence) -> list[tuple[str, int, int | None, str]]:
    """(label, temperature, slowdown threshold, evidence line) per GPU that reports a temperature."""
    if ev.facts is None:
        return []
    out = []
    for gpu in ev.facts.nvml.gpus:
        temp = gpu.temperature_c
        if not gpu.ok or temp is None:
            continue
        slowdown = gpu.thresholds.slowdown
        limits = f"alert {ev.policy.temp_alert_c} °C, slowdown {slowdown if slowdown is not None else '?'} °C"
        out.append((gpu.label, temp, slowdown, f"{gpu.label}: temperature {temp} °C ({limits})"))
    return out


@rule("GPU-THM-001")
def temperature_alert(ev: Evidence) -> list[Finding]:
    """GPU-THM-001: at or above the alert threshold and below the GPU's slowdown threshold (one per GPU)."""
    alert = ev.policy.temp_alert_c
    return [
        make_finding(
            "GPU-THM-001",
            f"{label} at {temp} °C, at or above the alert threshold {alert} °C",
            [line],
            host=ev.host,
        )
        for label, temp, slowdown, line in _temperatures(ev)
        if temp >= alert and not (slowdown is not None and temp >= slowdown)
    ]


@rule("GPU-THM-002")
def temperature_slowdown(ev: Evidence) -> list[Finding]:
    """GPU-THM-002: at or above the GPU's own slowdown threshold (one per GPU)."""
    return [
        make_finding(
            "GPU-THM-002",
            f"{label} at {temp} °C, at or above its slowdown threshold {slowdown} °C",
            [line],
            host=ev.host,
        )
        for label, temp, slowdown, line in _temperatures(ev)
        if slowdown is not None and temp >= slowdown
    ]


@rule("GPU-THM-003")
def throttle(ev: Evidence) -> list[Finding]:
    """GPU-THM-003: clock event reasons that slow work (one per GPU)."""
    if ev.facts is None:
        return []
    policy = ev.policy
    out = []
    for gpu in ev.facts.nvml.gpus:
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
                host=ev.host,
                severity=None if throttling else Severity.INFO,
            )
        )
    return out
