"""The kernel update's per-host plan (pure): facts + what apt offers -> what to install, check, boot and hold.

The same function plans in the Python flow (``invoke kernel-update``) and in the playbook
(``playbooks/kernel_update.yml``, through the role's ``gpufleet_kernel_update_plan`` filter).

Per host, first match wins:

1. Not probed, or cordoned -> left alone.
2. Not a healthy GPU host now (NVML fails, no driver package) -> left alone: repair it first (``invoke
   driver-restore``); a kernel move is planned maintenance on a working host.
3. The target: ``--kernel VERSION`` (a release of the booted flavour, newer than the booted one, installed or offered
   by apt), else the newest release of the booted flavour apt offers or has installed. None newer -> ``none``.
4. The module source (:func:`remediation.restore.rules.choose_module_source`): ``signed`` installs
   ``linux-modules-nvidia-<branch>-<target>`` (it must be offered and built for the installed driver), ``dkms``
   installs ``linux-headers-<target>`` and builds with ``dkms autoinstall``. The kernel itself:
   ``linux-image-<target>`` (which pulls ``linux-modules-<target>``).
5. Unhold only what must move: the target's packages are new names, so a hold on them (an operator's) is released;
   the flavour's meta-packages stay held at their version (they would pull the newest kernel, and on the signed path
   its headers, whose DKMS build would shadow the signed module).
6. Guards: a dpkg lock held, or GPU work running (``--force`` overrides the latter) -> left alone.

At the end the target's packages are held (image, modules, headers or the signed module package) along with what was
held before; the unattended-upgrades blacklist is never touched.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remediation.core.checks.debversion import compare_versions
from remediation.core.facts import HostFacts
from remediation.core.findings import Finding
from remediation.kernelflavour import is_branch, parse_release, signed_module_package
from remediation.restore.rules import choose_module_source, grub_default_for, is_cordoned

__all__ = [
    "Available",
    "KernelPlan",
    "available_query",
    "parse_available",
    "plan_host",
    "signed_build_for",
]


@dataclass(frozen=True)
class Available:
    """A package apt offers (``apt-cache show --no-all-versions``): its candidate version and dependencies."""

    package: str
    version: str
    depends: str = ""


# Host-reported values that go into a shell command: fullmatch (``$`` would accept a trailing newline).
_FLAVOUR_OK = re.compile(r"[a-z][a-z0-9.+-]*")


def available_query(flavour: str, branch: str | None) -> str:
    """One shell command for the host: what apt offers for the flavour's kernels (images, headers, signed modules).

    Prints ``apt-cache show`` stanzas (Package, Version, Depends) of every version apt knows (a signed module
    package has one build per driver version: the one for the installed driver is not always the candidate);
    nothing when apt offers none."""
    if not _FLAVOUR_OK.fullmatch(flavour) or (branch is not None and not is_branch(branch)):
        raise ValueError(f"kernel flavour {flavour!r} / driver branch {branch!r} is not a flavour / branch name")
    pattern = shlex.quote(f"^linux-image-[0-9].*-{flavour}$")
    signed = f'linux-modules-nvidia-{branch}-"$r"' if branch else ""
    return (
        f"for p in $(apt-cache search --names-only {pattern} 2>/dev/null | cut -d' ' -f1); do r=${{p#linux-image-}}; "
        f'echo "$p" linux-headers-"$r" {signed}; done | xargs -r env LC_ALL=C apt-cache show '
        "2>/dev/null | grep -E '^(Package|Version|Depends):' || true"
    )


def parse_available(text: str) -> dict[str, tuple[Available, ...]]:
    """The query's output (``apt-cache show`` stanzas) -> ``{package: every version apt knows}``."""
    out: dict[str, tuple[Available, ...]] = {}
    current: dict[str, str] = {}

    def flush() -> None:
        if current.get("Package") and current.get("Version"):
            offer = Available(current["Package"], current["Version"], current.get("Depends", ""))
            if offer not in out.get(offer.package, ()):
                out[offer.package] = (*out.get(offer.package, ()), offer)

    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Package":
            flush()
            current = {"Package": value.strip()}
        elif key in ("Version", "Depends") and current:
            current[key] = value.strip()
    flush()
    return out


