"""DKMS (GPU-DKMS-001): a module DKMS did not build for a kernel.

One finding per (module, version, kernel) build failure, and one per kernel DKMS skipped (headers missing), from
DKMS's output (``dkms status``, a build log, a package manager's transcript). A ``dkms status`` alone (the audit's
facts) lists what is installed and never fails a build, so it gives none.
"""

from __future__ import annotations

from remediation.core.checks.evidence import Evidence
from remediation.core.checks.registry import rule
from remediation.core.findings import Finding, make_finding

__all__ = ["dkms_not_built"]


@rule("GPU-DKMS-001")
def dkms_not_built(ev: Evidence) -> list[Finding]:
    """GPU-DKMS-001: DKMS failed to build a module for a kernel, or skipped the kernel."""
    dkms = ev.dkms
    if dkms is None:
        return []
    findings: list[Finding] = []
    seen: set[tuple[str | None, str | None, str | None]] = set()
    for f in dkms.build_failures:
        key = (f.module, f.version, f.kernel)
        if key in seen:
            continue
        seen.add(key)
        what = f"{f.module or 'module'} {f.version or ''}".strip()
        findings.append(
            make_finding(
                "GPU-DKMS-001",
                f"DKMS build of {what} failed for kernel {f.kernel or 'unknown'}: {f.reason}",
                f.evidence,
                host=ev.host,
            )
        )
    for s in dkms.skipped_kernels:
        what = f"{s.module or 'module'} {s.version or ''}".strip()
        findings.append(
            make_finding(
                "GPU-DKMS-001",
                f"DKMS did not build {what} for kernel {s.kernel}: {s.reason}",
                (s.text,),
                host=ev.host,
            )
        )
    return findings
