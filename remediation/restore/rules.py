"""The restore's planning rules: findings + facts of one host -> what to do there (pure, no I/O).

The same function decides in the Python flow (``invoke driver-restore``) and in the playbook
(``playbooks/driver_restore.yml``, through the role's ``gpufleet_restore_decision`` filter), so a host is
never planned one way on the terminal and changed another way by Ansible.

Rules, first match wins:

1. Not probed (unreachable, probe failed) -> left alone, reported.
2. Cordoned by someone else (inventory ``gpufleet_cordoned: true`` or the marker file
   ``/etc/gpufleet/cordoned`` on the host) -> left alone, reported.
3. A GPU lost / fallen off the bus (GPU-HW-001) or a row-remap failure (GPU-HW-004 with a GPU whose
   remapping failed) -> ``not-driver``: no change; "redeploy the VM / open a support case".
4. Driver not installed (GPU-DRV-003) -> ``install`` the expected version (``nvidia_driver_expected_version``).
5. Module missing for the booted kernel (GPU-DRV-001), or present but refused by Secure Boot (GPU-DRV-008) ->
   ``rebuild`` or ``previous-kernel`` (boot the newest installed kernel whose module loads, through GRUB_DEFAULT
   and ``update-grub``), by preference; ``previous-kernel`` with no such kernel falls back to ``rebuild``. The
   module source of a rebuild (:func:`choose_module_source`): DKMS (headers of the kernel, the driver package
   reinstalled at its installed version: DKMS builds the module) or Ubuntu's signed precompiled package
   ``linux-modules-nvidia-<branch>-<kernel>``: ``module_source: auto`` picks the signed package when Secure Boot is on
   and DKMS when it is off or cannot be told; a DKMS build of that kernel
   that Secure Boot refuses is removed (it sits in ``updates/dkms`` and would shadow the signed one). GPU-DRV-008
   with ``module_source: dkms`` is ``manual``: DKMS cannot fix a Secure Boot rejection.
6. Userspace/kernel module mismatch (GPU-DRV-002) -> ``reboot`` (reloads the module; the lab has no reload).
7. Predictive (GPU-KRN-001: a newer installed kernel has no module, NVML still answers) -> ``rebuild`` for that
   kernel (its headers, the driver reinstalled: DKMS builds the module), no reboot: the catalog's remedy.
8. NVML answers -> ``none``.
9. Any other NVML failure (GPU-DRV-004/006, GPU-HW-006/007/008, ...) -> ``manual``: no automatic change.

Guards, for the actions that change a host: a dpkg lock held (GPU-APT-001) and running GPU work leave the host
alone (``--force`` overrides the latter only). GPU work is what NVML lists and every process holding an NVIDIA
device file open (read from ``/proc`` by the probe, so it holds when NVML is down: a driver/library mismatch keeps
the old module loaded and its jobs running). When NVML failed and the probe could not read the device users
either, the host is left alone too: nobody can say that no job runs there.

Every changing action ends by holding the kernel the host will run (image, headers, its signed module package, the
kernel meta-packages of the booted kernel's flavour) and the NVIDIA driver packages (GPU-KRN-002): only names dpkg
knows, only those not held already (a hold that was
there before is never touched, so it is never undone either).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from remediation.core.checks.debversion import compare_versions
from remediation.core.checks.kernel import kernel_newer
from remediation.core.facts import HostFacts, KernelPackage
from remediation.core.findings import Finding
from remediation.core.kernelflavour import (
    branch_number,
    driver_install_packages,
    flavour_metas,
    is_branch,
    signed_module_package,
)
from remediation.rollout.cordon import CORDON_MARKER

__all__ = [
    "CHANGING",
    "HARDWARE_ADVICE",
    "METHOD_NAMES",
    "MODULE_SOURCES",
    "Action",
    "Decision",
    "Prefer",
    "choose_module_source",
    "decide",
    "gpu_processes",
    "grub_default_for",
    "is_cordoned",
    "kernel_meta",
    "resolve_method",
]

#: The ways a host's driver can be restored; ``auto`` reads the host's ``driver_restore_method``.
METHOD_NAMES = ("apt", "azure-extension")


def resolve_method(requested: str, host_vars: Mapping[str, Any]) -> str:
    """The restore method for one host: ``requested``, or with ``auto`` the host's ``driver_restore_method``.

    The CLI (``--method``) and the playbook (``nvidia_driver_restore_method``) both decide with this function.
    Raises ``ValueError`` naming the bad value and where it came from.
    """
    name = str(requested or "auto")
    source = "--method"
    if name == "auto":
        name, source = str(host_vars.get("driver_restore_method") or "apt"), "the inventory's driver_restore_method"
    if name not in METHOD_NAMES:
        raise ValueError(f"restore method {name!r} (from {source}) is not one of auto, {', '.join(METHOD_NAMES)}")
    return name


HARDWARE_ADVICE = "not a driver problem: redeploy the VM (az vm redeploy) or open a support case; nothing changed"
#: Where a rebuilt module comes from: ``auto`` (signed under Secure Boot, else DKMS), ``dkms``, ``signed``.
MODULE_SOURCES = ("auto", "dkms", "signed")


def kernel_meta(facts: HostFacts) -> tuple[str, ...]:
    """The installed kernel meta-packages of the booted kernel's flavour (they pull its next kernel in)."""
    return flavour_metas(facts.packages.kernel_meta_names, facts.system.kernel_flavour)


