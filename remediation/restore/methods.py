"""How a host's driver is restored: one interface, one method per way (apt, the Azure driver VM extension).

A :class:`RestoreMethod` turns a host's audit into a :class:`~remediation.restore.rules.Decision`
(``plan_host``), makes the change for a batch (``apply``), undoes what a run recorded (``undo``) and says whether
the host passed the health gate (``verify``). ``method_for`` picks the method per host: ``--method auto`` reads the
inventory variable ``driver_restore_method`` (``apt`` | ``azure-extension``). A method that cannot serve a host (an
Azure VM not mapped in the inventory) fails in planning, before any host is changed.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from remediation.host.audit import HostAudit
from remediation.restore.errors import RestoreError
from remediation.restore.rules import METHOD_NAMES, Decision, Prefer, decide, resolve_method
from remediation.rollout.journal import Journal
from remediation.transport.runner import PlaybookResult, run_playbook

__all__ = ["METHODS", "AptMethod", "AzureExtensionMethod", "GateResult", "RestoreMethod", "method_for"]

PLAYBOOK = "gpufleet.remediation.driver_restore"
PLAYBOOK_TIMEOUT = "nvidia_driver_restore_playbook_timeout"  # a setting of the flow, not a variable of the role


def _role_vars(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != PLAYBOOK_TIMEOUT}


@dataclass(frozen=True)
class GateResult:
    ok: bool
    detail: str


class RestoreMethod(ABC):
    name: str = ""

    @abstractmethod
    def plan_host(
        self, audit: HostAudit, *, prefer: Prefer, force: bool, cordon_marker: str | None, module_source: str = "auto"
    ) -> Decision:
        """The decision for one host (no change anywhere)."""

    @abstractmethod
    def apply(
        self, decisions: Sequence[Decision], inventory: str | Path, settings: Mapping[str, Any]
    ) -> PlaybookResult:
        """Make the change on one batch; every host of the batch is in the result."""

    @abstractmethod
    def undo(self, hosts: Sequence[str], inventory: str | Path, settings: Mapping[str, Any]) -> PlaybookResult:
        """Undo exactly what this run recorded on ``hosts`` (the journal on each host)."""

    def guard(self, decision: Decision, *, allow_reboot: bool) -> Decision:
        """A method's own guard on a changing decision (e.g. a method that cannot avoid a reboot); default none."""
        return decision

    def verify(self, decision: Decision, after: HostAudit, journal: Journal | None = None) -> GateResult:
        """The health gate: probed, NVML answers, driver version as expected, no GPU-DRV-001 left.

        ``journal``: what this run recorded on the host (None: nothing, or another run's)."""
        facts = after.facts
        if facts is None:
            return GateResult(False, f"{after.status.value}: {after.error or 'not probed'}")
        if facts.nvml.failed:
            return GateResult(False, f"NVML {facts.nvml.error_class}: {facts.nvml.error or 'no message'}")
        expected = decision.expected_version
        if expected and facts.nvml.driver_version != expected:
            return GateResult(False, f"driver {facts.nvml.driver_version} != expected {expected}")
        if any(f.id == "GPU-DRV-001" for f in after.findings):
            return GateResult(False, "GPU-DRV-001 still reported")
        return GateResult(True, f"NVML ok, driver {facts.nvml.driver_version}")


class AptMethod(RestoreMethod):
    """Headers + DKMS rebuild / previous kernel / install, then hold and reboot: ``playbooks/driver_restore.yml``."""

    name = "apt"

    def plan_host(
        self, audit: HostAudit, *, prefer: Prefer, force: bool, cordon_marker: str | None, module_source: str = "auto"
    ) -> Decision:
        not_probed = None if audit.probed else f"{audit.status.value}: {audit.error or 'not probed'}"
        return decide(
            audit.host, audit.facts, audit.findings, audit.vars,
            prefer=prefer, force=force, cordon_marker=cordon_marker, not_probed=not_probed,
            module_source=module_source,
        )

    def apply(
        self, decisions: Sequence[Decision], inventory: str | Path, settings: Mapping[str, Any]
    ) -> PlaybookResult:
        extravars = _role_vars(settings)
        extravars["nvidia_driver_restore_operation"] = "restore"
        extravars["nvidia_driver_restore_method"] = self.name
        extravars["nvidia_driver_restore_planned"] = {d.host: d.action.value for d in decisions}
        extravars["nvidia_driver_restore_planned_source"] = {d.host: d.module_source or "" for d in decisions}
        extravars["driver_restore_batch"] = max(1, len(decisions))
        reboot_timeout = int(settings.get("nvidia_driver_restore_reboot_timeout", 600))
        timeout = settings.get(PLAYBOOK_TIMEOUT) or reboot_timeout + 1200
        return run_playbook(
            PLAYBOOK, inventory, limit=[d.host for d in decisions], extravars=extravars, job_timeout=int(timeout)
        )

    def undo(self, hosts: Sequence[str], inventory: str | Path, settings: Mapping[str, Any]) -> PlaybookResult:
        extravars = _role_vars(settings)
        extravars["nvidia_driver_restore_operation"] = "undo"
        return run_playbook(PLAYBOOK, inventory, limit=list(hosts), extravars=extravars, job_timeout=1200)


