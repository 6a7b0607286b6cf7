"""The kernel update's per-host plan (pure): facts + what apt offers -> what to install, check, boot and hold.

The same function plans in the Python flow (``invoke kernel-update``) and in the playbook
(``playbooks/kernel_update.yml``, through the role's ``gpufleet_kernel_update_plan`` filter).

Per host, first match wins (``_RULES``):

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
6. Guards (``_GUARDS``, for an update): a dpkg lock held, or GPU work running (``--force`` overrides the latter) ->
   left alone.

At the end the target's packages are held (image, modules, headers or the signed module package) along with what was
held before; the unattended-upgrades blacklist is never touched.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from remediation.core.checks.debversion import compare_versions
from remediation.core.facts import HostFacts, KernelPackage
from remediation.core.findings import Finding
from remediation.core.kernelflavour import KernelRelease, is_branch, parse_release, signed_module_package
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


@dataclass(frozen=True)
class _Case:
    """What the kernel update's rules read about one probed host.

    The derived values are computed when a rule first asks for them, and each rule asks only for what the rules
    before it made sure of: ``now`` and ``flavour`` past the flavour rule, ``candidates`` and ``target`` past the
    target rules, ``source`` (which raises on a bad ``module_source``) past the ``none`` plans."""

    host: str
    facts: HostFacts
    available: Mapping[str, Sequence[Available]]
    kernel: str | None  # --kernel
    module_source: str
    force: bool
    cordoned: str | None
    base: dict[str, Any]  # the fields every plan past the cordon check carries

    @property
    def booted(self) -> str | None:
        return self.facts.system.kernel

    @property
    def flavour(self) -> str | None:
        return self.facts.system.kernel_flavour

    @cached_property
    def now(self) -> KernelRelease | None:
        """The booted kernel's release."""
        return parse_release(self.booted)

    @property
    def driver(self) -> str:
        """The installed driver's Debian version (set past the healthy-host rule)."""
        return self.facts.packages.driver_package_version or ""

    @property
    def driver_base(self) -> dict[str, Any]:
        """``base`` and the driver: the fields every plan past the flavour rule carries."""
        return {**self.base, "driver_package": self.facts.packages.driver_package, "driver_version": self.driver}

    @cached_property
    def candidates(self) -> dict[str, str | None]:
        """Releases of the booted flavour, newer than the booted one, offered by apt or installed -> image version."""
        now = self.now
        out: dict[str, str | None] = {}
        if now is None:  # past the flavour rule, never
            return out
        for name, offers in self.available.items():
            if offers and name.startswith("linux-image-") and not name.startswith("linux-image-unsigned-"):
                rel = parse_release(name[len("linux-image-"):])
                if rel is not None and rel.flavour == self.flavour and rel.sort_key() > now.sort_key():
                    out[rel.release] = _newest(offers).version
        for k in self.facts.packages.kernels:
            rel = parse_release(k.release)
            if rel is not None and rel.flavour == self.flavour and rel.sort_key() > now.sort_key():
                out.setdefault(k.release, k.image_version)
        return out

    @cached_property
    def target(self) -> str:
        """``--kernel``, else the newest candidate."""
        if self.kernel:
            return self.kernel
        return max(self.candidates, key=lambda r: parse_release(r).sort_key())  # type: ignore[union-attr]

    @property
    def installed(self) -> KernelPackage | None:
        """The target kernel's installed package, or None."""
        return self.facts.packages.kernel(self.target)

    @cached_property
    def _source(self) -> tuple[str, str]:
        return choose_module_source(self.module_source, self.facts.secure_boot.enabled)

    @property
    def source(self) -> str:
        """``signed`` | ``dkms``: where the target's module comes from."""
        return self._source[0]

    @property
    def reason(self) -> str:
        return self._source[1]

    @property
    def branch(self) -> str | None:
        branch = self.facts.packages.driver_branch
        return branch if is_branch(branch) else None  # host output: a name, or nothing

    @property
    def signed_package(self) -> str:
        return signed_module_package(self.branch or "", self.target)

    @property
    def signed_offers(self) -> tuple[Available, ...]:
        return tuple(self.available.get(self.signed_package, ()))

    @property
    def has_signed(self) -> bool:
        """The target's signed module package is installed."""
        return self.installed is not None and self.signed_package in self.installed.signed_module_packages

    @property
    def signed_build(self) -> Available | None:
        """The build of the signed module package apt offers for the installed driver (None when it is installed)."""
        return signed_build_for(self.signed_offers, self.driver) if not self.has_signed else None

    @property
    def headers(self) -> str:
        return f"linux-headers-{self.target}"

    @property
    def needs_headers(self) -> bool:
        """The target's headers are not installed (the DKMS build needs them)."""
        return self.installed is None or not self.installed.headers_installed

    @property
    def module_fields(self) -> dict[str, Any]:
        """The target and its module source, for a plan that names them."""
        return {"target_kernel": self.target, "module_source": self.source, "module_source_reason": self.reason}