def choose_module_source(setting: str, secure_boot: bool | None) -> tuple[str, str]:
    """(``dkms`` | ``signed``, why) for one host: the setting, or with ``auto`` the host's Secure Boot state."""
    if setting not in MODULE_SOURCES:
        raise ValueError(f"module_source {setting!r} is not one of {', '.join(MODULE_SOURCES)}")
    if setting == "dkms":
        return "dkms", "module_source: dkms (configured)"
    if setting == "signed":
        return "signed", "module_source: signed (configured)"
    if secure_boot is True:
        return "signed", ("Secure Boot is on: a DKMS-built module is unsigned and the kernel would refuse it; "
                          "Ubuntu's signed precompiled module loads")
    if secure_boot is None:
        return "dkms", ("Secure Boot state unknown (no EFI variable, no mokutil): DKMS as on hosts without it; "
                        "set module_source: signed for Trusted Launch VMs")
    return "dkms", "Secure Boot is off: DKMS builds the module"


class Action(StrEnum):
    NONE = "none"  # healthy: nothing to do
    REBUILD = "rebuild"  # headers for the booted kernel + reinstall the driver at its installed version
    PREVIOUS_KERNEL = "previous-kernel"  # GRUB_DEFAULT -> newest kernel with a module, then reboot
    REBOOT = "reboot"  # userspace/kernel mismatch: reload = reboot
    INSTALL = "install"  # driver not installed: install the expected version
    NOT_DRIVER = "not-driver"  # hardware: no change, redeploy / support case
    MANUAL = "manual"  # a failure these rules do not repair automatically
    SKIP = "skip"  # not probed / cordoned: left alone


CHANGING = frozenset({Action.REBUILD, Action.PREVIOUS_KERNEL, Action.REBOOT, Action.INSTALL})


class Prefer(StrEnum):
    REBUILD = "rebuild"
    PREVIOUS_KERNEL = "previous-kernel"


@dataclass(frozen=True)
class Decision:
    """What the restore does on one host, and why. ``blocked`` set: a guard leaves the host alone."""

    host: str
    action: Action
    reason: str
    findings: tuple[str, ...] = ()
    blocked: str | None = None
    booted_kernel: str | None = None
    target_kernel: str | None = None  # the kernel the host runs once restored
    driver_package: str | None = None
    driver_version: str | None = None  # Debian version to pin (rebuild: installed; install: resolved on host)
    expected_version: str | None = None  # upstream version the gate expects from NVML
    module_source: str | None = None  # rebuild: "dkms" | "signed"
    module_source_reason: str = ""
    dkms_remove: str | None = None  # rebuild/signed: the DKMS module version to remove from the target kernel
    install_packages: tuple[str, ...] = ()  # packages this run installs that were not installed before
    hold_packages: tuple[str, ...] = ()  # packages this run holds that were not held before
    needs_reboot: bool = False
    steps: tuple[str, ...] = ()

    @property
    def changes_host(self) -> bool:
        return self.action in CHANGING and self.blocked is None

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-ready (the playbook reads this as its per-host decision)."""
        return {
            "host": self.host,
            "action": self.action.value,
            "reason": self.reason,
            "findings": list(self.findings),
            "blocked": self.blocked,
            "changes_host": self.changes_host,
            "booted_kernel": self.booted_kernel,
            "target_kernel": self.target_kernel,
            "driver_package": self.driver_package,
            "driver_version": self.driver_version,
            "expected_version": self.expected_version,
            "module_source": self.module_source,
            "module_source_reason": self.module_source_reason,
            "dkms_remove": self.dkms_remove,
            "install_packages": list(self.install_packages),
            "hold_packages": list(self.hold_packages),
            "needs_reboot": self.needs_reboot,
            "grub_default": grub_default_for(self.target_kernel) if self.action is Action.PREVIOUS_KERNEL else None,
            "steps": list(self.steps),
        }


def grub_default_for(kernel: str | None) -> str:
    """The GRUB_DEFAULT value that boots ``kernel`` from Ubuntu's "Advanced options" submenu."""
    return f"Advanced options for Ubuntu>Ubuntu, with Linux {kernel}"


