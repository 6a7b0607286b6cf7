"""The NVIDIA driver (GPU-DRV-00x): NVML's error class picks the ID; the rest of the evidence explains it.

Each rule reads NVML's answer the same way whether it came from the probe or from pasted text
(:class:`~remediation.core.checks.evidence.Evidence`); a host's facts (booted kernel, modules per kernel, packages, apt
history) make the evidence richer, a transcript's lines (``modprobe: FATAL``, ``uname -r``, ``find /lib/modules``)
stand in for them in text.

- GPU-DRV-001: NVML says the driver is not loaded (or, where NVML's state is not known, the kernel log or a
  transcript says ``Module nvidia not found``, or ``dkms status`` lists the NVIDIA module built/installed only for
  other kernels than the running one that ``uname -r`` or modprobe's ``/lib/modules/KERNEL`` names) and the booted
  kernel has no NVIDIA module, or whether it has one is not known (text: the summary says whether the text proves
  it). Not when the driver is not installed at all (GPU-DRV-003) or the module exists (the kernel log explains it:
  GPU-HW-007/008, else GPU-DRV-004).
- GPU-DRV-002: NVML version mismatch; the kernel log's API mismatch lines are its evidence.
- GPU-DRV-003: NVML's library is missing, or the driver is not loaded and no NVIDIA package is installed.
- GPU-DRV-004: NVML failed for a reason no class covers, or NVML failed and no other rule found a critical
  cause (a host whose NVML failed never comes out healthy).
- GPU-DRV-006: the probe's NVML call hung.
- GPU-DRV-007: API mismatch lines in the kernel log while NVML did not report a mismatch (or NVML's state is not
  known): one finding listing every distinct client/module pair.
- GPU-DRV-008: the booted kernel HAS an NVIDIA module but Secure Boot refuses it: the probe found it unsigned on a
  host with Secure Boot on, or the kernel log says so (``Key was rejected by service``, ``Lockdown: ...: unsigned
  module loading is restricted``); in text, those lines (with NVML failing, or NVML's state not known).
- GPU-DRV-005 (fleet): a host's driver differs from the policy's version, else from the fleet's strict majority.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from remediation.core.checks.evidence import Evidence
from remediation.core.checks.history import describe, last_change_of
from remediation.core.checks.policy import Policy
from remediation.core.checks.registry import fleet_rule, rule
from remediation.core.facts import HostFacts
from remediation.core.findings import Finding, Severity, make_finding
from remediation.core.kernelflavour import is_branch, signed_module_package

__all__ = [
    "api_mismatch_in_kernel_log",
    "driver_drift",
    "driver_not_installed",
    "driver_not_loaded",
    "host_driver_version",
    "module_rejected_by_secure_boot",
    "nvml_failed_cause_unknown",
    "nvml_hung",
    "version_mismatch",
]


def _uniq(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(line for line in lines if line))


def _nvml_lines(ev: Evidence) -> list[str]:
    return list(ev.nvml.lines) if ev.nvml is not None else []


def _modules_summary(facts: HostFacts) -> list[str]:
    with_module = [k.release for k in facts.packages.kernels if k.has_nvidia_module]
    return [
        "nvidia module present for: " + (", ".join(with_module) if with_module else "no installed kernel"),
    ]


def _driver_absent(facts: HostFacts) -> bool:
    return facts.packages.available and not facts.packages.nvidia


@rule("GPU-DRV-001")
def driver_not_loaded(ev: Evidence) -> list[Finding]:
    """GPU-DRV-001: the driver is not loaded because the booted kernel has no NVIDIA module."""
    nvml = ev.nvml
    log_missing = [m for m in ev.kernel_log.module_missing if m.module.startswith("nvidia")]
    transcript = ev.transcript
    text_missing = transcript is not None and transcript.module_missing
    if nvml is not None and nvml.error_class != "driver_not_loaded":
        return []  # NVML answered, or failed for another reason: that reason's rule
    dkms_kernels, dkms_lines = _dkms_nvidia_kernels(ev)
    running = transcript.running_kernel if transcript is not None else None
    # text: dkms built/installed the module only for other kernels than the running one (uname -r, modprobe's path)
    dkms_elsewhere = ev.facts is None and bool(running and dkms_kernels) and running not in dkms_kernels
    if nvml is None and not log_missing and not text_missing and not dkms_elsewhere:
        return []
    if ev.kernel_log.nvidia_rejected and not log_missing and not text_missing:
        return []  # the module exists and Secure Boot refused it: GPU-DRV-008
    facts = ev.facts
    if facts is not None:
        if _driver_absent(facts):
            return []  # GPU-DRV-003
        kernel = facts.booted_kernel
        if kernel is None or kernel.has_nvidia_module:
            return []  # the module exists (or the kernel is no package): the kernel log says why, else DRV-004
        booted = facts.system.kernel
        evidence = _nvml_lines(ev)
        evidence.append(f"booted kernel {booted}; /lib/modules/{booted} has no nvidia.ko")
        evidence.extend(_modules_summary(facts))
        pkgs = facts.packages
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
        evidence.extend(f"kernel log: {m.text}" for m in ev.kernel_log.module_missing)
        others = [k.release for k in pkgs.kernels if k.has_nvidia_module and k.release != booted]
        summary = f"NVIDIA driver not loaded: booted kernel {booted} has no NVIDIA module"
        if others:
            summary += f" (module present for {', '.join(others)})"
        return [make_finding("GPU-DRV-001", summary, evidence, host=ev.host)]
    # Text: what the transcript and the kernel lines prove.
    module_kernels = transcript.module_kernels if transcript is not None else ()
    if not text_missing and not log_missing and running and (running in module_kernels or running in dkms_kernels):
        return []  # the booted kernel has a module: not this cause (GPU-DRV-004 says so)
    evidence = [*_nvml_lines(ev), *(m.text for m in log_missing)]
    if dkms_elsewhere:
        evidence.append(f"running kernel: {running}")
        evidence.extend(dkms_lines)
    if dkms_elsewhere and not text_missing:
        state = "not loaded" if nvml is not None else "cannot load"
        summary = (
            f"NVIDIA driver {state}: the running kernel {running} has no NVIDIA module; dkms built it only for "
            f"{', '.join(dkms_kernels)}"
        )
    elif transcript is not None and text_missing:
        booted_name = running or "the booted kernel"
        where = ""
        if module_kernels and running not in module_kernels:
            where = f"; nvidia.ko exists only for {', '.join(module_kernels)}"
        elif dkms_elsewhere:
            where = f"; dkms built it only for {', '.join(dkms_kernels)}"
        dkms_note = "; dkms is not installed, so nothing rebuilt the module" if transcript.dkms_missing else ""
        summary = f"NVIDIA driver not loaded: no NVIDIA module for {booted_name} (modprobe: FATAL){where}{dkms_note}"
    elif log_missing:
        kernels = ", ".join(dict.fromkeys(m.kernel for m in log_missing if m.kernel)) or "the booted kernel"
        summary = f"NVIDIA driver not loaded: NVIDIA module not found for {kernels}, the driver cannot load"
    else:
        summary = (
            "NVIDIA driver not loaded (nvidia-smi, NVML or CUDA cannot communicate with the driver); usual cause to "
            "confirm: the booted kernel has no NVIDIA module (`modinfo nvidia`, `uname -r`, apt history)"
        )
    return [make_finding("GPU-DRV-001", summary, _uniq(evidence), host=ev.host)]


def _dkms_nvidia_kernels(ev: Evidence) -> tuple[tuple[str, ...], list[str]]:
    """Kernels ``dkms status`` lists an NVIDIA module built or installed for, and those rows (text evidence)."""
    if ev.dkms is None:
        return (), []
    rows = [
        e
        for e in ev.dkms.entries
        if e.kernel and e.module.startswith("nvidia") and e.state.startswith(("installed", "built"))
    ]
    return tuple(dict.fromkeys(str(e.kernel) for e in rows)), [f"dkms status: {e.text.strip()}" for e in rows]


def _loaded_module_version(ev: Evidence, facts: HostFacts) -> tuple[str | None, str]:
    mismatches = ev.kernel_log.api_mismatches
    if mismatches:
        return mismatches[-1].module_version, "kernel log API mismatch"
    kernel = facts.booted_kernel
    if kernel is not None and kernel.nvidia_module.version:
        return kernel.nvidia_module.version, f"module file {kernel.nvidia_module.path}"
    return None, "unknown"


@rule("GPU-DRV-002")
def version_mismatch(ev: Evidence) -> list[Finding]:
    """GPU-DRV-002: NVML's driver/library version mismatch, with the kernel log's API mismatch lines."""
    if ev.nvml_class != "version_mismatch" or ev.nvml is None:
        return []
    nvml = ev.nvml
    evidence = _nvml_lines(ev)
    facts = ev.facts
    if facts is not None:
        pkgs = facts.packages
        userspace = pkgs.driver_package_version
        module, source = _loaded_module_version(ev, facts)
        evidence.append(
            f"userspace driver {userspace or '?'} ({pkgs.driver_package or 'no driver package'}) vs loaded kernel "
            f"module {module or '?'} ({source})"
        )
        for mismatch in ev.kernel_log.api_mismatches[-1:]:
            evidence.extend(mismatch.evidence)
        changes = facts.apt_history.nvidia_changes()
        if changes:
            tx = changes[-1][0]
            evidence.extend(describe(tx_, action) for tx_, action in changes if tx_ is tx)
        summary = f"Driver/library version mismatch: userspace {userspace or '?'}, kernel module {module or '?'}"
        return [make_finding("GPU-DRV-002", summary, evidence, host=ev.host)]
    pairs = ev.kernel_log.api_mismatches
    evidence.extend(line for a in pairs for line in a.evidence)
    lib = f" (NVML library {nvml.library_version})" if nvml.library_version else ""
    if pairs:
        lib += f"; kernel module {pairs[-1].module_version}, client {pairs[-1].client_version}"
    via = f"; container service {nvml.service} cannot start" if nvml.service else ""
    summary = f"Driver/library version mismatch{lib}: userspace differs from the loaded kernel module{via}"
    return [make_finding("GPU-DRV-002", summary, _uniq(evidence), host=ev.host)]


@rule("GPU-DRV-003")
def driver_not_installed(ev: Evidence) -> list[Finding]:
    """GPU-DRV-003: NVML's library is missing, or the driver is not loaded and no NVIDIA package is installed."""
    cls = ev.nvml_class
    facts = ev.facts
    evidence = _nvml_lines(ev)
    if cls == "driver_not_loaded" and facts is not None and _driver_absent(facts):
        evidence.append("no NVIDIA driver packages installed (dpkg status: no nvidia-*/libnvidia-* package)")
        return [make_finding("GPU-DRV-003", "NVIDIA driver not installed on this host", evidence, host=ev.host)]
    if cls != "library_not_found":
        return []
    if facts is not None:
        evidence.append("libnvidia-ml.so.1 could not be loaded")
        if facts.packages.nvidia:
            evidence.append(
                "NVIDIA packages are installed ("
                + ", ".join(f"{n} {v}" for n, v in facts.packages.nvidia[:6])
                + ") but the NVML library is missing"
            )
        else:
            evidence.append("no NVIDIA driver packages installed")
    summary = "NVIDIA driver not installed: libnvidia-ml not found"
    return [make_finding("GPU-DRV-003", summary, evidence, host=ev.host)]


