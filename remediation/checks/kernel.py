"""Kernel and package hygiene: the S1 prevention side (GPU-KRN-00x, GPU-APT-001)."""

from __future__ import annotations

from remediation.checks.blacklist import blacklist_match, invalid_entries, matches_any, next_kernel_packages
from remediation.checks.debversion import compare_versions
from remediation.checks.history import describe
from remediation.checks.policy import Policy
from remediation.facts import HostFacts, KernelPackage
from remediation.findings import Finding, Severity, make_finding

__all__ = [
    "check_dpkg_lock",
    "check_kernel_hold",
    "check_newer_kernel_without_module",
    "check_reboot_required",
    "check_unattended_installs",
    "check_unattended_kernel",
    "check_unattended_nvidia",
    "kernel_newer",
]


def kernel_newer(a: KernelPackage, b_release: str, b: KernelPackage | None) -> bool:
    """``a`` sorts after the booted kernel in dpkg order (image package versions when both are known)."""
    if b is not None and a.image_version and b.image_version:
        result = compare_versions(a.image_version, b.image_version)
        if result:
            return result > 0
    return compare_versions(a.release, b_release) > 0


def check_newer_kernel_without_module(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-KRN-001: a kernel newer than the booted one is installed and has no NVIDIA module."""
    booted_release = facts.system.kernel
    if not booted_release or not facts.packages.available or not facts.packages.nvidia:
        return []
    booted = facts.booted_kernel
    reboot = facts.system.reboot_required
    findings = []
    for kernel in facts.packages.kernels:
        if kernel.release == booted_release or kernel.has_nvidia_module:
            continue
        if not kernel_newer(kernel, booted_release, booted):
            continue
        evidence = [
            f"installed kernel {kernel.release} ({kernel.image_package} {kernel.image_version or '?'}) is newer than "
            f"booted {booted_release} and /lib/modules/{kernel.release} has no nvidia.ko",
        ]
        if kernel.dkms:
            evidence.append("dkms: " + ", ".join(f"{d.module} {d.version} {d.state}" for d in kernel.dkms))
        else:
            evidence.append(f"no DKMS build of nvidia for {kernel.release}")
        if not kernel.headers_installed:
            evidence.append(f"linux-headers-{kernel.release} not installed (DKMS cannot build the module)")
        for tx, action in facts.apt_history.kernel_installs():
            if action.package == kernel.image_package:
                evidence.append(describe(tx, action))
        if reboot:
            pkgs = ", ".join(facts.system.reboot_required_pkgs) or "no package list"
            evidence.append(f"reboot required ({pkgs}): the next reboot boots {kernel.release} without a GPU driver")
        else:
            evidence.append("no reboot pending")
        findings.append(
            make_finding(
                "GPU-KRN-001",
                f"Kernel {kernel.release} is installed without an NVIDIA module; the next reboot breaks the GPUs",
                evidence,
                host=facts.host,
                severity=Severity.CRITICAL if reboot else None,
            )
        )
    return findings


def check_kernel_hold(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-KRN-002: the booted kernel's packages or the kernel meta-packages are not held."""
    booted = facts.booted_kernel
    pkgs = facts.packages
    if booted is None or not pkgs.available or not pkgs.nvidia:
        return []
    wanted = [booted.image_package]
    if booted.headers_installed:
        wanted.append(f"linux-headers-{booted.release}")
    wanted.extend(name for name in pkgs.kernel_meta_names if matches_any(name, policy.kernel_blacklist_patterns))
    not_held = [name for name in wanted if name not in pkgs.held]
    if not not_held:
        return []
    evidence = [f"not held: {', '.join(not_held)}"]
    held = sorted(n for n in pkgs.held if n.startswith("linux-"))
    evidence.append(f"held kernel packages: {', '.join(held) if held else 'none'}")
    return [make_finding("GPU-KRN-002", f"Kernel packages of {booted.release} not held", evidence, host=facts.host)]


def _unprotected(facts: HostFacts, candidates: list[str]) -> tuple[list[str], list[str]]:
    """(unprotected names, evidence lines) for ``candidates`` against the host's blacklist and holds."""
    uu = facts.unattended_upgrades
    held = facts.packages.held
    unprotected = []
    lines = []
    for name in candidates:
        entry = blacklist_match(name, uu.package_blacklist)
        if entry is not None:
            continue
        if name in held:
            continue
        unprotected.append(name)
    if unprotected:
        shown = ", ".join(unprotected[:8]) + (f" (+{len(unprotected) - 8} more)" if len(unprotected) > 8 else "")
        lines.append(f"not matched by Package-Blacklist and not held: {shown}")
    blacklist = ", ".join(f'"{e}"' for e in uu.package_blacklist) or "empty"
    lines.append(f"effective Unattended-Upgrade::Package-Blacklist (apt-config dump): {blacklist}")
    bad = invalid_entries(uu.package_blacklist)
    if bad:
        lines.append(
            "invalid regular expressions in Package-Blacklist (unattended-upgrade crashes on them): " + ", ".join(bad)
        )
    return unprotected, lines


def _would_upgrade_lines(facts: HostFacts, patterns: tuple[str, ...]) -> list[str]:
    would = facts.unattended_upgrades.would_upgrade
    if would is None or not would.ran:
        return []
    hits = [p for p in would.upgrade if matches_any(p, patterns)]
    return [f"unattended-upgrade --dry-run would upgrade: {', '.join(hits)}"] if hits else []


def check_unattended_kernel(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-KRN-003: unattended-upgrades is enabled and would take kernel packages (blacklist missing/ineffective).

    Candidates: installed kernel packages that match the policy's kernel patterns (the booted kernel's image,
    headers and modules, the meta-packages) plus the next ABI's package names, which arrive as new dependencies of
    the meta-packages.  A candidate is protected when a blacklist entry ``re.match``-es it or (installed ones) it is
    held; the next ABI's names count only while a meta-package that would pull them in is unprotected.
    """
    uu = facts.unattended_upgrades
    pkgs = facts.packages
    if not uu.enabled or not pkgs.available:
        return []
    patterns = policy.kernel_blacklist_patterns
    installed = [k.image_package for k in pkgs.kernels]
    booted = facts.system.kernel or ""
    installed += [f"linux-headers-{k.release}" for k in pkgs.kernels if k.headers_installed]
    installed += [f"linux-modules-{k.release}" for k in pkgs.kernels if k.modules_installed and k.release == booted]
    installed += list(pkgs.kernel_meta_names)
    installed = [n for n in dict.fromkeys(installed) if matches_any(n, patterns)]
    unprotected, lines = _unprotected(facts, installed)
    meta_open = [n for n in unprotected if n in pkgs.kernel_meta_names]
    future = [n for n in next_kernel_packages(booted) if matches_any(n, patterns)] if meta_open else []
    future_open, _ = _unprotected(facts, future)
    if future_open:
        lines.insert(
            1, f"next kernel packages not protected (pulled in by {', '.join(meta_open)}): {', '.join(future_open)}"
        )
    would = _would_upgrade_lines(facts, patterns)
    if not unprotected and not future_open and not would:
        return []
    return [
        make_finding(
            "GPU-KRN-003",
            "unattended-upgrades would upgrade kernel packages",
            ["unattended-upgrades enabled (APT::Periodic::Unattended-Upgrade)", *lines, *would],
            host=facts.host,
        )
    ]


def check_unattended_nvidia(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-KRN-004: unattended-upgrades is enabled and installed NVIDIA packages are neither blacklisted nor held."""
    uu = facts.unattended_upgrades
    pkgs = facts.packages
    if not uu.enabled or not pkgs.available:
        return []
    patterns = policy.nvidia_package_patterns
    candidates = [n for n in pkgs.nvidia_names if matches_any(n, patterns)]
    unprotected, lines = _unprotected(facts, candidates)
    would = _would_upgrade_lines(facts, patterns)
    if not unprotected and not would:
        return []
    return [
        make_finding(
            "GPU-KRN-004",
            "unattended-upgrades would upgrade NVIDIA driver packages",
            ["unattended-upgrades enabled (APT::Periodic::Unattended-Upgrade)", *lines, *would],
            host=facts.host,
        )
    ]


def check_reboot_required(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-KRN-005: /run/reboot-required exists."""
    if not facts.system.reboot_required:
        return []
    pkgs = ", ".join(facts.system.reboot_required_pkgs) or "(no reboot-required.pkgs)"
    return [
        make_finding(
            "GPU-KRN-005", "Reboot required", [f"/run/reboot-required present; packages: {pkgs}"], host=facts.host
        )
    ]


def check_unattended_installs(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-KRN-006 (info): unattended-upgrade installed kernel or NVIDIA packages (real runs, not --dry-run)."""
    lines = []
    for tx in facts.apt_transactions:
        if tx.dry_run or tx.actor != "unattended-upgrade":
            continue
        for action in tx.actions:
            if action.action in ("Remove", "Purge"):
                continue
            if action.is_kernel or action.is_nvidia:
                lines.append(describe(tx, action))
    if not lines:
        return []
    return [make_finding("GPU-KRN-006", "unattended-upgrade installed kernel/NVIDIA packages", lines, host=facts.host)]


def check_dpkg_lock(facts: HostFacts, policy: Policy) -> list[Finding]:
    """GPU-APT-001: a dpkg/apt lock is held (a remediation would fail or wait)."""
    lock = facts.dpkg_lock
    if not lock.held:
        return []
    holder = (
        f"pid {lock.holder_pid} ({lock.holder_comm or '?'})" if lock.holder_pid else "holder not visible in /proc/locks"
    )
    return [
        make_finding(
            "GPU-APT-001", f"dpkg lock held by {holder}", [f"/var/lib/dpkg lock held by {holder}"], host=facts.host
        )
    ]