@dataclass(frozen=True)
class KernelPlan:
    """What the kernel update does on one host, and why. ``blocked`` set: left alone."""

    host: str
    action: str  # "update" | "none" | "skip"
    reason: str
    blocked: str | None = None
    booted_kernel: str | None = None
    flavour: str | None = None
    secure_boot: bool | None = None
    target_kernel: str | None = None
    target_version: str | None = None  # Debian version of linux-image-<target>
    install_specs: tuple[str, ...] = ()  # install_packages as apt is asked for them (name=version where pinned)
    module_source: str | None = None  # "dkms" | "signed"
    module_source_reason: str = ""
    driver_package: str | None = None
    driver_version: str | None = None  # upstream, what the module must carry and NVML must report
    install_packages: tuple[str, ...] = ()  # not installed before this run
    unhold_packages: tuple[str, ...] = ()
    hold_packages: tuple[str, ...] = ()  # held at the end (not held before)
    steps: tuple[str, ...] = ()
    findings: tuple[str, ...] = ()

    @property
    def changes_host(self) -> bool:
        return self.action == "update" and self.blocked is None

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-ready (the role reads this as its per-host plan)."""
        return {
            "host": self.host,
            "action": self.action,
            "reason": self.reason,
            "blocked": self.blocked,
            "changes_host": self.changes_host,
            "booted_kernel": self.booted_kernel,
            "flavour": self.flavour,
            "secure_boot": self.secure_boot,
            "target_kernel": self.target_kernel,
            "target_version": self.target_version,
            "module_source": self.module_source,
            "module_source_reason": self.module_source_reason,
            "driver_package": self.driver_package,
            "driver_version": self.driver_version,
            "install_packages": list(self.install_packages),
            "install_specs": list(self.install_specs or self.install_packages),
            "unhold_packages": list(self.unhold_packages),
            "hold_packages": list(self.hold_packages),
            "booted_entry": grub_default_for(self.booted_kernel) if self.booted_kernel else None,
            "target_entry": grub_default_for(self.target_kernel) if self.target_kernel else None,
            "steps": list(self.steps),
        }


def _upstream(version: str | None) -> str:
    if not version:
        return ""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


# nvidia-kernel-common-535 / -535-server (the -open branches' signed modules depend on the proprietary one's)
_COMMON = re.compile(
    r"nvidia-kernel-common-(?P<branch>[0-9]+(?:-server)?)\s*\(\s*(?P<op>>=|=|>>)\s*(?P<ver>[^)\s]+)\s*\)"
)


def _signed_built_for(depends: str) -> str | None:
    """The driver version a signed module package is built for, from its nvidia-kernel-common dependency
    (``nvidia-kernel-common-535-server (>= 535.183.01)`` for ``linux-modules-nvidia-535-server-<kernel>``)."""
    m = _COMMON.search(depends)
    return _upstream(m.group("ver")) if m else None


def signed_build_for(offers: Sequence[Available], driver: str) -> Available | None:
    """The build of a signed module package made for ``driver`` (upstream version), of the versions apt knows."""
    for offer in offers:
        if _signed_built_for(offer.depends) == _upstream(driver) or _signed_built_for(offer.depends) == driver:
            return offer
    return None


def _newest(offers: Sequence[Available]) -> Available:
    best = offers[0]
    for o in offers[1:]:
        if compare_versions(o.version, best.version) > 0:
            best = o
    return best


def _gpu_work(facts: HostFacts) -> list[str]:
    out = [f"GPU {g.index}: pid {p.pid} ({p.name or '?'})" for g in facts.nvml.gpus for p in g.processes]
    seen = {p.pid for g in facts.nvml.gpus for p in g.processes}
    out += [u.label for u in facts.device_users.workloads if u.pid not in seen]
    return out


def plan_host(
    host: str,
    facts: HostFacts | None,
    findings: Sequence[Finding],
    host_vars: Mapping[str, Any],
    available: Mapping[str, Sequence[Available]],
    *,
    kernel: str | None = None,
    module_source: str = "auto",
    force: bool = False,
    cordon_marker: str | None = None,
    not_probed: str | None = None,
) -> KernelPlan:
    """The plan for one host (see the module docstring). ``available``: :func:`parse_available` of the host."""
    ids = tuple(sorted({f.id for f in findings}))
    if facts is None:
        return KernelPlan(host, "skip", "left alone: not probed", blocked=not_probed or "not probed", findings=ids)
    cordoned = is_cordoned(host_vars, cordon_marker)
    booted = facts.system.kernel
    flavour = facts.system.kernel_flavour
    base: dict[str, Any] = {"booted_kernel": booted, "flavour": flavour, "secure_boot": facts.secure_boot.enabled,
                            "findings": ids}
    if cordoned:
        return KernelPlan(host, "skip", f"left alone: {cordoned}", blocked=cordoned, **base)
    pkgs = facts.packages
    if not facts.nvml.ok or not pkgs.driver_package or not pkgs.driver_package_version:
        why = (f"NVML {facts.nvml.error_class}" if not facts.nvml.ok else "no NVIDIA driver package installed")
        return KernelPlan(host, "skip", f"left alone: {why}: repair the host first (invoke driver-restore)",
                          blocked=why, **base)
    now = parse_release(booted)
    if now is None or flavour is None:
        return KernelPlan(host, "skip", f"left alone: booted kernel {booted!r} names no flavour",
                          blocked="unknown kernel flavour", **base)
    driver = pkgs.driver_package_version
    base.update(driver_package=pkgs.driver_package, driver_version=driver)
    # Candidates: releases of the booted flavour, newer than the booted one, offered by apt or installed.
    candidates: dict[str, str | None] = {}
    for name, offers in available.items():
        if offers and name.startswith("linux-image-") and not name.startswith("linux-image-unsigned-"):
            rel = parse_release(name[len("linux-image-"):])
            if rel is not None and rel.flavour == flavour and rel.sort_key() > now.sort_key():
                candidates[rel.release] = _newest(offers).version
    for k in pkgs.kernels:
        rel = parse_release(k.release)
        if rel is not None and rel.flavour == flavour and rel.sort_key() > now.sort_key():
            candidates.setdefault(k.release, k.image_version)
    if kernel:
        wanted = parse_release(kernel)
        if wanted is None or wanted.flavour != flavour:
            return KernelPlan(host, "skip", f"left alone: --kernel {kernel} is not a {flavour} kernel release",
                              blocked=f"--kernel {kernel}: the host boots the {flavour} flavour", **base)
        if kernel == booted:
            return KernelPlan(host, "none", f"already booted into {kernel}", target_kernel=kernel, **base)
        if kernel not in candidates:
            return KernelPlan(host, "skip", f"left alone: {kernel} is neither offered by apt nor installed, or not "
                              f"newer than {booted}", blocked=f"--kernel {kernel} not available", **base)
        target = kernel
    else:
        if not candidates:
            return KernelPlan(host, "none", f"already on the newest {flavour} kernel apt offers ({booted})", **base)
        target = max(candidates, key=lambda r: parse_release(r).sort_key())  # type: ignore[union-attr]
    installed_k = pkgs.kernel(target)
    target_version = candidates.get(target)
    source, reason = choose_module_source(module_source, facts.secure_boot.enabled)
    branch = pkgs.driver_branch if is_branch(pkgs.driver_branch) else None  # host output: a name, or nothing
    image = f"linux-image-{target}"
    install: list[str] = [] if installed_k is not None else [image]
    specs: list[str] = list(install)
    hold: list[str] = [image, f"linux-modules-{target}"]
    steps: list[str] = []
    if source == "signed":
        if not branch:
            return KernelPlan(host, "skip", "left alone: no driver branch to name the signed module package",
                              blocked="no NVIDIA driver branch", **base)
        package = signed_module_package(branch, target)
        offers = tuple(available.get(package, ()))
        has = installed_k is not None and package in installed_k.signed_module_packages
        if not has and not offers:
            return KernelPlan(host, "skip", f"left alone: apt offers no {package} ({reason})",
                              blocked=f"{package} not available", target_kernel=target, module_source=source,
                              module_source_reason=reason, **base)
        build = signed_build_for(offers, driver) if not has else None
        if not has and build is None:
            made = ", ".join(f"{o.version} (driver {_signed_built_for(o.depends) or '?'})" for o in offers)
            return KernelPlan(host, "skip", f"left alone: no build of {package} for driver {driver} (apt has {made})",
                              blocked=f"{package} has no build for driver {driver}", target_kernel=target,
                              module_source=source, module_source_reason=reason, **base)
        if not has and build is not None:
            install.append(package)
            specs.append(f"{package}={build.version}")
        hold.append(package)
        steps.append(f"install {' '.join(specs) or 'nothing (installed)'}: {target} with Canonical's signed module "
                     f"built for {driver} ({reason})")
    else:
        headers = f"linux-headers-{target}"
        if (installed_k is None or not installed_k.headers_installed) and not available.get(headers):
            return KernelPlan(host, "skip", f"left alone: apt offers no {headers} for the DKMS build",
                              blocked=f"{headers} not available", target_kernel=target, module_source=source,
                              module_source_reason=reason, **base)
        if installed_k is None or not installed_k.headers_installed:
            install.append(headers)
            specs.append(headers)
        hold.append(headers)
        steps.append(f"install {' '.join(install) or 'nothing (installed)'} ({reason})")
        steps.append(f"dkms autoinstall -k {target} (builds nvidia {driver})")
    unhold = tuple(p for p in hold if p in pkgs.held)
    steps = [
        *([f"unhold {', '.join(unhold)}"] if unhold else ["unhold nothing: the target's packages are new names; "
                                                          "the flavour's meta-packages stay held"]),
        *steps,
        f"gate 1: nvidia.ko for {target} exists, carries {driver} and loads with Secure Boot "
        f"{facts.secure_boot.state} (else undo and stop)",
        f'GRUB_DEFAULT=saved + update-grub, saved default "{grub_default_for(booted)}"',
        f'grub-reboot "{grub_default_for(target)}" (one-shot), reboot (needs --allow-reboot)',
        f"gate 2: running {target} and NVML answers with {driver}",
        f"success: grub-set-default {target} + update-grub; failure: boot back into {booted}, undo",
        f"hold {', '.join(dict.fromkeys(hold))}; the unattended-upgrades blacklist stays",
    ]
    plan = KernelPlan(
        host, "update", f"{booted} -> {target} ({flavour}, module: {source})", target_kernel=target,
        target_version=target_version, module_source=source, module_source_reason=reason,
        install_packages=tuple(install), install_specs=tuple(specs), unhold_packages=unhold,
        hold_packages=tuple(dict.fromkeys(p for p in hold if p not in pkgs.held or p in unhold)),
        steps=tuple(steps), **base,
    )
    blocked = None
    if facts.dpkg_lock.held:
        blocked = f"dpkg lock held by {facts.dpkg_lock.holder_comm or 'another process'}"
    work = _gpu_work(facts)
    if blocked is None and work and not force:
        blocked = "GPU work running (" + "; ".join(work[:4]) + "): pass --force to update anyway"
    if blocked:
        from dataclasses import replace

        return replace(plan, blocked=blocked)
    return plan