@dataclass(frozen=True)
class _Rule:
    """When ``applies(case)``, ``plan(case)`` is the host's plan; a ``guarded`` one then passes _GUARDS."""

    name: str
    applies: Callable[[_Case], bool]
    plan: Callable[[_Case], KernelPlan]
    guarded: bool = False


def _left_alone(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "skip", f"left alone: {c.cordoned}", blocked=c.cordoned, **c.base)


def _unhealthy(c: _Case) -> bool:
    pkgs = c.facts.packages
    return not c.facts.nvml.ok or not pkgs.driver_package or not pkgs.driver_package_version


def _repair_first(c: _Case) -> KernelPlan:
    why = f"NVML {c.facts.nvml.error_class}" if not c.facts.nvml.ok else "no NVIDIA driver package installed"
    return KernelPlan(c.host, "skip", f"left alone: {why}: repair the host first (invoke driver-restore)",
                      blocked=why, **c.base)


def _no_flavour(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "skip", f"left alone: booted kernel {c.booted!r} names no flavour",
                      blocked="unknown kernel flavour", **c.base)


def _kernel_not_of_the_flavour(c: _Case) -> bool:
    if not c.kernel:
        return False
    wanted = parse_release(c.kernel)
    return wanted is None or wanted.flavour != c.flavour


def _wrong_flavour(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "skip", f"left alone: --kernel {c.kernel} is not a {c.flavour} kernel release",
                      blocked=f"--kernel {c.kernel}: the host boots the {c.flavour} flavour", **c.driver_base)


def _already_booted(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "none", f"already booted into {c.kernel}", target_kernel=c.kernel, **c.driver_base)


def _kernel_unavailable(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "skip", f"left alone: {c.kernel} is neither offered by apt nor installed, or not "
                      f"newer than {c.booted}", blocked=f"--kernel {c.kernel} not available", **c.driver_base)


def _newest_already(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "none", f"already on the newest {c.flavour} kernel apt offers ({c.booted})",
                      **c.driver_base)


def _no_branch(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "skip", "left alone: no driver branch to name the signed module package",
                      blocked="no NVIDIA driver branch", **c.driver_base)


def _no_signed_package(c: _Case) -> KernelPlan:
    package = c.signed_package
    return KernelPlan(c.host, "skip", f"left alone: apt offers no {package} ({c.reason})",
                      blocked=f"{package} not available", **c.module_fields, **c.driver_base)


def _no_signed_build(c: _Case) -> KernelPlan:
    package, driver = c.signed_package, c.driver
    made = ", ".join(f"{o.version} (driver {_signed_built_for(o.depends) or '?'})" for o in c.signed_offers)
    return KernelPlan(c.host, "skip", f"left alone: no build of {package} for driver {driver} (apt has {made})",
                      blocked=f"{package} has no build for driver {driver}", **c.module_fields, **c.driver_base)


def _no_headers(c: _Case) -> KernelPlan:
    return KernelPlan(c.host, "skip", f"left alone: apt offers no {c.headers} for the DKMS build",
                      blocked=f"{c.headers} not available", **c.module_fields, **c.driver_base)


def _kernel_packages(c: _Case) -> tuple[list[str], list[str], list[str]]:
    """(install, install specs, hold) for the target kernel itself: its image (unless installed) and modules."""
    image = f"linux-image-{c.target}"
    install: list[str] = [] if c.installed is not None else [image]
    return install, list(install), [image, f"linux-modules-{c.target}"]


def _update(c: _Case, install: list[str], specs: list[str], hold: list[str], steps: list[str]) -> KernelPlan:
    """The update plan: unhold what must move, the module source's ``steps``, the gates, the reboot and the holds."""
    held = c.facts.packages.held
    booted, target, driver = c.booted, c.target, c.driver
    unhold = tuple(p for p in hold if p in held)
    steps = [
        *([f"unhold {', '.join(unhold)}"] if unhold else ["unhold nothing: the target's packages are new names; "
                                                          "the flavour's meta-packages stay held"]),
        *steps,
        f"gate 1: nvidia.ko for {target} exists, carries {driver} and loads with Secure Boot "
        f"{c.facts.secure_boot.state} (else undo and stop)",
        f'GRUB_DEFAULT=saved + update-grub, saved default "{grub_default_for(booted)}"',
        f'grub-reboot "{grub_default_for(target)}" (one-shot), reboot (needs --allow-reboot)',
        f"gate 2: running {target} and NVML answers with {driver}",
        f"success: grub-set-default {target} + update-grub; failure: boot back into {booted}, undo",
        f"hold {', '.join(dict.fromkeys(hold))}; the unattended-upgrades blacklist stays",
    ]
    return KernelPlan(
        c.host, "update", f"{booted} -> {target} ({c.flavour}, module: {c.source})", target_kernel=target,
        target_version=c.candidates.get(target), module_source=c.source, module_source_reason=c.reason,
        install_packages=tuple(install), install_specs=tuple(specs), unhold_packages=unhold,
        hold_packages=tuple(dict.fromkeys(p for p in hold if p not in held or p in unhold)),
        steps=tuple(steps), **c.driver_base,
    )


