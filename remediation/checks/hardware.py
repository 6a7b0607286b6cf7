"""GPU hardware health from NVML counters and the kernel log (GPU-HW-00x)."""

from __future__ import annotations

from remediation.catalog import xid_severity
from remediation.checks.policy import Policy
from remediation.facts import HostFacts
from remediation.findings import Finding, make_finding
from remediation.parsers.kernel_log import XidEvent

__all__ = ["check_ecc", "check_fallen_off_bus", "check_gpu_count", "check_memory_health", "check_xid_events"]


def check_gpu_count(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-HW-002: NVML counts fewer GPUs than the host should have."""
    expected = policy.expected_gpus(facts.host)
    count = facts.nvml.device_count
    if expected is None or count is None or count >= expected:
        return []
    found = ", ".join(g.pci_bus_id or f"#{g.index}" for g in facts.nvml.gpus) or "none"
    evidence = [f"NVML device count {count}, expected {expected}", f"GPUs seen: {found}"]
    for fell in facts.kernel_log.fallen_off_bus:
        evidence.extend(fell.evidence)
    return [make_finding("GPU-HW-002", f"{count} of {expected} GPUs visible", evidence, host=facts.host)]


def check_fallen_off_bus(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-HW-001 from the kernel log when NVML did not already report the GPU lost (the driver check does)."""
    if facts.nvml.error_class == "gpu_lost" or not facts.kernel_log.fallen_off_bus:
        return []
    evidence = [line for fell in facts.kernel_log.fallen_off_bus for line in fell.evidence]
    evidence.append("hardware/platform fault, not a driver problem: do not reinstall the driver")
    pcis = ", ".join(dict.fromkeys(f.pci for f in facts.kernel_log.fallen_off_bus))
    return [make_finding("GPU-HW-001", f"GPU {pcis} fell off the bus (kernel log)", evidence, host=facts.host)]


def check_ecc(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-HW-003: volatile uncorrected ECC errors since the last driver load."""
    out = []
    for gpu in facts.nvml.gpus:
        count = gpu.ecc_volatile.uncorrected
        if gpu.ok and count:
            evidence = [
                f"{gpu.label}: volatile uncorrected ECC errors {count} "
                f"(aggregate {gpu.ecc_aggregate.uncorrected if gpu.ecc_aggregate.uncorrected is not None else '?'})"
            ]
            out.append(
                make_finding("GPU-HW-003", f"{gpu.label}: {count} uncorrected ECC errors", evidence, host=facts.host)
            )
    return out


def check_memory_health(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-HW-004: retired pages / remapped rows past DCGM's limits, a pending remap or a remap failure."""
    out = []
    for gpu in facts.nvml.gpus:
        if not gpu.ok:
            continue
        reasons = []
        pages = gpu.retired_pages
        if pages is not None:
            if pages.total >= policy.retired_pages_limit:
                reasons.append(f"retired pages {pages.total} >= {policy.retired_pages_limit} (DCGM limit)")
            if (pages.double_bit or 0) > policy.retired_dbe_limit:
                reasons.append(f"double-bit retired pages {pages.double_bit} > {policy.retired_dbe_limit} (DCGM limit)")
            if pages.pending:
                reasons.append("page retirement pending (takes effect after a GPU reset)")
        rows = gpu.remapped_rows
        if rows is not None:
            if rows.uncorrectable >= policy.remapped_uncorrectable_limit:
                limit = policy.remapped_uncorrectable_limit
                reasons.append(f"rows remapped for uncorrectable errors {rows.uncorrectable} >= {limit}")
            if rows.pending:
                reasons.append(f"row remap pending (uncorrectable {rows.uncorrectable}): the GPU needs a reset")
            if rows.failure:
                reasons.append("row remapping failed: the GPU is out of spare rows")
        if reasons:
            out.append(
                make_finding(
                    "GPU-HW-004",
                    f"{gpu.label}: memory retirement/remapping needs attention",
                    [f"{gpu.label}: {r}" for r in reasons],
                    host=facts.host,
                )
            )
    return out


def check_xid_events(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-HW-005: one finding per (Xid code, GPU) since boot; Xid 79 is GPU-HW-001's."""
    groups: dict[tuple[int, str], list[XidEvent]] = {}
    for event in facts.kernel_log.xid_events:
        if event.code == 79:
            continue
        groups.setdefault((event.code, event.pci), []).append(event)
    out = []
    for (code, pci), events in sorted(groups.items()):
        first = events[0]
        evidence = [
            f"Xid {code} on {pci}: {first.meaning} ({len(events)} event{'s' if len(events) > 1 else ''} since boot)"
        ]
        evidence.extend(e.text for e in events[:3])
        procs = sorted({e.name for e in events if e.name})
        if procs:
            evidence.append(f"processes: {', '.join(procs)}")
        out.append(
            make_finding(
                "GPU-HW-005",
                f"Xid {code} on {pci}: {first.meaning}",
                evidence,
                host=facts.host,
                severity=xid_severity(code),
            )
        )
    return out
