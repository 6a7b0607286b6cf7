"""Driver health from NVML's answer, and why it failed (GPU-DRV-00x, GPU-HW-001/006/007/008).

Every failed NVML yields at least one critical finding: the error class picks the ID, the rest of the facts
(booted kernel, modules per kernel, packages, apt history, kernel log) explain it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from remediation.checks.history import describe, last_change_of
from remediation.checks.policy import Policy
from remediation.facts import HostFacts
from remediation.findings import Finding, make_finding

__all__ = ["check_api_mismatch_log", "check_driver_drift", "check_nvml", "host_driver_version"]


def _nvml_line(facts: HostFacts) -> str:
    nvml = facts.nvml
    code = f" (code {nvml.error_code})" if nvml.error_code is not None else ""
    return f"NVML: {nvml.error_class}: {nvml.error or 'no message'}{code}"


def _modules_summary(facts: HostFacts) -> list[str]:
    with_module = [k.release for k in facts.packages.kernels if k.has_nvidia_module]
    return [
        "nvidia module present for: " + (", ".join(with_module) if with_module else "no installed kernel"),
    ]


def _driver_not_loaded(facts: HostFacts, policy: Policy) -> list[Finding]:
    host, pkgs, booted = facts.host, facts.packages, facts.system.kernel
    evidence = [_nvml_line(facts)]
    if pkgs.available and not pkgs.nvidia:
        evidence.append("no NVIDIA driver packages installed (dpkg status: no nvidia-*/libnvidia-* package)")
        return [make_finding("GPU-DRV-003", "NVIDIA driver not installed on this host", evidence, host=host)]
    kernel = facts.booted_kernel
    module_missing = kernel is not None and not kernel.has_nvidia_module
    others = [k.release for k in pkgs.kernels if k.has_nvidia_module and k.release != booted]
    if module_missing and kernel is not None:
        evidence.append(f"booted kernel {booted}; /lib/modules/{booted} has no nvidia.ko")
        evidence.extend(_modules_summary(facts))
        if kernel.dkms:
            evidence.append(
                "dkms for the booted kernel: " + ", ".join(f"{d.module} {d.version} {d.state}" for d in kernel.dkms)
            )
        elif pkgs.driver_package:
            evidence.append(f"no DKMS build of nvidia for {booted} (driver package {pkgs.driver_package})")
        if not kernel.headers_installed:
            evidence.append(f"linux-headers-{booted} not installed (DKMS cannot build the module)")
        change = last_change_of(facts.apt_history, [kernel.image_package])
        if change is not None:
            evidence.append(describe(*change))
            evidence.extend(line for line in change[0].text if line.startswith(("Commandline:", "Requested-By:")))
        for missing in facts.kernel_log.module_missing:
            evidence.append(f"kernel log: {missing.text}")
        summary = f"NVIDIA driver not loaded: booted kernel {booted} has no NVIDIA module"
        if others:
            summary += f" (module present for {', '.join(others)})"
        return [make_finding("GPU-DRV-001", summary, evidence, host=host)]
    # The module exists for the booted kernel (or we cannot tell) and still is not loaded: the kernel log says why.
    findings: list[Finding] = []
    log = facts.kernel_log
    if log.probe_failures:
        findings.append(
            make_finding(
                "GPU-HW-008",
                "NVIDIA probe routine failed or was not called",
                evidence + [line for p in log.probe_failures for line in p.evidence],
                host=host,
            )
        )
    if log.rm_init_failures:
        findings.append(
            make_finding(
                "GPU-HW-007",
                "RmInitAdapter failed: the driver could not initialise the GPU",
                evidence + [line for r in log.rm_init_failures for line in r.evidence],
                host=host,
            )
        )
    if not findings:
        if kernel is None:
            evidence.append(f"booted kernel {booted} is not a dpkg-installed kernel package; module state unknown")
        else:
            evidence.append(f"booted kernel {booted} has an nvidia module: {kernel.nvidia_module.path}")
        if not pkgs.available:
            evidence.append(f"package database not read: {pkgs.error}")
        evidence.extend(f"kernel log: {m.text}" for m in log.module_missing)
        findings.append(
            make_finding(
                "GPU-DRV-004", "NVIDIA driver not loaded although a module exists; cause unknown", evidence, host=host
            )
        )
    return findings


def _loaded_module_version(facts: HostFacts) -> tuple[str | None, str]:
    mismatches = facts.kernel_log.api_mismatches
    if mismatches:
        return mismatches[-1].module_version, "kernel log API mismatch"
    kernel = facts.booted_kernel
    if kernel is not None and kernel.nvidia_module.version:
        return kernel.nvidia_module.version, f"module file {kernel.nvidia_module.path}"
    return None, "unknown"


def _version_mismatch(facts: HostFacts) -> list[Finding]:
    pkgs = facts.packages
    evidence = [_nvml_line(facts)]
    userspace = pkgs.driver_package_version
    module, source = _loaded_module_version(facts)
    evidence.append(
        f"userspace driver {userspace or '?'} ({pkgs.driver_package or 'no driver package'}) vs loaded kernel module "
        f"{module or '?'} ({source})"
    )
    for mismatch in facts.kernel_log.api_mismatches[-1:]:
        evidence.extend(mismatch.evidence)
    changes = facts.apt_history.nvidia_changes()
    if changes:
        tx = changes[-1][0]
        for tx_, action in changes:
            if tx_ is tx:
                evidence.append(describe(tx_, action))
    summary = f"Driver/library version mismatch: userspace {userspace or '?'}, kernel module {module or '?'}"
    return [make_finding("GPU-DRV-002", summary, evidence, host=facts.host)]


def _lost(facts: HostFacts) -> list[Finding]:
    evidence = [_nvml_line(facts)]
    lost = [g for g in facts.nvml.gpus if g.error_class == "gpu_lost"]
    evidence.extend(f"{g.label}: {g.error}" for g in lost)
    for fell in facts.kernel_log.fallen_off_bus:
        evidence.extend(fell.evidence)
    evidence.append("hardware/platform fault, not a driver problem: do not reinstall the driver")
    which = ", ".join(g.label for g in lost) or "a GPU"
    return [
        make_finding(
            "GPU-HW-001", f"{which} lost (fallen off the bus): not a driver problem", evidence, host=facts.host
        )
    ]


def check_nvml(facts: HostFacts, policy: Policy) -> list[Finding]:
    """One or more findings for a failed NVML; none when NVML answered."""
    nvml = facts.nvml
    if nvml.ok:
        return []
    cls = nvml.error_class
    host = facts.host
    if cls == "driver_not_loaded":
        return _driver_not_loaded(facts, policy)
    if cls == "version_mismatch":
        return _version_mismatch(facts)
    if cls == "gpu_lost":
        return _lost(facts)
    if cls == "timeout":
        evidence = [_nvml_line(facts)]
        if nvml.child_reaped is False:
            evidence.append("the probe's NVML child could not be reaped after SIGKILL (stuck in the driver)")
        return [make_finding("GPU-DRV-006", "NVML hung: the probe's NVML call timed out", evidence, host=host)]
    if cls == "library_not_found":
        evidence = [_nvml_line(facts), "libnvidia-ml.so.1 could not be loaded"]
        if facts.packages.nvidia:
            evidence.append(
                "NVIDIA packages are installed ("
                + ", ".join(f"{n} {v}" for n, v in facts.packages.nvidia[:6])
                + ") but the NVML library is missing"
            )
        else:
            evidence.append("no NVIDIA driver packages installed")
        return [make_finding("GPU-DRV-003", "NVIDIA driver not installed: libnvidia-ml not found", evidence, host=host)]
    if cls == "handle_unknown_error":
        bad = [g for g in nvml.gpus if g.error_class == "handle_unknown_error"]
        evidence = [_nvml_line(facts)] + [f"{g.label}: {g.error}" for g in bad]
        return [make_finding("GPU-HW-006", "NVML cannot get a device handle: Unknown Error", evidence, host=host)]
    if cls == "no_devices":
        evidence = [_nvml_line(facts)]
        for failure in facts.kernel_log.rm_init_failures:
            evidence.extend(failure.evidence)
        return [make_finding("GPU-HW-007", "No NVIDIA devices found", evidence, host=host)]
    return [make_finding("GPU-DRV-004", "NVML failed to initialise, cause unknown", [_nvml_line(facts)], host=host)]


def check_api_mismatch_log(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-DRV-007: API mismatch lines in the kernel log while NVML itself did not report a mismatch."""
    if facts.nvml.error_class == "version_mismatch" or not facts.kernel_log.api_mismatches:
        return []
    last = facts.kernel_log.api_mismatches[-1]
    summary = f"Kernel log: NVIDIA client {last.client_version} vs kernel module {last.module_version}"
    return [make_finding("GPU-DRV-007", summary, last.evidence, host=facts.host)]


