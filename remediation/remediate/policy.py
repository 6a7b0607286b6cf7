"""The remediation policy: per finding ID how far the loop may go, per fleet, overridable per inventory group.

Levels (:class:`Level`), from most cautious: ``observe`` (note it, do nothing, page nobody), ``propose`` (show the
action for a person to run; for a hardware finding: escalate), ``auto`` (run the action when every guard allows).

The defaults, written once here (:data:`DEFAULT_LEVELS`, :func:`default_level`):

- what ``invoke harden`` remediates (the finding IDs of its roles, ``remediation.host.harden.REMEDIES``): ``auto``;
- the driver not loaded because the booted kernel has no NVIDIA module (GPU-DRV-001, the state a kernel change leaves):
  ``auto``; its driver restore ends in a reboot, which only a maintenance window or ``--allow-reboot`` allows;
- hardware findings (every GPU-HW-* ID: Xid 79, ECC and Xid 48/94/95, retired pages and remapped rows and Xid 63/64,
  a missing GPU, ...): ``propose``, which escalates them; ``auto`` is refused for them;
- every other finding: ``propose``, or ``observe`` for an info finding.

``remediate.policy.<fleet>`` in ``invoke.yaml`` sets ``levels`` (finding ID -> level) over the defaults, ``windows``
(:mod:`remediation.remediate.windows`) and ``groups`` (an inventory group -> its own ``levels`` and ``windows``).
A host's level is its group's when one of its groups sets it (the most cautious when several do), else the fleet's,
else the default; a host's windows are its groups' when any of its groups has windows, else the fleet's.

A level of ``auto`` is refused, with one line naming the setting, for a hardware finding and for a finding with no
action the loop can run (:data:`ACTIONS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from remediation.core import catalog
from remediation.core.errors import UsageError
from remediation.core.findings import Severity
from remediation.remediate.windows import MaintenanceWindow, parse_windows

__all__ = [
    "ACTIONS",
    "DEFAULT_LEVELS",
    "Action",
    "ActionSpec",
    "FleetPolicy",
    "GroupPolicy",
    "Level",
    "action_for",
    "default_level",
    "is_hardware",
    "parse_policy",
]


class Level(StrEnum):
    """How far the loop may go with a finding; ordered by :attr:`rank` (observe < propose < auto)."""

    OBSERVE = "observe"
    PROPOSE = "propose"
    AUTO = "auto"

    @property
    def rank(self) -> int:
        return ("observe", "propose", "auto").index(self.value)


class Action(StrEnum):
    """What fixes a finding: a task the loop can run, an escalation, or a person's work."""

    HARDEN = "harden"  # invoke harden's roles
    DRIVER_RESTORE = "driver-restore"  # invoke driver-restore's rules (rebuild, install, boot the previous kernel)
    REBOOT = "reboot"  # driver-restore's reboot for a userspace/kernel-module mismatch
    ESCALATE = "escalate"  # hardware: drain, redeploy the VM or open a support case, with the evidence
    MANUAL = "manual"  # no task fixes it: the catalog's remedy, for a person

    @property
    def runnable(self) -> bool:
        """The loop can run it itself (``auto`` is allowed)."""
        return self in (Action.HARDEN, Action.DRIVER_RESTORE, Action.REBOOT)


@dataclass(frozen=True)
class ActionSpec:
    action: Action
    reboot: bool = False  # the action ends in a reboot (a window or --allow-reboot needed)
    detail: str = ""


def _harden_findings() -> tuple[str, ...]:
    from remediation.host.harden import REMEDIES

    return tuple(sorted(REMEDIES))


#: Finding ID -> the action the loop would take. Harden's findings come from its own table; the driver restore's
#: follow its rules (remediation.restore.rules): GPU-DRV-001/008 rebuild then reboot into the kernel, GPU-DRV-003
#: installs then reboots, GPU-KRN-001 builds the next kernel's module with no reboot, GPU-DRV-002 is a reboot.
ACTIONS: dict[str, ActionSpec] = {
    **{i: ActionSpec(Action.HARDEN, detail="invoke harden") for i in _harden_findings()},
    "GPU-DRV-001": ActionSpec(Action.DRIVER_RESTORE, reboot=True, detail="rebuild the module, reboot"),
    "GPU-DRV-008": ActionSpec(Action.DRIVER_RESTORE, reboot=True, detail="signed module, reboot"),
    "GPU-DRV-003": ActionSpec(Action.DRIVER_RESTORE, reboot=True, detail="install the expected driver, reboot"),
    "GPU-KRN-001": ActionSpec(Action.DRIVER_RESTORE, detail="build the next kernel's module, no reboot"),
    "GPU-DRV-002": ActionSpec(Action.REBOOT, reboot=True, detail="reboot to load the installed driver's module"),
}

#: The built-in levels that differ from the rule of :func:`default_level`.
DEFAULT_LEVELS: dict[str, Level] = {
    **{i: Level.AUTO for i in _harden_findings()},
    "GPU-DRV-001": Level.AUTO,
}


def is_hardware(finding_id: str) -> bool:
    """A GPU hardware/platform finding (GPU-HW-*): never fixed automatically, escalated."""
    return finding_id.startswith("GPU-HW-")


def action_for(finding_id: str) -> ActionSpec:
    """The action for ``finding_id``: from :data:`ACTIONS`, escalate for hardware, else manual."""
    if finding_id in ACTIONS:
        return ACTIONS[finding_id]
    if is_hardware(finding_id):
        return ActionSpec(Action.ESCALATE, detail="drain; redeploy the VM or open a support case")
    return ActionSpec(Action.MANUAL)


