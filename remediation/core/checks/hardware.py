"""GPU hardware health from NVML and the kernel log (GPU-HW-00x).

Granularity, the same for the audit and ``invoke diagnose``:

- GPU-HW-001: one per host (or text): the GPUs NVML reports lost and those the kernel log says fell off the bus
  (Xid 79 or its wording), with the probe failure that follows it; never also GPU-HW-005 (for Xid 79) or
  GPU-HW-008 (for that probe failure).
- GPU-HW-005: one per (Xid code, GPU), severity from the Xid table; the history's identity is the same pair
  (:func:`remediation.host.history.discriminator`).
- GPU-HW-006: one per host: the GPUs NVML cannot get a handle for (Unknown Error).
- GPU-HW-007: one per host: NVML finds no devices, and/or the kernel log's RmInitAdapter failures.
- GPU-HW-008: one per host: the kernel log's probe failures (not the one that follows a GPU falling off the bus).
- GPU-HW-002/003/004: from the probe's counters only (device count, ECC, retired pages / remapped rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from remediation.core.catalog import xid_meaning, xid_remedy, xid_severity
from remediation.core.checks.evidence import Evidence
from remediation.core.checks.registry import rule
from remediation.core.findings import Finding, make_finding
from remediation.core.parsers.kernel_log import XidEvent

__all__ = [
    "device_handle_unknown_error",
    "ecc_errors",
    "gpu_count",
    "gpu_lost",
    "memory_retirement",
    "no_devices_or_init_failure",
    "probe_failed",
    "xid_events",
]

_NOT_DRIVER = "hardware/platform fault, not a driver problem: do not reinstall the driver"


def _uniq(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(line for line in lines if line))


@rule("GPU-HW-001")
def gpu_lost(ev: Evidence) -> list[Finding]:
    """GPU-HW-001: a GPU is lost (NVML) or fell off the bus (kernel log): not a driver problem."""
    nvml = ev.nvml
    lost = nvml.gpus_of("gpu_lost") if nvml is not None else ()
    nvml_lost = ev.nvml_class == "gpu_lost"
    fell = ev.kernel_log.fallen_off_bus
    if not (nvml_lost or lost or fell):
        return []
    evidence: list[str] = list(nvml.lines) if nvml is not None and (nvml_lost or lost) else []
    if ev.facts is not None:
        evidence.extend(f"{g.label}: {g.error}" for g in lost)
    evidence.extend(line for f in fell for line in f.evidence)
    if fell:
        evidence.extend(line for p in ev.kernel_log.probe_failures if p.kind == "failed" for line in p.evidence)
    evidence.append(_NOT_DRIVER)
    if lost or nvml_lost:
        which = ", ".join(g.label for g in lost) or "a GPU"
        summary = f"{which} lost (fallen off the bus): not a driver problem"
    else:
        pcis = ", ".join(dict.fromkeys(f.pci for f in fell))
        summary = f"GPU {pcis} fell off the bus (Xid 79 or equivalent): not a driver problem"
    return [make_finding("GPU-HW-001", summary, _uniq(evidence), host=ev.host)]


@rule("GPU-HW-002")
def gpu_count(ev: Evidence) -> list[Finding]:
    """GPU-HW-002: NVML counts fewer GPUs than the host should have."""
    facts = ev.facts
    if facts is None:
        return []
    expected = ev.policy.expected_gpus(facts.host)
    count = facts.nvml.device_count
    if expected is None or count is None or count >= expected:
        return []
    found = ", ".join(g.pci_bus_id or f"#{g.index}" for g in facts.nvml.gpus) or "none"
    evidence = [f"NVML device count {count}, expected {expected}", f"GPUs seen: {found}"]
    for fell in ev.kernel_log.fallen_off_bus:
        evidence.extend(fell.evidence)
    return [make_finding("GPU-HW-002", f"{count} of {expected} GPUs visible", evidence, host=ev.host)]


@rule("GPU-HW-003")
def ecc_errors(ev: Evidence) -> list[Finding]:
    """GPU-HW-003: volatile uncorrected ECC errors since the last driver load (one per GPU)."""
    if ev.facts is None:
        return []
    out = []
    for gpu in ev.facts.nvml.gpus:
        count = gpu.ecc_volatile.uncorrected
        if gpu.ok and count:
            aggregate = gpu.ecc_aggregate.uncorrected
            evidence = [
                f"{gpu.label}: volatile uncorrected ECC errors {count} "
                f"(aggregate {aggregate if aggregate is not None else '?'})"
            ]
            out.append(
                make_finding("GPU-HW-003", f"{gpu.label}: {count} uncorrected ECC errors", evidence, host=ev.host)
            )
    return out


@rule("GPU-HW-004")
def memory_retirement(ev: Evidence) -> list[Finding]:
    """GPU-HW-004: retired pages / remapped rows past DCGM's limits, a pending remap or a remap failure."""
    if ev.facts is None:
        return []
    policy = ev.policy
    out = []
    for gpu in ev.facts.nvml.gpus:
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
                    host=ev.host,
                )
            )
    return out