def host_driver_version(facts: HostFacts) -> tuple[str | None, str]:
    """The host's driver version and where it came from: NVML when it answered, else the driver package."""
    if facts.nvml.driver_version:
        return facts.nvml.driver_version, "NVML"
    if facts.packages.driver_package_version:
        return facts.packages.driver_package_version, f"package {facts.packages.driver_package}"
    return None, "unknown"


def check_driver_drift(all_facts: Mapping[str, HostFacts], policy: Policy) -> dict[str, list[Finding]]:
    """GPU-DRV-005 per host whose driver differs from the policy's version, else from the fleet's strict majority."""
    versions = {host: host_driver_version(f) for host, f in all_facts.items()}
    known = {h: v for h, (v, _) in versions.items() if v}
    expected = policy.expected_driver_version
    basis = "policy expected_driver_version"
    if expected is None:
        counts = Counter(known.values())
        if not counts:
            return {}
        (top, n), *rest = counts.most_common()
        if (rest and rest[0][1] == n) or n * 2 <= len(known):
            return {}  # no strict majority: nothing to drift from
        expected, basis = top, f"fleet majority ({n} of {len(known)} hosts)"
    out: dict[str, list[Finding]] = {}
    for host, version in known.items():
        if version == expected:
            continue
        source = versions[host][1]
        evidence = [f"driver {version} ({source}); expected {expected} ({basis})"]
        out[host] = [
            make_finding("GPU-DRV-005", f"Driver {version} differs from expected {expected}", evidence, host=host)
        ]
    return out