def is_cordoned(host_vars: Mapping[str, Any], marker_text: str | None) -> str | None:
    """Why the host is cordoned by someone else, or None. ``marker_text``: the marker file's text, None if absent."""
    flag = host_vars.get("gpufleet_cordoned")
    if flag is True or str(flag).lower() in ("true", "yes", "1"):
        return "cordoned in the inventory (gpufleet_cordoned: true)"
    if marker_text is not None:
        note = " ".join(marker_text.split())[:200]
        return f"cordoned on the host ({CORDON_MARKER}{': ' + note if note else ''})"
    return None


def _remap_failed(facts: HostFacts) -> bool:
    return any(g.remapped_rows is not None and g.remapped_rows.failure for g in facts.nvml.gpus)


def gpu_processes(facts: HostFacts) -> list[str]:
    """GPU work on the host: NVML's compute processes, and every process holding an NVIDIA device file open.

    The second source needs no NVML, so it still sees jobs when NVML fails (a driver/library mismatch leaves the
    old module loaded and its jobs running). Driver services (persistenced, fabric manager, DCGM) are not work.
    """
    out, seen = [], set()
    for g in facts.nvml.gpus:
        for p in g.processes:
            seen.add(p.pid)
            out.append(f"GPU {g.index}: pid {p.pid} ({p.name or '?'})")
    for user in facts.device_users.workloads:
        if user.pid not in seen:
            seen.add(user.pid)
            out.append(user.label)
    return out


def _cannot_tell(facts: HostFacts) -> str | None:
    """Why the host's GPU work is unknown while NVML fails (the /proc scan is then the only witness), or None."""
    users = facts.device_users
    if facts.unprivileged:
        return (f"cannot tell whether GPU jobs run: NVML failed and the probe ran as uid {facts.euid} without sudo, so "
                "other users' processes were invisible to it (set ansible_become: true for this host, or pass --force "
                "to restore anyway)")
    if not users.available:
        return ("cannot tell whether GPU jobs run: NVML failed and the probe could not list the processes holding "
                "/dev/nvidia* (update the probe, or pass --force to restore anyway)")
    if users.unreadable > 0:
        return (f"cannot tell whether GPU jobs run: NVML failed and the probe could not read the open files of "
                f"{users.unreadable} processes (run the probe as root, or with sudo, or pass --force "
                "to restore anyway)")
    return None


def _installed_debian_version(facts: HostFacts, package: str | None) -> str | None:
    if package is None:
        return None
    return dict(facts.packages.nvidia).get(package) or None


def _newest_kernel_with_module(facts: HostFacts) -> str | None:
    candidates = [k for k in facts.packages.kernels if k.has_nvidia_module and k.release != facts.system.kernel
                  and k.nvidia_module.would_load is not False]
    if not candidates:
        return None
    best = candidates[0]
    for k in candidates[1:]:
        if compare_versions(k.image_version or k.release, best.image_version or best.release) > 0:
            best = k
    return best.release


def _newest_kernel_without_module(facts: HostFacts) -> str | None:
    booted = facts.booted_kernel
    newer = [k for k in facts.packages.kernels
             if (not k.has_nvidia_module or k.nvidia_module.rejected_by_secure_boot)
             and k.release != facts.system.kernel and kernel_newer(k, facts.system.kernel or "", booted)]
    if not newer:
        return None
    best = newer[0]
    for k in newer[1:]:
        if kernel_newer(k, best.release, best):
            best = k
    return best.release