def default_level(finding_id: str) -> Level:
    """The built-in level: :data:`DEFAULT_LEVELS`, else observe for an info finding, else propose."""
    if finding_id in DEFAULT_LEVELS:
        return DEFAULT_LEVELS[finding_id]
    entry = catalog.CATALOG.get(finding_id)
    if entry is not None and entry.severity is Severity.INFO:
        return Level.OBSERVE
    return Level.PROPOSE


@dataclass(frozen=True)
class GroupPolicy:
    """One inventory group's overrides."""

    levels: Mapping[str, Level] = field(default_factory=dict)
    windows: tuple[MaintenanceWindow, ...] = ()


@dataclass(frozen=True)
class FleetPolicy:
    """A fleet's policy: levels over the defaults, maintenance windows, and per-group overrides."""

    fleet: str
    levels: Mapping[str, Level] = field(default_factory=dict)
    windows: tuple[MaintenanceWindow, ...] = ()
    groups: Mapping[str, GroupPolicy] = field(default_factory=dict)

    def level(self, finding_id: str, groups: Iterable[str] = ()) -> tuple[Level, str]:
        """The level for ``finding_id`` on a host in ``groups``, and where it was set (for the plan's why)."""
        set_by = [(g, self.groups[g].levels[finding_id]) for g in sorted(groups)
                  if g in self.groups and finding_id in self.groups[g].levels]
        if set_by:
            group, level = min(set_by, key=lambda item: item[1].rank)
            return level, f"policy {self.fleet}, group {group}"
        if finding_id in self.levels:
            return self.levels[finding_id], f"policy {self.fleet}"
        return default_level(finding_id), "default"

    def windows_for(self, groups: Iterable[str] = ()) -> tuple[MaintenanceWindow, ...]:
        """The windows of a host in ``groups``: its groups' when any has some, else the fleet's."""
        own = tuple(w for g in sorted(groups) if g in self.groups for w in self.groups[g].windows)
        return own or self.windows


_FLEET_KEYS = ("levels", "windows", "groups")
_GROUP_KEYS = ("levels", "windows")


def parse_policy(policy: Mapping[str, Any] | None, fleet: str, source: str = "invoke.yaml") -> FleetPolicy:
    """``remediate.policy`` (fleet -> its settings) as the :class:`FleetPolicy` of ``fleet`` (defaults when the
    mapping does not name it). Raises :class:`UsageError`, one line naming the setting, ``source`` and the fix."""
    try:
        return _parse(policy or {}, fleet)
    except UsageError as exc:
        raise UsageError(f"{exc} (in {source})") from None


def _parse(policy: Mapping[str, Any], fleet: str) -> FleetPolicy:
    if not isinstance(policy, Mapping):
        raise UsageError(f"setting remediate.policy must map fleet names to their policy, got {policy!r:.60}")
    where = f"remediate.policy.{fleet}"
    data = policy.get(fleet)
    if data is None:
        return FleetPolicy(fleet)
    _keys(data, where, _FLEET_KEYS)
    groups_data = data.get("groups") or {}
    if not isinstance(groups_data, Mapping):
        raise UsageError(f"setting {where}.groups must map inventory groups to levels and windows, "
                         f"got {groups_data!r:.60}")
    groups = {}
    for name, group in groups_data.items():
        gwhere = f"{where}.groups.{name}"
        _keys(group, gwhere, _GROUP_KEYS)
        groups[str(name)] = GroupPolicy(_levels(group.get("levels"), f"{gwhere}.levels"),
                                        parse_windows(group.get("windows"), f"{gwhere}.windows"))
    return FleetPolicy(fleet, _levels(data.get("levels"), f"{where}.levels"),
                       parse_windows(data.get("windows"), f"{where}.windows"), groups)


def _keys(data: Any, where: str, known: tuple[str, ...]) -> None:
    if not isinstance(data, Mapping):
        raise UsageError(f"setting {where} must be a mapping with {', '.join(known)}, got {data!r:.60}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UsageError(f"unknown setting {where}.{unknown[0]}; known: {', '.join(known)}")


def _levels(data: Any, where: str) -> dict[str, Level]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise UsageError(f"setting {where} must map finding IDs to observe, propose or auto, got {data!r:.60}")
    out: dict[str, Level] = {}
    for key, value in data.items():
        finding_id, here = str(key).strip().upper(), f"setting {where}.{key}"
        if finding_id not in catalog.CATALOG:
            raise UsageError(f"{here}: {key!r} is not a finding ID of the catalog (GPU-DRV-001, GPU-KRN-002, ...: "
                             "remediation/core/catalog lists them)")
        try:
            level = Level(str(value).strip().lower())
        except ValueError:
            raise UsageError(f"{here} {value!r} must be observe, propose or auto") from None
        if level is Level.AUTO and is_hardware(finding_id):
            raise UsageError(f"{here}: auto is refused for a hardware finding (it is escalated, never fixed "
                             "automatically); set propose or observe")
        if level is Level.AUTO and not action_for(finding_id).action.runnable:
            raise UsageError(f"{here}: auto is refused: the loop has no action for {finding_id} "
                             f"({catalog.get(finding_id).remedy}); set propose or observe")
        out[finding_id] = level
    return out