@rule("GPU-HW-005")
def xid_events(ev: Evidence) -> list[Finding]:
    """GPU-HW-005: one finding per (Xid code, GPU); Xid 79 is GPU-HW-001's."""
    groups: dict[tuple[int, str], list[XidEvent]] = {}
    for event in ev.kernel_log.xid_events:
        if event.code == 79:
            continue
        groups.setdefault((event.code, event.pci), []).append(event)
    out = []
    for (code, pci), events in sorted(groups.items()):
        meaning = events[0].meaning or xid_meaning(code)
        n = len(events)
        evidence = [f"Xid {code} on {pci}: {meaning} ({n} event{'s' if n > 1 else ''})"]
        evidence.extend(_uniq(e.text for e in events[:3]))
        procs: list[str] = []
        for e in events:
            who = f"{e.name or '?'}[{e.pid}]" if e.pid is not None else e.name
            if who and who not in procs:
                procs.append(who)
        if procs:
            evidence.append(f"processes: {', '.join(procs)}")
        # "Xid CODE on PCI" first: the history's identity of this finding (code and GPU) is read from it
        more = (f" (x{n})" if n > 1 else "") + (f"; processes {', '.join(procs)}" if procs else "")
        finding = make_finding(
            "GPU-HW-005",
            f"Xid {code} on {pci}: {meaning}{more}",
            evidence,
            host=ev.host,
            severity=xid_severity(code),
        )
        out.append(replace(finding, remedy=xid_remedy(code)))  # application-class Xids: the application first
    return out


@rule("GPU-HW-006")
def device_handle_unknown_error(ev: Evidence) -> list[Finding]:
    """GPU-HW-006: NVML cannot get a device handle (Unknown Error) for one or more GPUs."""
    nvml = ev.nvml
    if nvml is None:
        return []
    bad = nvml.gpus_of("handle_unknown_error")
    if nvml.error_class != "handle_unknown_error" and not bad:
        return []
    evidence = list(nvml.lines)
    if ev.facts is not None:
        evidence.extend(f"{g.label}: {g.error}" for g in bad)
    which = ", ".join(g.label for g in bad) or "a GPU (unknown bus id)"
    summary = f"NVML cannot get a device handle for {which}: Unknown Error"
    return [make_finding("GPU-HW-006", summary, _uniq(evidence), host=ev.host)]


@rule("GPU-HW-007")
def no_devices_or_init_failure(ev: Evidence) -> list[Finding]:
    """GPU-HW-007: NVML finds no devices, and/or the kernel log says RmInitAdapter failed."""
    log = ev.kernel_log
    no_devices = ev.nvml_class == "no_devices"
    if not no_devices and not log.rm_init_failures:
        return []
    parts: list[str] = []
    if no_devices:
        parts.append("No NVIDIA devices found" if ev.facts is not None else "nvidia-smi: No devices were found")
    if log.rm_init_failures:
        gpus = [f"{r.pci or 'GPU'} ({r.code})" if r.code else f"{r.pci or 'GPU'}" for r in log.rm_init_failures]
        fw = [f.path for f in log.firmware_failures if f.path]
        fw_note = f"; firmware missing: {', '.join(fw)}" if fw else ""
        parts.append(f"RmInitAdapter failed on {', '.join(dict.fromkeys(gpus))}{fw_note}")
    evidence = [
        *(ev.nvml.lines if ev.nvml is not None and ev.nvml.failed else ()),
        *(line for r in log.rm_init_failures for line in r.evidence),
        *(f.text for f in log.firmware_failures),
    ]
    return [make_finding("GPU-HW-007", "; ".join(parts), _uniq(evidence), host=ev.host)]


@rule("GPU-HW-008")
def probe_failed(ev: Evidence) -> list[Finding]:
    """GPU-HW-008: the NVIDIA probe routine failed or was not called (another driver owns the device)."""
    log = ev.kernel_log
    probes = [p for p in log.probe_failures if not (p.kind == "failed" and log.fallen_off_bus)]
    if not probes:
        return []
    parts = []
    for p in probes:
        if p.kind == "not_called":
            owners = f" (owned by {', '.join(p.conflicting_drivers)}?)" if p.conflicting_drivers else ""
            parts.append(f"probe routine not called for {p.device_count} device(s){owners}")
        elif p.kind == "failed":
            parts.append(f"probe routine failed for {p.device_count} device(s)")
        elif p.kind == "no_adapter":
            parts.append("no NVIDIA graphics adapter probed")
        else:
            parts.append(f"probe of {p.pci} failed")
    evidence = [
        *(ev.nvml.lines if ev.nvml is not None and ev.nvml.failed else ()),
        *(line for p in probes for line in p.evidence),
    ]
    summary = "NVIDIA probe failed: " + "; ".join(dict.fromkeys(parts))
    return [make_finding("GPU-HW-008", summary, _uniq(evidence), host=ev.host)]
