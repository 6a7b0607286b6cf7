"""Kernel and package hygiene: the S1 prevention side (GPU-KRN-00x, GPU-APT-001).

What unattended-upgrades did or would do comes from three places, read by the same rules:

- a host's effective configuration (``apt-config dump``: enabled, ``Package-Blacklist``; optionally a
  ``--dry-run``), in the audit;
- ``/var/log/apt/history.log``: transactions whose ``Commandline`` is ``unattended-upgrade`` (dry runs never
  count), in the audit's facts and in pasted text;
- ``/var/log/unattended-upgrades/unattended-upgrades.log``: each run's "Packages that will be upgraded" and its
  "Initial blacklist" (the configuration at that run), in pasted text.

GPU-KRN-003 (kernel packages) and GPU-KRN-004 (NVIDIA packages) say "unattended-upgrades would upgrade them":
from the host's configuration when it is known (the history is not needed then: a host hardened since is
compliant); otherwise from what it did: the packages it installed (history, log), less those the newest
blacklist the log shows now covers. GPU-KRN-006 (info, one per host or text) lists every kernel or NVIDIA package
unattended-upgrade installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from remediation.core.checks.blacklist import blacklist_match, invalid_entries, matches_any, next_kernel_packages
from remediation.core.checks.debversion import compare_versions
from remediation.core.checks.evidence import Evidence
from remediation.core.checks.history import describe
from remediation.core.checks.registry import rule
from remediation.core.facts import HostFacts, KernelPackage
from remediation.core.findings import Finding, Severity, make_finding
from remediation.core.kernelflavour import is_flavour_meta
from remediation.core.parsers import apt_history as apt_mod

__all__ = [
    "dpkg_lock_held",
    "kernel_newer",
    "kernel_not_held",
    "newer_kernel_without_module",
    "reboot_required",
    "unattended_installed",
    "unattended_kernel",
    "unattended_nvidia",
]


def kernel_newer(a: KernelPackage, b_release: str, b: KernelPackage | None) -> bool:
    """``a`` sorts after the booted kernel in dpkg order (image package versions when both are known)."""
    if b is not None and a.image_version and b.image_version:
        result = compare_versions(a.image_version, b.image_version)
        if result:
            return result > 0
    return compare_versions(a.release, b_release) > 0


@rule("GPU-KRN-001")
def newer_kernel_without_module(ev: Evidence) -> list[Finding]:
    """GPU-KRN-001: a kernel newer than the booted one is installed and has no NVIDIA module."""
    facts = ev.facts
    if facts is None:
        return []
    booted_release = facts.system.kernel
    if not booted_release or not facts.packages.available or not facts.packages.nvidia:
        return []
    booted = facts.booted_kernel
    reboot = facts.system.reboot_required
    findings = []
    for kernel in facts.packages.kernels:
        refused = kernel.nvidia_module.rejected_by_secure_boot
        if kernel.release == booted_release or (kernel.has_nvidia_module and not refused):
            continue
        if not kernel_newer(kernel, booted_release, booted):
            continue
        if refused:
            evidence = [
                f"installed kernel {kernel.release} ({kernel.image_package} {kernel.image_version or '?'}) is newer "
                f"than booted {booted_release}; its NVIDIA module {kernel.nvidia_module.path} is unsigned and Secure "
                f"Boot is {facts.secure_boot.state}: the kernel will refuse it (GPU-DRV-008 after the reboot)",
            ]
        else:
            evidence = [
                f"installed kernel {kernel.release} ({kernel.image_package} {kernel.image_version or '?'}) is newer "
                f"than booted {booted_release} and /lib/modules/{kernel.release} has no nvidia.ko",
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
        what = "an NVIDIA module Secure Boot will refuse" if refused else "an NVIDIA module"
        findings.append(
            make_finding(
                "GPU-KRN-001",
                f"Kernel {kernel.release} is installed without {what}; the next reboot breaks the GPUs",
                evidence,
                host=facts.host,
                severity=Severity.CRITICAL if reboot else None,
            )
        )
    return findings


@rule("GPU-KRN-002")
def kernel_not_held(ev: Evidence) -> list[Finding]:
    """GPU-KRN-002: the booted kernel's packages or the kernel meta-packages are not held."""
    facts = ev.facts
    if facts is None:
        return []
    booted = facts.booted_kernel
    pkgs = facts.packages
    if booted is None or not pkgs.available or not pkgs.nvidia:
        return []
    wanted = [booted.image_package]
    if booted.headers_installed:
        wanted.append(f"linux-headers-{booted.release}")
    wanted.extend(booted.signed_module_packages)
    # The meta-packages of the booted flavour pull its next kernel in (linux-azure, linux-image-azure, ...,
    # linux-modules-nvidia-535-azure); where the flavour is not known, the policy's kernel patterns decide.
    flavour = facts.system.kernel_flavour
    patterns = ev.policy.kernel_blacklist_patterns
    wanted.extend(
        name for name in pkgs.kernel_meta_names
        if is_flavour_meta(name, flavour) or (flavour is None and matches_any(name, patterns))
    )
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


