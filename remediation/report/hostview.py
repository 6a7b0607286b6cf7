"""What every output format says about one host, derived once from its facts and findings.

The table, the Prometheus textfile and the incident report all show the same few derived values (is the booted
kernel held, which driver version, how many GPUs answered, the hottest GPU); they are computed here so the formats
cannot disagree. Everything is a pure function of :class:`~remediation.core.facts.HostFacts` /
:class:`~remediation.host.audit.HostAudit`; ``None`` means "not known" (host not probed, NVML down, field missing),
never zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from remediation.core.facts import GpuFacts, HostFacts
from remediation.core.findings import Finding, Severity

if TYPE_CHECKING:
    from remediation.host.audit import HostAudit

__all__ = [
    "DriverVersion",
    "booted_kernel_held",
    "by_severity",
    "driver_version",
    "expected_gpus",
    "expected_gpus_from_vars",
    "gpus_ok",
    "max_temperature",
    "remap_pending",
    "severity_order",
]

# GPU-HW-002's evidence: "NVML device count 3, expected 4"
_EXPECTED_IN_EVIDENCE = re.compile(r"\bexpected (\d+)\b")


@dataclass(frozen=True)
class DriverVersion:
    """The NVIDIA driver version and where it was read: ``nvml`` (the loaded driver answered) or ``package``
    (the dpkg driver package: installed, but not proven loaded because NVML did not answer)."""

    version: str
    source: str  # "nvml" | "package"

    @property
    def from_nvml(self) -> bool:
        return self.source == "nvml"


def booted_kernel_held(facts: HostFacts) -> bool | None:
    """True when the booted kernel's image package (``linux-image-<uname -r>`` when dpkg does not list the
    kernel) is on hold (``apt-mark hold``); None when unknown (package database not read, kernel unknown)."""
    release = facts.system.kernel
    if not facts.packages.available or not release:
        return None
    images = {f"linux-image-{release}"}
    if facts.booted_kernel is not None:
        images.add(facts.booted_kernel.image_package)
    return bool(images & facts.packages.held)


def remap_pending(gpu: GpuFacts) -> bool | None:
    """A row remap (or, on older GPUs, a page retirement) is waiting for a GPU reset; None when not reported."""
    if gpu.remapped_rows is not None:
        return gpu.remapped_rows.pending
    if gpu.retired_pages is not None:
        return gpu.retired_pages.pending
    return None


def driver_version(facts: HostFacts) -> DriverVersion | None:
    """NVML's driver version when NVML answered, else the driver package's version, else None."""
    if facts.nvml.driver_version:
        return DriverVersion(facts.nvml.driver_version, "nvml")
    if facts.packages.available and facts.packages.driver_package_version:
        return DriverVersion(facts.packages.driver_package_version, "package")
    return None


def gpus_ok(facts: HostFacts) -> int:
    """GPUs NVML answered for (``ok`` True); 0 when NVML failed to initialise."""
    return sum(1 for g in facts.nvml.gpus if g.ok)


def max_temperature(facts: HostFacts) -> int | None:
    """The hottest GPU's temperature in °C, or None when no GPU reported one."""
    temps = [g.temperature_c for g in facts.nvml.gpus if g.ok and g.temperature_c is not None]
    return max(temps) if temps else None


def expected_gpus_from_vars(host_vars: Mapping[str, Any]) -> int | None:
    """``gpu_expected_count`` from the inventory, else the GPU count of ``azure_vm_size``, else None."""
    value = host_vars.get("gpu_expected_count")
    if value not in (None, ""):
        try:
            return int(value)
        except (TypeError, ValueError):
            return None
    from remediation.core.skus import expected_gpu_count

    size = host_vars.get("azure_vm_size")
    return expected_gpu_count(str(size)) if size else None


def expected_gpus(audit: HostAudit) -> int | None:
    """GPUs the host should have: inventory vars first, then the GPU-HW-002 finding's evidence."""
    from_vars = expected_gpus_from_vars(audit.vars)
    if from_vars is not None:
        return from_vars
    for finding in audit.findings:
        if finding.id != "GPU-HW-002":
            continue
        for line in finding.evidence:
            if m := _EXPECTED_IN_EVIDENCE.search(line):
                return int(m.group(1))
    return None


def severity_order(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first; the checks' order is kept within a severity."""
    return sorted(findings, key=lambda f: -f.severity.rank)


def by_severity(findings: Iterable[Finding]) -> dict[Severity, int]:
    """Count per severity, every severity present (critical, warning, info order)."""
    counts = {Severity.CRITICAL: 0, Severity.WARNING: 0, Severity.INFO: 0}
    for f in findings:
        counts[f.severity] += 1
    return counts
