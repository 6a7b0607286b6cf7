"""``invoke driver-restore``: the emergency S1 restore, an adapter on the rollout engine (:mod:`remediation.rollout`).

The engine runs it: audit (read-only) -> per-host plan (printed) -> ``--check`` stops -> confirm unless ``--yes`` ->
the fleet lock and the lease on every reachable host -> per batch: apply (each host's method:
``playbooks/driver_restore.yml`` for apt, the Azure driver extension) -> health gate (re-audit the batch: NVML answers
with the expected driver, no GPU-DRV-001; the extension method expects the driver the extension reported, read from
this run's journal) -> on a failed host, undo exactly what this run recorded there -> stop after ``max_failures``
failed hosts. A host whose restore needs a reboot that was not allowed gets the package work, is reported "reboot
required to finish" and counts as not restored (non-zero exit), but not as a gate failure.

This module says only what is the restore's: its plan (the rules and each host's method), how a batch is applied and
undone (grouped by method), and how a host is judged after the gate audit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Unpack

from remediation.core.errors import RunnerError
from remediation.host.audit import AuditOptions, AuditResult, HostAudit
from remediation.restore.errors import RestoreError
from remediation.restore.methods import PLAYBOOK, AptMethod, RestoreMethod, method_for
from remediation.restore.rules import MODULE_SOURCES, Action, Decision, Prefer
from remediation.rollout import engine
from remediation.rollout.journal import JOURNAL_PATH, Journal
from remediation.transport.inventory import Host
from remediation.transport.runner import PlaybookResult

__all__ = ["HostOutcome", "HostStatus", "RestoreChange", "RestoreHooks", "RestoreOptions", "RestoreResult",
           "driver_restore", "plan_restore", "undo_run"]


class HostStatus(StrEnum):
    RESTORED = "restored"
    REBOOT_REQUIRED = "reboot-required"
    FAILED = "failed"
    HEALTHY = "healthy"  # nothing to do
    LEFT_ALONE = "left-alone"  # blocked by a guard, cordoned, not probed, not a driver problem, manual
    NOT_STARTED = "not-started"  # after the run stopped
    PLANNED = "planned"  # dry run / not confirmed


_STATUS = {
    engine.Verdict.DONE: HostStatus.RESTORED,
    engine.Verdict.PENDING: HostStatus.REBOOT_REQUIRED,
    engine.Verdict.FAILED: HostStatus.FAILED,
    engine.Verdict.UNCHANGED: HostStatus.HEALTHY,
    engine.Verdict.LEFT_ALONE: HostStatus.LEFT_ALONE,
    engine.Verdict.NOT_STARTED: HostStatus.NOT_STARTED,
    engine.Verdict.PLANNED: HostStatus.PLANNED,
}


@dataclass(frozen=True)
class RestoreOptions(engine.RolloutOptions):
    """The driver restore's options: the engine's (:class:`~remediation.rollout.engine.RolloutOptions`), the method
    and which fix to prefer."""

    method: str = "auto"
    prefer: Prefer = Prefer.REBUILD

    def validate(self) -> RestoreOptions:
        if (bad := self.problem("driver_restore")) is not None:
            raise RestoreError(bad)
        Prefer(self.prefer)
        if self.module_source not in MODULE_SOURCES:
            raise RestoreError(
                f"driver_restore.module_source {self.module_source!r} is not one of {', '.join(MODULE_SOURCES)}"
            )
        return self


@dataclass(frozen=True)
class HostOutcome(engine.HostResult[Decision, HostStatus]):
    """One host at the end of a restore run: its decision and status (``where``: failed: "apply: <task>" |
    "gate: <why>"; not-started: why; ``changed``: what this run recorded in the host's journal)."""

    statuses = _STATUS

    @property
    def decision(self) -> Decision:
        return self.item


def plan_restore(
    before: AuditResult, hosts: Sequence[Host], options: RestoreOptions, cordon: dict[str, str | None],
    journals: Mapping[str, str] | None = None,
) -> tuple[tuple[Decision, ...], dict[str, RestoreMethod]]:
    """The decisions for every host and the method of each host that changes (raises before any change).

    ``journals``: host -> why an unfinished journal there blocks it (:func:`journal_blocks`); such a host is left
    alone, before any batch, with that line."""
    decisions: list[Decision] = []
    methods: dict[str, RestoreMethod] = {}
    by_name = {h.name: h for h in hosts}
    for audit in before.hosts:
        method = method_for(options.method, by_name[audit.host].vars)
        # Every host is diagnosed with the same rules; a method that does not exist yet refuses here.
        decision = AptMethod().plan_host(
            audit, prefer=Prefer(options.prefer), force=options.force, cordon_marker=cordon.get(audit.host),
            module_source=options.module_source,
        )
        if decision.changes_host:
            decision = method.plan_host(
                audit, prefer=Prefer(options.prefer), force=options.force, cordon_marker=cordon.get(audit.host),
                module_source=options.module_source,
            )
            decision = method.guard(decision, allow_reboot=options.allow_reboot)
        if decision.changes_host and audit.host in (journals or {}):
            decision = replace(decision, blocked=(journals or {})[audit.host])
        if decision.changes_host:
            methods[audit.host] = method
        decisions.append(decision)
    return tuple(decisions), methods


def _settings(options: RestoreOptions, run_id: str, *, lease_held: bool = False) -> dict[str, Any]:
    """The role's variables for run ``run_id``; ``lease_held``: the engine holds the host's rollout lease, so the
    playbook only checks it is still this run's (a manual undo takes its own)."""
    return {
        "rollout_lease_held_by": run_id if lease_held else "",
        "nvidia_driver_restore_run_id": run_id,
        "nvidia_driver_restore_prefer": Prefer(options.prefer).value,
        "nvidia_driver_restore_module_source": options.module_source,
        "nvidia_driver_restore_force": options.force,
        "nvidia_driver_restore_allow_reboot": options.allow_reboot,
        "nvidia_driver_restore_reboot_timeout": options.reboot_timeout,
        "nvidia_driver_restore_lock_timeout": options.apt_lock_timeout,
        "nvidia_driver_restore_playbook_timeout": options.batch_timeout,
    }


RestoreResult = engine.Rollout[RestoreOptions, Decision, HostOutcome]
RestoreHooks = engine.RolloutHooks[HostOutcome]


class RestoreChange(engine.PlannedChange[Decision, HostOutcome]):
    """The driver restore as a change the rollout engine drives."""

    spec = engine.ChangeSpec(engine.ChangeKind.DRIVER_RESTORE, JOURNAL_PATH, PLAYBOOK, "nvidia_driver_restore")
    outcome_type = HostOutcome

    def __init__(self, options: RestoreOptions, inventory: str | Path) -> None:
        self.options = options
        self.inventory = inventory
        self.methods: dict[str, RestoreMethod] = {}

    def plan(self, before: AuditResult, hosts: Sequence[Host], cordon: Mapping[str, str | None],
             blocks: Mapping[str, str], run_id: str) -> tuple[Decision, ...]:
        plan, self.methods = plan_restore(before, hosts, self.options, dict(cordon), blocks)
        return plan

    def unchanged(self, item: Decision) -> engine.Verdict:
        if item.action is Action.NONE and item.blocked is None:
            return engine.Verdict.UNCHANGED
        return engine.Verdict.LEFT_ALONE

    def apply(self, batch: Sequence[Decision], run_id: str) -> engine.Applied:
        """Each method on its hosts of the batch; a method run that does not finish fails its hosts, and Ctrl-C
        stops the batch there (hosts of a method not started yet are failed too: the engine undoes what they
        recorded, which is nothing)."""
        groups: dict[str, list[Decision]] = {}
        for d in batch:
            groups.setdefault(self.methods[d.host].name, []).append(d)
        results: dict[str, PlaybookResult] = {}
        broken: dict[str, str] = {}
        for decisions in groups.values():
            method = self.methods[decisions[0].host]
            try:
                result = method.apply(decisions, self.inventory, _settings(self.options, run_id, lease_held=True))
            except KeyboardInterrupt:
                why = "interrupted (Ctrl-C) while the batch was being applied"
                not_done = {d.host: why for d in batch if d.host not in results}
                return engine.Applied(results, not_done, interrupted=True)
            except Exception as exc:  # a timeout, a crashed runner: a failure of these hosts, the other methods go on
                why = str(exc) if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
                broken.update((d.host, f"{method.name} did not finish: {why}") for d in decisions)
                continue
            results.update((d.host, result) for d in decisions)
        return engine.Applied(results, broken)

    def judge(self, item: Decision, after: HostAudit, journal: Journal | None) -> tuple[engine.Verdict, str, str]:
        if item.needs_reboot and not self.options.allow_reboot:
            return engine.Verdict.PENDING, "", "package work done; reboot required to finish (pass --allow-reboot)"
        gate = self.methods[item.host].verify(item, after, journal)
        if gate.ok:
            return engine.Verdict.DONE, "", gate.detail
        return engine.Verdict.FAILED, f"gate: {gate.detail}", gate.detail

    def undo(self, hosts: Sequence[str], run_id: str) -> PlaybookResult:
        by_method: dict[str, list[str]] = {}
        for h in hosts:
            by_method.setdefault(self.methods[h].name, []).append(h)
        settings = _settings(self.options, run_id, lease_held=True)
        return _merge([self.methods[names[0]].undo(names, self.inventory, settings) for names in by_method.values()],
                      run_id)


def _merge(results: Sequence[PlaybookResult], run_id: str) -> PlaybookResult:
    """One result for the runs of several methods: every host, the worst exit code."""
    merged: dict[str, Any] = {}
    for result in results:
        merged.update(result.hosts)
    worst = max((r.rc for r in results), default=0)
    status = next((r.status for r in results if r.rc), results[0].status if results else "successful")
    return PlaybookResult(run_id, worst, status, merged, "\n".join(r.stdout_tail for r in results if r.stdout_tail))


def driver_restore(
    hosts: Sequence[Host], inventory: str | Path, audit_options: AuditOptions, options: RestoreOptions,
    **controls: Unpack[engine.RolloutControls[Decision, HostOutcome]],
) -> RestoreResult:
    """Restore ``hosts`` (see the module docstring)."""
    options = options.validate()
    change = RestoreChange(options, inventory)
    return engine.run_rollout(change, hosts, inventory, audit_options, options.rollout(), options, **controls)


def undo_run(
    hosts: Sequence[Host],
    inventory: str | Path,
    run_id: str,
    options: RestoreOptions | None = None,
    audit_options: AuditOptions | None = None,
) -> PlaybookResult:
    """Undo what run ``run_id`` recorded on ``hosts`` (after an unreachable host came back).

    Each host is undone by the method that changed it, as its journal says (an ``azure_extension`` change: the
    Azure extension method; anything else: apt); the result has every host.
    """
    options = options or RestoreOptions()
    from remediation.restore.methods import METHODS

    journals = engine.read_journals(hosts, JOURNAL_PATH, audit_options or AuditOptions())
    by_method: dict[str, list[str]] = {}
    for h in hosts:
        journal = journals.get(h.name)
        azure = journal is not None and any(c.kind == "azure_extension" for c in journal.changes)
        by_method.setdefault("azure-extension" if azure else "apt", []).append(h.name)
    return _merge([METHODS[name]().undo(names, inventory, _settings(options, run_id))
                   for name, names in by_method.items()], run_id)