# --- what unattended-upgrade did: history.log and its own log ----------------------------------------------------


@dataclass(frozen=True)
class _Change:
    """A package unattended-upgrade changed in one real (not dry) run."""

    when: str | None
    package: str
    what: str  # "Upgrade linux-image-generic 6.5.0.44.44 → 6.5.0.45.45"
    source: str  # "history.log" | "unattended-upgrades.log"
    lines: tuple[str, ...]  # the run's lines that show it


def _describe(a: apt_mod.AptAction) -> str:
    if a.old_version and a.version:
        return f"{a.action} {a.package} {a.old_version} → {a.version}"
    return f"{a.action} {a.package} {a.version or ''}".rstrip()


def _changes(
    ev: Evidence, wanted: Callable[[apt_mod.AptAction], bool], package: Callable[[str], bool]
) -> list[_Change]:
    """What unattended-upgrade changed for real, from apt history (``wanted`` actions) and its log (``package``)."""
    out: list[_Change] = []
    for t in ev.apt_history.transactions:
        if t.dry_run or t.actor != "unattended-upgrade":
            continue
        who = tuple(line for line in t.text if line.startswith(("Commandline:", "Requested-By:")))
        out.extend(
            _Change(t.start, a.package, _describe(a), "history.log", (describe(t, a), *who))
            for a in t.actions
            if wanted(a)
        )
    for run in ev.unattended_log.runs:
        if not run.installed:
            continue
        lines = run.key_lines
        out.extend(
            _Change(run.start, p, f"Upgrade {p}", "unattended-upgrades.log", lines) for p in run.packages if package(p)
        )
    return out


def _by_time(changes: list[_Change], *, names: bool = False) -> str:
    """``at T1: what, what; at T2: what`` (``names``: package names, not the versions)."""
    groups: dict[str | None, list[str]] = {}
    for c in changes:
        groups.setdefault(c.when, []).append(c.package if names else c.what)
    return "; ".join(f"at {when or 'unknown time'}: {', '.join(dict.fromkeys(w))}" for when, w in groups.items())


def _lines(changes: list[_Change]) -> tuple[str, ...]:
    """The changes' lines, each once; who asked for them (``Commandline:``/``Requested-By:``) last."""
    lines = list(dict.fromkeys(line for c in changes for line in c.lines))
    who = [line for line in lines if line.startswith(("Commandline:", "Requested-By:"))]
    return tuple([line for line in lines if line not in who] + who)


def _did_upgrade(ev: Evidence, family: str, changes: list[_Change]) -> tuple[str, tuple[str, ...]] | None:
    """Where the host's configuration is not known: (summary, evidence) when unattended-upgrade changed
    ``family`` packages that the newest blacklist in its log (if any) does not cover; else None."""
    blacklist = ev.unattended_log.blacklist
    evidence: list[str] = []
    if blacklist is not None:
        covered = [c for c in changes if blacklist_match(c.package, blacklist) is not None]
        changes = [c for c in changes if blacklist_match(c.package, blacklist) is None]
        if covered:
            names = ", ".join(dict.fromkeys(c.package for c in covered))
            evidence.append(f"covered by the newest blacklist in the log now: {names}")
    if not changes:
        return None
    evidence = [*_lines(changes), *evidence]
    if blacklist is not None:
        shown = " ".join(blacklist) or "empty"
        evidence.append(f"newest Initial blacklist in the log: {shown}")
    summary = f"unattended-upgrade changed {family} packages {_by_time(changes)}"
    return summary, tuple(evidence)