_EXPLAINED = frozenset(
    {"driver_not_loaded", "version_mismatch", "library_not_found", "gpu_lost", "handle_unknown_error", "no_devices"}
)


@rule("GPU-DRV-004", final=True)
def nvml_failed_cause_unknown(ev: Evidence, found: Sequence[Finding]) -> list[Finding]:
    """GPU-DRV-004: NVML failed for a reason no class covers, or failed and no other rule found a critical cause."""
    nvml = ev.nvml
    if nvml is None or nvml.answered:
        return []
    facts = ev.facts
    evidence = _nvml_lines(ev)
    if nvml.error_class not in _EXPLAINED and nvml.error_class != "timeout":
        if facts is not None:
            return [make_finding("GPU-DRV-004", "NVML failed to initialise, cause unknown", evidence, host=ev.host)]
        transcript = ev.transcript
        if transcript is not None and transcript.nvml_init_error:
            summary = f"NVML failed to initialise: {transcript.nvml_init_error}"
        else:
            call = transcript.nvml_function if transcript is not None else None
            summary = f"NVML failed{f' in {call}' if call else ''}: {nvml.message or 'no reason given'}"
        return [make_finding("GPU-DRV-004", summary, evidence, host=ev.host)]
    if any(f.severity is Severity.CRITICAL for f in found):
        return []
    # NVML failed and nothing explains it: never healthy.
    if nvml.error_class == "driver_not_loaded":
        if facts is not None:
            booted = facts.system.kernel
            kernel = facts.booted_kernel
            if kernel is None:
                evidence.append(f"booted kernel {booted} is not a dpkg-installed kernel package; module state unknown")
            else:
                evidence.append(f"booted kernel {booted} has an nvidia module: {kernel.nvidia_module.path}")
            if not facts.packages.available:
                evidence.append(f"package database not read: {facts.packages.error}")
            evidence.extend(f"kernel log: {m.text}" for m in ev.kernel_log.module_missing)
        elif ev.transcript is not None and ev.transcript.running_kernel:
            evidence.append(f"nvidia.ko found for the booted kernel {ev.transcript.running_kernel}")
        summary = "NVIDIA driver not loaded although a module exists; cause unknown"
    else:
        summary = "NVML failed and no specific cause was found"
    return [make_finding("GPU-DRV-004", summary, evidence, host=ev.host, severity=Severity.CRITICAL)]