def _holds(
    facts: HostFacts, kernel: str | None, driver_names: Sequence[str], headers: bool, extra: Sequence[str] = ()
) -> tuple[str, ...]:
    """Packages to hold that dpkg knows (or that this run installs) and that are not held yet."""
    wanted: list[str] = []
    k = facts.packages.kernel(kernel)
    if k is not None:
        wanted.append(k.image_package)
        if k.headers_installed or headers:
            wanted.append(f"linux-headers-{k.release}")
        wanted.extend(k.signed_module_packages)
    wanted.extend(extra)
    wanted.extend(kernel_meta(facts))
    wanted.extend(driver_names)
    held = facts.packages.held
    return tuple(dict.fromkeys(n for n in wanted if n not in held))


def _rebuild(
    host: str,
    facts: HostFacts,
    ids: tuple[str, ...],
    kernel: str | None,
    setting: str,
    driver_names: tuple[str, ...],
    *,
    needs_reboot: bool,
    why: str,
    gate: str | None,
    base: dict[str, Any],
) -> Decision:
    """A module for ``kernel``, from DKMS or from the signed precompiled package (:func:`choose_module_source`)."""
    pkgs = facts.packages
    driver = pkgs.driver_package
    version = _installed_debian_version(facts, driver)
    k: KernelPackage | None = pkgs.kernel(kernel)
    source, reason = choose_module_source(setting, facts.secure_boot.enabled)
    refused = k is not None and k.nvidia_module.rejected_by_secure_boot
    tail = ("hold kernel and driver packages", "reboot" if needs_reboot else "no reboot needed",
            f"gate: NVML answers with {gate or 'the installed driver'}")
    if source == "dkms":
        if refused:
            return Decision(
                host, Action.MANUAL, f"{why}; {reason}: a DKMS module is unsigned and Secure Boot refuses it",
                ids, blocked="module_source dkms cannot fix a Secure Boot rejection: set module_source to auto or "
                "signed", **base,
            )
        headers = f"linux-headers-{kernel}"
        install = () if k is not None and k.headers_installed else (headers,)
        return Decision(
            host, Action.REBUILD, f"{why}: build it with DKMS ({reason})", ids,
            target_kernel=kernel, driver_package=driver, driver_version=version, install_packages=install,
            hold_packages=_holds(facts, kernel if needs_reboot else facts.system.kernel, driver_names,
                                 headers=needs_reboot),
            needs_reboot=needs_reboot, module_source="dkms", module_source_reason=reason,
            steps=(f"install {headers}" if install else f"{headers} already installed",
                   f"dkms autoinstall -k {kernel} (DKMS builds the registered module of {driver} {version})", *tail),
            **base,
        )
    branch = pkgs.driver_branch if is_branch(pkgs.driver_branch) else None  # host output: a name, or nothing
    if not branch or kernel is None:
        return Decision(host, Action.MANUAL, f"{why}; no driver branch known to name the signed module package",
                        ids, blocked="no NVIDIA driver branch installed", **base)
    package = signed_module_package(branch, kernel)
    installed = k is not None and package in k.signed_module_packages
    dkms_version = None
    if k is not None and k.nvidia_module.source == "dkms":
        dkms_version = k.nvidia_module.version or _upstream(version) or None
    install = () if installed else (package,)
    steps = [f"install {package} (signed by Canonical; {reason})" if install else f"{package} already installed"]
    if dkms_version:
        steps.append(f"remove the DKMS build nvidia/{dkms_version} of {kernel} (updates/dkms would shadow it)")
    return Decision(
        host, Action.REBUILD, f"{why}: install the signed precompiled module ({reason})", ids,
        target_kernel=kernel, driver_package=driver, driver_version=version, install_packages=install,
        hold_packages=_holds(facts, kernel if needs_reboot else facts.system.kernel, driver_names, headers=False,
                             extra=(package,) if needs_reboot else ()),
        needs_reboot=needs_reboot, module_source="signed", module_source_reason=reason, dkms_remove=dkms_version,
        steps=(*steps, *tail), **base,
    )