@rule("GPU-KRN-003")
def unattended_kernel(ev: Evidence) -> list[Finding]:
    """GPU-KRN-003: unattended-upgrades would upgrade kernel packages (blacklist missing or ineffective).

    Host: the candidates are the installed kernel packages that match the policy's kernel patterns (the booted
    kernel's image, headers and modules, the meta-packages) plus the next ABI's package names, which arrive as new
    dependencies of the meta-packages. A candidate is protected when a blacklist entry ``re.match``-es it or
    (installed ones) it is held; the next ABI's names count only while a meta-package that would pull them in is
    unprotected. Text: the kernel packages unattended-upgrade installed (see the module docstring).
    """
    facts = ev.facts
    if facts is None:
        changes = _changes(
            ev, lambda a: a.is_kernel and a.action not in ("Remove", "Purge"), apt_mod.is_kernel_package
        )
        found = _did_upgrade(ev, "kernel", changes)
        if found is None:
            return []
        return [make_finding("GPU-KRN-003", found[0], found[1], host=ev.host)]
    uu = facts.unattended_upgrades
    pkgs = facts.packages
    if not uu.enabled or not pkgs.available:
        return []
    patterns = ev.policy.kernel_blacklist_patterns
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


@rule("GPU-KRN-004")
def unattended_nvidia(ev: Evidence) -> list[Finding]:
    """GPU-KRN-004: unattended-upgrades would upgrade NVIDIA packages: host, installed NVIDIA packages neither
    blacklisted nor held while it is enabled; text, the NVIDIA packages it changed (see the module docstring)."""
    facts = ev.facts
    if facts is None:
        changes = _changes(ev, lambda a: a.is_nvidia, apt_mod.is_nvidia_package)
        found = _did_upgrade(ev, "NVIDIA", changes)
        if found is None:
            return []
        return [make_finding("GPU-KRN-004", found[0], found[1], host=ev.host)]
    uu = facts.unattended_upgrades
    pkgs = facts.packages
    if not uu.enabled or not pkgs.available:
        return []
    patterns = ev.policy.nvidia_package_patterns
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


@rule("GPU-KRN-005")
def reboot_required(ev: Evidence) -> list[Finding]:
    """GPU-KRN-005: /run/reboot-required exists."""
    facts = ev.facts
    if facts is None or not facts.system.reboot_required:
        return []
    pkgs = ", ".join(facts.system.reboot_required_pkgs) or "(no reboot-required.pkgs)"
    return [
        make_finding(
            "GPU-KRN-005", "Reboot required", [f"/run/reboot-required present; packages: {pkgs}"], host=facts.host
        )
    ]


@rule("GPU-KRN-006")
def unattended_installed(ev: Evidence) -> list[Finding]:
    """GPU-KRN-006 (info), one per host or text: unattended-upgrade installed kernel or NVIDIA packages (real runs:
    dry runs never count; removals are not installs)."""
    changes = _changes(
        ev,
        lambda a: (a.is_kernel or a.is_nvidia) and a.action not in ("Remove", "Purge"),
        lambda p: apt_mod.is_kernel_package(p) or apt_mod.is_nvidia_package(p),
    )
    if not changes:
        return []
    summary = f"unattended-upgrade installed kernel/NVIDIA packages {_by_time(changes, names=True)}"
    return [make_finding("GPU-KRN-006", summary, _lines(changes), host=ev.host)]


@rule("GPU-APT-001")
def dpkg_lock_held(ev: Evidence) -> list[Finding]:
    """GPU-APT-001: a dpkg/apt lock is held (a remediation would fail or wait)."""
    if ev.facts is None:
        return []
    lock = ev.facts.dpkg_lock
    if not lock.held:
        return []
    holder = (
        f"pid {lock.holder_pid} ({lock.holder_comm or '?'})" if lock.holder_pid else "holder not visible in /proc/locks"
    )
    return [
        make_finding(
            "GPU-APT-001", f"dpkg lock held by {holder}", [f"/var/lib/dpkg lock held by {holder}"], host=ev.host
        )
    ]
