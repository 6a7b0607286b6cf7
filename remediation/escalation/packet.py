"""The escalation packet: everything a person (or Azure support) needs about one host's finding, in one document.

A packet (schema ``gpufleet.escalation/1``) holds:

- the finding (ID, severity, summary, evidence, remedy) and its dedupe key (:func:`remediation.escalation.page.
  dedupe_key`: the same key the page carries);
- the host's evidence from the audit's facts (:class:`~remediation.core.facts.HostFacts`): the booted system and
  its boot ID, NVML's answer and every GPU's identity and health counters (ECC, retired pages, remapped rows), the
  kernel log's Xid and fallen-off-the-bus lines, ``dkms status``, the held packages, the NVIDIA packages, Secure
  Boot, and the probe sections that failed. Every list and text is bounded;
- the incident report (Markdown), when the caller rendered one;
- an Azure **Guest Health Reporting** request: the body of ``PUT /subscriptions/{sub}/providers/Microsoft.Impact/
  workloadImpacts/{name}?api-version=2023-02-01-preview`` with ``impactCategory`` mapped from the finding
  (:func:`impact_category`), ``impactedResourceId`` (the VM's resource ID, from the inventory), ``startDateTime``,
  ``impactDescription`` and ``additionalProperties`` (``PhysicalHostName``, ``VmUniqueId`` when known). The
  workload impact's name is derived from the dedupe key, so filing the same packet twice is the same PUT. The
  packet only carries the request; filing it is the caller's decision.

Impact categories are the documented ones (learn.microsoft.com, "Impact categories for Guest Health Reporting
(preview)"; every HPC category starts ``Resource.Hpc``). Our hardware findings map to the specific categories; a
finding with no matching category gets ``Resource.Hpc.Unhealthy.HpcGenericFailure`` ("Issue doesn't fall into any
other category"). Only the hardware findings (GPU-HW-*, and an NVML that hangs) are marked ``file_with_azure``:
a driver, kernel or configuration finding is ours to fix on the host, not a node for Azure to take out of
production.

:func:`write_packet` writes the packet as a directory (``packet.json``, ``guest-health-report.json``,
``incident.md``) and, if asked, one ``.tar.gz`` of it.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import io
import json
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remediation.core.durable import write_atomic
from remediation.core.facts import GpuFacts, HostFacts
from remediation.core.findings import Finding
from remediation.escalation import EscalationError
from remediation.escalation.page import dedupe_key

__all__ = [
    "GENERIC_CATEGORY",
    "GHR_API_VERSION",
    "IMPACT_CATEGORIES",
    "XID_CATEGORIES",
    "Impact",
    "build_packet",
    "evidence_of",
    "guest_health_report",
    "impact_category",
    "write_packet",
]

SCHEMA = "gpufleet.escalation/1"
GHR_API_VERSION = "2023-02-01-preview"
GENERIC_CATEGORY = "Resource.Hpc.Unhealthy.HpcGenericFailure"
XID_OTHER_CATEGORY = "Resource.Hpc.Unhealthy.GpuXIDError"  # "a Xid error other than 48, 79, 94, or 95"
#: Xid codes with a category of their own.
XID_CATEGORIES = {
    48: "Resource.Hpc.Unhealthy.XID48DoubleBitECC",
    79: "Resource.Hpc.Unhealthy.XID79FallenOffBus",
    94: "Resource.Hpc.Unhealthy.XID94ContainedECCError",
    95: "Resource.Hpc.Unhealthy.XID95UncontainedECCError",
}
#: Finding ID -> impact category, for the findings whose category does not depend on their evidence.
IMPACT_CATEGORIES = {
    "GPU-HW-001": XID_CATEGORIES[79],  # the GPU fell off the bus
    "GPU-HW-002": "Resource.Hpc.Unhealthy.HpcMissingGpu",  # fewer GPUs than the SKU has
    "GPU-HW-007": "Resource.Hpc.Unhealthy.HpcMissingGpu",  # no devices found / RmInitAdapter failed
    "GPU-DRV-006": "Resource.Hpc.Unhealthy.UnhealthyGPUNvidiasmi",  # NVML (what nvidia-smi uses) hangs
}
ROW_REMAP_CATEGORY = "Resource.Hpc.Unhealthy.HpcRowRemapFailure"
DBE_CATEGORY = "Resource.Hpc.Unhealthy.DBEOverLimit"
RETIREMENT_CATEGORY = "Resource.Hpc.Unhealthy.ECCPageRetirementTableFull"
_XID_SUMMARY = re.compile(r"^Xid (\d{1,4}) on ")
MAX_LINES = 200
MAX_TEXT = 16 * 1024


@dataclass(frozen=True)
class Impact:
    category: str
    file_with_azure: bool  # a platform (hardware) fault Azure should take the node out for
    why: str


def impact_category(finding: Finding) -> Impact:
    """The Guest Health Reporting category of ``finding`` (see the module's docstring)."""
    fid = finding.id
    if fid in IMPACT_CATEGORIES:
        return Impact(IMPACT_CATEGORIES[fid], True, f"{fid} maps to {IMPACT_CATEGORIES[fid]}")
    if fid == "GPU-HW-005":
        match = _XID_SUMMARY.match(finding.summary)
        if match is None:
            return Impact(XID_OTHER_CATEGORY, True, "GPU-HW-005 without a readable Xid code")
        code = int(match.group(1))
        category = XID_CATEGORIES.get(code, XID_OTHER_CATEGORY)
        return Impact(category, True, f"GPU-HW-005 for Xid {code}")
    if fid == "GPU-HW-004":
        text = " ".join((finding.summary, *finding.evidence)).lower()
        if "row remap" in text or "rows remapped" in text:
            return Impact(ROW_REMAP_CATEGORY, True, "GPU-HW-004: row remapping pending, failed or past its limit")
        if "double-bit retired pages" in text:
            return Impact(DBE_CATEGORY, True, "GPU-HW-004: double-bit retired pages past DCGM's limit")
        return Impact(RETIREMENT_CATEGORY, True, "GPU-HW-004: retired pages past DCGM's limit")
    if fid.startswith("GPU-HW-"):
        return Impact(GENERIC_CATEGORY, True, f"{fid}: a GPU hardware fault with no category of its own")
    return Impact(GENERIC_CATEGORY, False,
                  f"{fid} is not a platform fault: fix it on the host; file with Azure only if a person decides to")


def _utc(moment: _dt.datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("times must be timezone-aware")
    return moment.astimezone(_dt.UTC).isoformat().replace("+00:00", "Z")


def _subscription(resource_id: str | None) -> str | None:
    match = re.match(r"^/subscriptions/([^/]+)/resourceGroups/[^/]+/providers/Microsoft\.Compute/virtualMachines/"
                     r"[^/]+$", resource_id or "", re.I)
    return match.group(1) if match else None


def guest_health_report(
    finding: Finding,
    *,
    key: str,
    resource_id: str | None,
    start: _dt.datetime,
    physical_host_name: str | None = None,
    vm_unique_id: str | None = None,
) -> dict[str, Any]:
    """The Guest Health Reporting request for ``finding``: method, path, api-version, body, and the category's why."""
    impact = impact_category(finding)
    additional = {k: v for k, v in (("PhysicalHostName", physical_host_name), ("VmUniqueId", vm_unique_id)) if v}
    body: dict[str, Any] = {
        "properties": {
            "startDateTime": _utc(start),
            "impactCategory": impact.category,
            "impactDescription": f"{finding.id}: {finding.summary}"[:500],
            "impactedResourceId": resource_id,
        }
    }
    if additional:
        body["properties"]["additionalProperties"] = additional
    subscription = _subscription(resource_id)
    name = f"gpufleet-{key}"
    return {
        "file_with_azure": impact.file_with_azure,
        "why": impact.why,
        "method": "PUT",
        "path": f"/subscriptions/{subscription}/providers/Microsoft.Impact/workloadImpacts/{name}"
        if subscription else None,
        "api_version": GHR_API_VERSION,
        "body": body,
        "missing": [] if subscription else ["the VM's resource ID (inventory variable azure_vm_resource_id)"],
    }


def _bounded(lines: Sequence[str]) -> list[str]:
    out = [line[:2000] for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        out.append(f"... {len(lines) - MAX_LINES} more")
    return out


def _text(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "\n... (truncated)"


def _gpu(gpu: GpuFacts) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "ok": gpu.ok,
        "error_class": gpu.error_class,
        "error": gpu.error,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "serial": gpu.serial,
        "temperature_c": gpu.temperature_c,
        "ecc_mode": gpu.ecc_mode,
        "ecc_volatile": {"corrected": gpu.ecc_volatile.corrected, "uncorrected": gpu.ecc_volatile.uncorrected},
        "ecc_aggregate": {"corrected": gpu.ecc_aggregate.corrected, "uncorrected": gpu.ecc_aggregate.uncorrected},
        "retired_pages": None if gpu.retired_pages is None else {
            "single_bit": gpu.retired_pages.single_bit,
            "double_bit": gpu.retired_pages.double_bit,
            "pending": gpu.retired_pages.pending,
        },
        "remapped_rows": None if gpu.remapped_rows is None else {
            "correctable": gpu.remapped_rows.correctable,
            "uncorrectable": gpu.remapped_rows.uncorrectable,
            "pending": gpu.remapped_rows.pending,
            "failure": gpu.remapped_rows.failure,
        },
        "persistence_mode": gpu.persistence_mode,
    }


def evidence_of(facts: HostFacts) -> dict[str, Any]:
    """The host's evidence, from its facts, as a JSON-ready object."""
    sysf, nvml, pkgs, log = facts.system, facts.nvml, facts.packages, facts.kernel_log
    xid_lines = [e.text for e in log.xid_events]
    for fall in log.fallen_off_bus:
        xid_lines.extend(line for line in fall.evidence if line not in xid_lines)
    return {
        "collected_at": facts.collected_at.isoformat() if facts.collected_at else None,
        "system": {
            "hostname": facts.hostname,
            "kernel": sysf.kernel,
            "boot_id": sysf.boot_id,
            "boot_time": sysf.boot_time.isoformat() if sysf.boot_time else None,
            "os": sysf.os_pretty_name,
            "secure_boot": facts.secure_boot.state,
        },
        "nvml": {
            "ok": nvml.ok,
            "error_class": nvml.error_class,
            "error": nvml.error,
            "driver_version": nvml.driver_version,
            "cuda_driver_version": nvml.cuda_driver_version,
            "device_count": nvml.device_count,
            "gpus": [_gpu(g) for g in nvml.gpus],
        },
        "xid_lines": _bounded(xid_lines),
        "kernel_log_source": facts.kernel_log_source,
        "dkms_status": _text(facts.dkms_status),
        "holds": sorted(pkgs.held),
        "driver_package": pkgs.driver_package,
        "driver_package_version": pkgs.driver_package_version,
        "nvidia_packages": [f"{name} {version}" for name, version in pkgs.nvidia][:MAX_LINES],
        "probe_errors": [f"{e.section}: {e.error}" for e in facts.errors][:MAX_LINES],
    }


def build_packet(
    finding: Finding,
    facts: HostFacts | None,
    *,
    now: _dt.datetime,
    resource_id: str | None = None,
    incident_markdown: str | None = None,
    discriminator: str = "",
    physical_host_name: str | None = None,
    vm_unique_id: str | None = None,
) -> dict[str, Any]:
    """The packet for ``finding`` on its host (``facts`` None: the host could not be probed; the packet says so)."""
    host = finding.host or (facts.host if facts is not None else None)
    if not host:
        raise EscalationError(f"finding {finding.id}: no host to build a packet for")
    boot_id = facts.system.boot_id if facts is not None else None
    key = dedupe_key(host, finding.id, boot_id, discriminator)
    start = facts.collected_at if facts is not None and facts.collected_at is not None else now
    return {
        "schema": SCHEMA,
        "host": host,
        "created_at": _utc(now),
        "dedupe_key": key,
        "boot_id": boot_id,
        "finding": finding.to_dict(),
        "evidence": evidence_of(facts) if facts is not None else None,
        "evidence_missing": None if facts is not None else "the host's facts could not be collected",
        "incident_report": incident_markdown,
        "guest_health_report": guest_health_report(
            finding, key=key, resource_id=resource_id, start=start, physical_host_name=physical_host_name,
            vm_unique_id=vm_unique_id,
        ),
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip("._-")[:80] or "_"  # never hidden, never ".."


def write_packet(packet: dict[str, Any], directory: Path, tarball: bool = False) -> Path:
    """Write ``packet`` under ``directory`` as ``<host>-<finding>-<key>/`` (and ``.tar.gz`` when asked); returns
    the packet's directory (or the tarball)."""
    name = _safe(f"{packet['host']}-{packet['finding']['id']}-{packet['dedupe_key']}")
    out = directory / name
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "packet.json": json.dumps(packet, indent=2, sort_keys=True) + "\n",
        "guest-health-report.json": json.dumps(packet["guest_health_report"], indent=2, sort_keys=True) + "\n",
    }
    if packet.get("incident_report"):
        files["incident.md"] = str(packet["incident_report"])
    for filename, text in files.items():
        write_atomic(out / filename, text)
    if not tarball:
        return out
    target = directory / f"{name}.tar.gz"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for filename, text in sorted(files.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"{name}/{filename}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    # gzip's header carries a timestamp (tarfile's "w:gz" stamps the current second); pin it so the same packet
    # gives the same bytes whenever it is written.
    target.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return target