def _install_branch(
    host_vars: Mapping[str, Any], left: str | None, expected: str
) -> tuple[str | None, str | None]:
    """The branch to install on a host without a driver, and why there is none: ``nvidia_driver_branch`` from the
    inventory, else the branch packages left on the host name (``nvidia-kernel-common-535-server``, the probe's
    ``driver_branch``) when its number is the expected version's. The version alone never names a branch: 535.183.01
    is ``535``, ``535-server`` and ``535-open`` alike, each with its own packages."""
    wanted = host_vars.get("nvidia_driver_branch")
    if wanted:
        wanted = str(wanted)
        if not is_branch(wanted):
            return None, f"nvidia_driver_branch {wanted!r} is not a driver branch (535, 535-server, 535-open)"
        return wanted, None
    major = expected.split(".")[0]
    if left and is_branch(left) and branch_number(left) == major:
        return left, None
    return None, (f"nvidia_driver_branch is not set for this host and nothing installed names the branch of"
                  f" {expected} ({major}, {major}-server or {major}-open): set nvidia_driver_branch")


def _upstream(debian_version: str | None) -> str:
    """``535.216.01-0ubuntu0.22.04.1`` -> ``535.216.01`` (epoch and Debian revision dropped)."""
    if not debian_version:
        return ""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


@dataclass(frozen=True)
class _Case:
    """What the restore rules read about one probed host."""

    host: str
    facts: HostFacts
    ids: tuple[str, ...]  # the host's finding IDs, sorted
    host_vars: Mapping[str, Any]
    prefer: Prefer
    force: bool
    module_source: str
    cordoned: str | None
    expected: str | None  # nvidia_driver_expected_version
    base: dict[str, Any]  # the fields every decision past the cordon check carries

    def has(self, *finding_ids: str) -> bool:
        return any(i in self.ids for i in finding_ids)

    @property
    def driver_names(self) -> tuple[str, ...]:
        """The installed NVIDIA driver packages (``nvidia-*``, ``libnvidia-*``) a restore holds."""
        return tuple(n for n in self.facts.packages.nvidia_names if n.startswith(("nvidia-", "libnvidia-")))

    @property
    def driver_version(self) -> str | None:
        """The installed Debian version of the driver package."""
        return _installed_debian_version(self.facts, self.facts.packages.driver_package)


@dataclass(frozen=True)
class _Rule:
    """When ``applies(case)``, ``decide(case)`` is the host's decision; a ``guarded`` one then passes _GUARDS."""

    name: str
    applies: Callable[[_Case], bool]
    decide: Callable[[_Case], Decision]
    guarded: bool = False


def _left_alone(c: _Case) -> Decision:
    return Decision(c.host, Action.SKIP, f"left alone: {c.cordoned}", c.ids, blocked=c.cordoned)


def _hardware_failed(c: _Case) -> bool:
    return c.has("GPU-HW-001") or ("GPU-HW-004" in c.ids and _remap_failed(c.facts))


def _not_driver(c: _Case) -> Decision:
    which = "GPU lost (fallen off the bus, Xid 79)" if c.has("GPU-HW-001") else "row remapping failed"
    return Decision(c.host, Action.NOT_DRIVER, f"{which}: {HARDWARE_ADVICE}", c.ids, **c.base)


def _no_expected_version(c: _Case) -> Decision:
    return Decision(
        c.host, Action.MANUAL, "driver not installed and no nvidia_driver_expected_version in the inventory",
        c.ids, blocked="nvidia_driver_expected_version is not set for this host", **c.base,
    )


def _branch(c: _Case) -> tuple[str | None, str | None]:
    return _install_branch(c.host_vars, c.facts.packages.driver_branch, c.expected or "")


def _no_branch(c: _Case) -> Decision:
    problem = _branch(c)[1]
    return Decision(c.host, Action.MANUAL, f"driver not installed: {problem}", c.ids, blocked=problem, **c.base)


def _install(c: _Case) -> Decision:
    branch, expected, booted = _branch(c)[0], c.expected or "", c.facts.system.kernel
    names = driver_install_packages(branch or "")
    driver = names[0]
    return Decision(
        c.host, Action.INSTALL, f"driver not installed: install {driver} {expected}", c.ids,
        target_kernel=booted, driver_package=driver, driver_version=None,
        install_packages=tuple(n for n in names if n not in c.facts.packages.nvidia_names),
        hold_packages=_holds(c.facts, booted, names, headers=False), needs_reboot=True,
        steps=(f"install {driver}={expected}-* (version resolved on the host)", "hold kernel and driver packages",
               "reboot", "gate: NVML answers with " + expected),
        **c.base,
    )