@rule("GPU-DRV-006")
def nvml_hung(ev: Evidence) -> list[Finding]:
    """GPU-DRV-006: the probe's NVML call timed out (NVML hung)."""
    if ev.nvml_class != "timeout" or ev.nvml is None:
        return []
    evidence = _nvml_lines(ev)
    if ev.nvml.child_reaped is False:
        evidence.append("the probe's NVML child could not be reaped after SIGKILL (stuck in the driver)")
    return [make_finding("GPU-DRV-006", "NVML hung: the probe's NVML call timed out", evidence, host=ev.host)]


@rule("GPU-DRV-007")
def api_mismatch_in_kernel_log(ev: Evidence) -> list[Finding]:
    """GPU-DRV-007: API mismatch lines in the kernel log while NVML did not report a mismatch (GPU-DRV-002's)."""
    mismatches = ev.kernel_log.api_mismatches
    if not mismatches or ev.nvml_class == "version_mismatch":
        return []
    pairs = ", ".join(
        dict.fromkeys(
            f"client {a.client_version}"
            + (f" ({a.client_process}, pid {a.client_pid})" if a.client_process else "")
            + f" vs kernel module {a.module_version}"
            for a in mismatches
        )
    )
    return [
        make_finding(
            "GPU-DRV-007",
            f"NVIDIA kernel module API mismatch x{len(mismatches)}: {pairs}",
            _uniq(line for a in mismatches for line in a.evidence),
            host=ev.host,
        )
    ]