def _update_signed(c: _Case) -> KernelPlan:
    install, specs, hold = _kernel_packages(c)
    package, build = c.signed_package, c.signed_build
    if not c.has_signed and build is not None:
        install.append(package)
        specs.append(f"{package}={build.version}")
    hold.append(package)
    return _update(c, install, specs, hold, [
        f"install {' '.join(specs) or 'nothing (installed)'}: {c.target} with Canonical's signed module "
        f"built for {c.driver} ({c.reason})",
    ])


def _update_dkms(c: _Case) -> KernelPlan:
    install, specs, hold = _kernel_packages(c)
    if c.needs_headers:
        install.append(c.headers)
        specs.append(c.headers)
    hold.append(c.headers)
    return _update(c, install, specs, hold, [
        f"install {' '.join(install) or 'nothing (installed)'} ({c.reason})",
        f"dkms autoinstall -k {c.target} (builds nvidia {c.driver})",
    ])


_RULES: tuple[_Rule, ...] = (
    _Rule("cordoned by someone else: left alone", lambda c: bool(c.cordoned), _left_alone),
    _Rule("not a healthy GPU host (NVML fails, no driver package): repair it first", _unhealthy, _repair_first),
    _Rule("the booted kernel names no flavour", lambda c: c.now is None or c.flavour is None, _no_flavour),
    _Rule("--kernel is not a release of the booted flavour", _kernel_not_of_the_flavour, _wrong_flavour),
    _Rule("--kernel is the booted kernel: nothing to do", lambda c: bool(c.kernel) and c.kernel == c.booted,
          _already_booted),
    _Rule("--kernel neither offered by apt nor installed, or not newer",
          lambda c: bool(c.kernel) and c.kernel not in c.candidates, _kernel_unavailable),
    _Rule("nothing newer of the booted flavour: nothing to do", lambda c: not c.kernel and not c.candidates,
          _newest_already),
    _Rule("signed module, no driver branch to name its package", lambda c: c.source == "signed" and not c.branch,
          _no_branch),
    _Rule("signed module package neither installed nor offered",
          lambda c: c.source == "signed" and not c.has_signed and not c.signed_offers, _no_signed_package),
    _Rule("signed module package offered, no build for the installed driver",
          lambda c: c.source == "signed" and not c.has_signed and c.signed_build is None, _no_signed_build),
    _Rule("DKMS, headers neither installed nor offered",
          lambda c: c.source == "dkms" and c.needs_headers and not c.available.get(c.headers), _no_headers),
    _Rule("update with Canonical's signed module", lambda c: c.source == "signed", _update_signed, True),
    _Rule("update with a DKMS build", lambda c: True, _update_dkms, True),
)


@dataclass(frozen=True)
class _Guard:
    """A reason to leave a guarded plan undone: ``blocks(case)`` says why, or None."""

    name: str
    blocks: Callable[[_Case], str | None]


def _dpkg_locked(c: _Case) -> str | None:
    if not c.facts.dpkg_lock.held:
        return None
    return f"dpkg lock held by {c.facts.dpkg_lock.holder_comm or 'another process'}"


def _gpu_work_running(c: _Case) -> str | None:
    work = _gpu_work(c.facts)
    if not work or c.force:
        return None
    return "GPU work running (" + "; ".join(work[:4]) + "): pass --force to update anyway"


_GUARDS: tuple[_Guard, ...] = (
    _Guard("the dpkg lock is held", _dpkg_locked),
    _Guard("GPU work runs (unless --force)", _gpu_work_running),
)


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
    """The plan for one host (see the module docstring): the first of _RULES that applies; a guarded rule's plan
    then passes _GUARDS. ``available``: :func:`parse_available` of the host."""
    ids = tuple(sorted({f.id for f in findings}))
    if facts is None:
        return KernelPlan(host, "skip", "left alone: not probed", blocked=not_probed or "not probed", findings=ids)
    base: dict[str, Any] = {"booted_kernel": facts.system.kernel, "flavour": facts.system.kernel_flavour,
                            "secure_boot": facts.secure_boot.enabled, "findings": ids}
    case = _Case(host, facts, available, kernel, module_source, force, is_cordoned(host_vars, cordon_marker), base)
    rule = next(r for r in _RULES if r.applies(case))
    plan = rule.plan(case)
    if not rule.guarded:
        return plan
    blocked = next((why for guard in _GUARDS if (why := guard.blocks(case)) is not None), None)
    return plan if blocked is None else replace(plan, blocked=blocked)