def _module_missing(c: _Case) -> bool:
    return c.has("GPU-DRV-001", "GPU-DRV-008")


def _what_is_missing(c: _Case) -> str:
    refused = "GPU-DRV-008" in c.ids and "GPU-DRV-001" not in c.ids
    return "a module Secure Boot refuses" if refused else "no NVIDIA module"


def _previous_kernel_preferred(c: _Case) -> bool:
    if not _module_missing(c):
        return False
    previous = _newest_kernel_with_module(c.facts)
    return c.prefer is Prefer.PREVIOUS_KERNEL and previous is not None


def _previous_kernel(c: _Case) -> Decision:
    previous, booted = _newest_kernel_with_module(c.facts), c.facts.system.kernel
    return Decision(
        c.host, Action.PREVIOUS_KERNEL,
        f"booted kernel {booted} has {_what_is_missing(c)}; {previous} has one that loads: boot it (GRUB_DEFAULT)",
        c.ids, target_kernel=previous, driver_package=c.facts.packages.driver_package,
        driver_version=c.driver_version, hold_packages=_holds(c.facts, previous, c.driver_names, headers=False),
        needs_reboot=True,
        steps=(f'set GRUB_DEFAULT="{grub_default_for(previous)}"', "update-grub",
               "hold kernel and driver packages", f"reboot into {previous}",
               f"gate: NVML answers with {c.expected or 'the installed driver'}"),
        **c.base,
    )


def _nothing_to_rebuild(c: _Case) -> Decision:
    return Decision(
        c.host, Action.MANUAL, "module missing but no NVIDIA driver package installed to rebuild from",
        c.ids, blocked="no driver package to reinstall", **c.base,
    )


def _rebuild_booted(c: _Case) -> Decision:
    booted = c.facts.system.kernel
    previous = _newest_kernel_with_module(c.facts)
    note = "" if c.prefer is Prefer.REBUILD or previous else " (no other kernel has a module that loads)"
    return _rebuild(c.host, c.facts, c.ids, booted, c.module_source, c.driver_names, needs_reboot=True,
                    why=f"booted kernel {booted} has {_what_is_missing(c)}{note}", gate=c.expected, base=c.base)


def _userspace_not_expected(c: _Case) -> bool:
    return c.has("GPU-DRV-002") and bool(c.expected) and not _upstream(c.driver_version).startswith(c.expected or "")


def _userspace_differs(c: _Case) -> Decision:
    # A reboot would load the module of the installed userspace, not the fleet's driver: the gate would fail
    # and the run would be undone. Whoever upgraded the driver decides: downgrade it or change the fleet's version.
    installed = _upstream(c.driver_version) or "unknown"
    return Decision(
        c.host, Action.MANUAL,
        f"driver userspace {installed} differs from the fleet's expected {c.expected}: a reboot would load"
        f" {installed}; install {c.expected} or set nvidia_driver_expected_version to {installed}",
        c.ids, **c.base,
    )


def _reboot(c: _Case) -> Decision:
    booted = c.facts.system.kernel
    return Decision(
        c.host, Action.REBOOT, "driver userspace and loaded kernel module differ: reboot to load the module", c.ids,
        target_kernel=booted, driver_package=c.facts.packages.driver_package, driver_version=c.driver_version,
        hold_packages=_holds(c.facts, booted, c.driver_names, headers=False), needs_reboot=True,
        steps=("hold kernel and driver packages", "reboot", f"gate: NVML answers with {c.expected or 'the driver'}"),
        **c.base,
    )


def _newer_kernel_without_module(c: _Case) -> bool:
    return c.has("GPU-KRN-001") and bool(c.facts.packages.driver_package) and bool(c.driver_version)


def _rebuild_newer(c: _Case) -> Decision:
    # Predictive: a newer installed kernel has no module (or one Secure Boot refuses); build it now so the next
    # reboot keeps the GPUs.
    newer = _newest_kernel_without_module(c.facts)
    return _rebuild(c.host, c.facts, c.ids, newer, c.module_source, c.driver_names, needs_reboot=False,
                    why=f"kernel {newer} is installed without a module that loads: provide it before a reboot",
                    gate=None, base=c.base)


def _healthy(c: _Case) -> Decision:
    return Decision(c.host, Action.NONE, "NVML answers: nothing to restore", c.ids, **c.base)