class AzureExtensionMethod(RestoreMethod):
    """Remove and re-add the ``NvidiaGpuDriverLinux`` VM extension (publisher ``Microsoft.HpcCompute``).

    Delegates to :mod:`remediation.azure.restore` (ARM through azure-cli-core's login); the decision rules, guards,
    batches, NVML gate and journal are the apt method's.
    """

    name = "azure-extension"

    def plan_host(
        self, audit: HostAudit, *, prefer: Prefer, force: bool, cordon_marker: str | None, module_source: str = "auto"
    ) -> Decision:
        from remediation.azure import restore

        return restore.plan_host(audit, force=force, cordon_marker=cordon_marker)

    def guard(self, decision: Decision, *, allow_reboot: bool) -> Decision:
        from remediation.azure import restore

        return restore.guard(decision, allow_reboot=allow_reboot)

    def apply(
        self, decisions: Sequence[Decision], inventory: str | Path, settings: Mapping[str, Any]
    ) -> PlaybookResult:
        from remediation.azure import restore

        return restore.apply(decisions, inventory, settings)

    def undo(self, hosts: Sequence[str], inventory: str | Path, settings: Mapping[str, Any]) -> PlaybookResult:
        from remediation.azure import restore

        return restore.undo(hosts, inventory, settings)

    def verify(self, decision: Decision, after: HostAudit, journal: Journal | None = None) -> GateResult:
        """The driver the extension installed, not a pinned version: NVML answers, no GPU-DRV-001, and NVML's driver
        version is the one the extension reported in its instance view (recorded in this run's journal).

        The extension installs the latest supported driver unless told otherwise, and on NC/ND sizes its
        ``driverVersion`` setting is a CUDA version: ``nvidia_driver_expected_version`` says nothing about it."""
        base = super().verify(replace(decision, expected_version=None), after)
        if not base.ok:
            return base
        facts = after.facts
        assert facts is not None
        running = facts.nvml.driver_version or ""
        reported = _reported_version(journal)
        if reported is None:
            return GateResult(True, f"NVML ok, driver {running or '?'} (the extension named no driver version in its"
                                    " status; not compared)")
        if running != reported and not running.startswith(reported + "."):
            return GateResult(False, f"driver {running or '?'} != {reported}, the version the extension reported")
        return GateResult(True, f"NVML ok, driver {running}, the version the extension reported")


def _reported_version(journal: Journal | None) -> str | None:
    """The driver version the extension reported, from this run's ``azure_extension`` journal record."""
    if journal is None:
        return None
    for change in journal.changes:
        if change.kind != "azure_extension" or not change.after:
            continue
        try:
            value = json.loads(change.after).get("reportedDriverVersion")
        except (ValueError, AttributeError):
            return None
        return str(value) if value else None
    return None


METHODS: dict[str, type[RestoreMethod]] = {"apt": AptMethod, "azure-extension": AzureExtensionMethod}
assert tuple(METHODS) == METHOD_NAMES, "every restore method name has its class"


def method_for(requested: str, host_vars: Mapping[str, Any]) -> RestoreMethod:
    """The method for one host: ``requested`` unless it is ``auto``, then the host's ``driver_restore_method``."""
    try:
        name = resolve_method(requested, host_vars)
    except ValueError as exc:
        raise RestoreError(str(exc)) from None
    return METHODS[name]()