def _module_words(source: str | None, signed: bool | None) -> str:
    where = {"dkms": "built by DKMS", "package": "from a precompiled package", "other": "outside DKMS's tree"}
    sig = {True: "signed", False: "unsigned", None: "signature unknown"}[signed]
    return f"{sig}, {where.get(source or '', 'origin unknown')}"


@rule("GPU-DRV-008")
def module_rejected_by_secure_boot(ev: Evidence) -> list[Finding]:
    """GPU-DRV-008: the NVIDIA module exists for the booted kernel but Secure Boot refuses to load it."""
    rejected = ev.kernel_log.nvidia_rejected
    facts = ev.facts
    if ev.nvml_class not in (None, "driver_not_loaded"):
        return []  # NVML answered (the module is loaded) or failed for another reason
    if facts is None:
        if not rejected:
            return []
        evidence = [*_nvml_lines(ev), *(r.text for r in rejected)]
        named = next((r for r in rejected if r.module), None)
        what = f"module {named.module!r}" if named else "an unsigned module"
        words = "Key was rejected by service" if named and named.reason == "key-rejected" else rejected[0].reason
        summary = (f"NVIDIA driver not loaded: Secure Boot refused {what} (the kernel log: {words})"
                   "; install the signed precompiled module package (linux-modules-nvidia-BRANCH-$(uname -r))")
        return [make_finding("GPU-DRV-008", summary, _uniq(evidence), host=ev.host)]
    if ev.nvml_class is None:
        return []
    kernel = facts.booted_kernel
    if kernel is None or not kernel.has_nvidia_module:
        return []  # no module: GPU-DRV-001
    module = kernel.nvidia_module
    if module.would_load is not False and not rejected:
        return []
    booted = facts.system.kernel
    sb = facts.secure_boot
    evidence = _nvml_lines(ev)
    evidence.append(
        f"booted kernel {booted} has an NVIDIA module: {module.path} ({_module_words(module.source, module.signed)}"
        f", version {module.version or '?'})"
    )
    evidence.append(f"Secure Boot {sb.state}" + (f" ({sb.source})" if sb.source else "") +
                    ": the kernel loads only modules signed with a trusted key")
    if kernel.signed_module_packages:
        evidence.append("signed module package installed: " + ", ".join(kernel.signed_module_packages)
                        + " (shadowed by the DKMS module in updates/dkms)")
    else:
        # The installed driver's whole branch: a 535-server host needs linux-modules-nvidia-535-server-<kernel>.
        branch = facts.packages.driver_branch if is_branch(facts.packages.driver_branch) else "BRANCH"
        evidence.append(f"no signed module package for {booted} ({signed_module_package(str(branch), str(booted))})")
    evidence.extend(f"kernel log: {r.text}" for r in rejected)
    summary = (f"NVIDIA module for {booted} is present but Secure Boot refuses it: {module.path} is "
               f"{_module_words(module.source, module.signed)}")
    return [make_finding("GPU-DRV-008", summary, _uniq(evidence), host=ev.host)]


def host_driver_version(facts: HostFacts) -> tuple[str | None, str]:
    """The host's driver version and where it came from: NVML when it answered, else the driver package."""
    if facts.nvml.driver_version:
        return facts.nvml.driver_version, "NVML"
    if facts.packages.driver_package_version:
        return facts.packages.driver_package_version, f"package {facts.packages.driver_package}"
    return None, "unknown"


@fleet_rule("GPU-DRV-005")
def driver_drift(all_facts: Mapping[str, HostFacts], policy: Policy) -> dict[str, list[Finding]]:
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