def _unrepaired(c: _Case) -> Decision:
    return Decision(
        c.host, Action.MANUAL,
        f"NVML {c.facts.nvml.error_class}: not repaired automatically; see the audit's runbook", c.ids, **c.base,
    )


_RULES: tuple[_Rule, ...] = (
    _Rule("cordoned by someone else: left alone", lambda c: bool(c.cordoned), _left_alone),
    _Rule("GPU lost or row remapping failed: not the driver", _hardware_failed, _not_driver),
    _Rule("driver not installed, no expected version", lambda c: c.has("GPU-DRV-003") and not c.expected,
          _no_expected_version),
    _Rule("driver not installed, no branch to install", lambda c: c.has("GPU-DRV-003") and _branch(c)[0] is None,
          _no_branch),
    _Rule("driver not installed: install the expected version", lambda c: c.has("GPU-DRV-003"), _install, True),
    _Rule("no module that loads: boot the previous kernel (if preferred)", _previous_kernel_preferred,
          _previous_kernel, True),
    _Rule("no module that loads and no driver package to rebuild from",
          lambda c: _module_missing(c) and (c.facts.packages.driver_package is None or c.driver_version is None),
          _nothing_to_rebuild),
    _Rule("no module that loads: provide it for the booted kernel", _module_missing, _rebuild_booted, True),
    _Rule("userspace/module mismatch, userspace not the fleet's version", _userspace_not_expected,
          _userspace_differs, True),
    _Rule("userspace/module mismatch: reboot", lambda c: c.has("GPU-DRV-002"), _reboot, True),
    _Rule("a newer kernel has no module that loads: provide it now", _newer_kernel_without_module, _rebuild_newer,
          True),
    _Rule("NVML answers: nothing to restore", lambda c: c.facts.nvml.ok, _healthy),
    _Rule("any other NVML failure: a person decides", lambda c: True, _unrepaired),
)


@dataclass(frozen=True)
class _Guard:
    """A reason to leave a guarded decision undone: ``blocks(case)`` says why, or None."""

    name: str
    blocks: Callable[[_Case], str | None]


def _dpkg_locked(c: _Case) -> str | None:
    if "GPU-APT-001" not in c.ids and not c.facts.dpkg_lock.held:
        return None
    holder = c.facts.dpkg_lock.holder_comm or "another process"
    return f"dpkg lock held by {holder} (pid {c.facts.dpkg_lock.holder_pid or '?'})"


def _gpu_work(c: _Case) -> str | None:
    procs = gpu_processes(c.facts)
    if not procs or c.force:
        return None
    return "GPU compute processes running (" + "; ".join(procs[:4]) + "): pass --force to restore anyway"


_GUARDS: tuple[_Guard, ...] = (
    _Guard("the dpkg lock is held", _dpkg_locked),
    _Guard("GPU compute processes run (unless --force)", _gpu_work),
    _Guard("NVML failed and the GPU work cannot be seen (unless --force)",
           lambda c: None if c.force or not c.facts.nvml.failed else _cannot_tell(c.facts)),
)


def decide(
    host: str,
    facts: HostFacts | None,
    findings: Sequence[Finding],
    host_vars: Mapping[str, Any],
    *,
    prefer: Prefer | str = Prefer.REBUILD,
    force: bool = False,
    cordon_marker: str | None = None,
    not_probed: str | None = None,
    module_source: str = "auto",
) -> Decision:
    """The decision for one host (see the module docstring for the rules): the first of _RULES that applies."""
    prefer = Prefer(prefer)
    choose_module_source(module_source, None)  # a bad setting fails before anything is decided
    ids = tuple(sorted({f.id for f in findings}))
    if facts is None:
        return Decision(host, Action.SKIP, "left alone: not probed", ids, blocked=not_probed or "not probed")
    cordoned = is_cordoned(host_vars, cordon_marker)
    expected = host_vars.get("nvidia_driver_expected_version")
    expected = str(expected) if expected else None
    base: dict[str, Any] = {"booted_kernel": facts.system.kernel, "expected_version": expected}
    case = _Case(host, facts, ids, host_vars, prefer, force, module_source, cordoned, expected, base)
    rule = next(r for r in _RULES if r.applies(case))
    decision = rule.decide(case)
    if not rule.guarded:
        return decision
    blocked = next((why for guard in _GUARDS if (why := guard.blocks(case)) is not None), None)
    return decision if blocked is None else replace(decision, blocked=blocked)

