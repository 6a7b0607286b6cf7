"""``invoke kernel-update``: move GPU hosts to a newer kernel of their flavour, an adapter on the rollout engine.

The engine runs it (:mod:`remediation.rollout`): audit (read-only) + what apt offers each host -> per-host plan
(printed) -> ``--check`` stops -> confirm unless ``--yes`` -> the fleet lock and the lease on every reachable host (the
same as the driver restore's: a kernel update and a driver restore never run at once) -> per batch:
``playbooks/kernel_update.yml`` limited to the batch (install, gate 1, one-shot trial boot, gate 2, promote or fall back
and undo, hold) -> the batch is audited again (gate 2 from the controller: the host runs the target and NVML answers
with the driver) -> a failed host is undone by the engine (a batch that timed out, crashed or was interrupted too: a
one-shot ``grub-reboot`` into an untested kernel never stays armed) -> stop after ``max_failures`` failed hosts.
Without ``--allow-reboot`` a host's kernel is staged (installed, gate 1 passed, held): it counts as not moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Unpack

from remediation.host.audit import AuditOptions, AuditResult, HostAudit
from remediation.kernelupdate.errors import KernelUpdateError
from remediation.kernelupdate.rules import Available, KernelPlan, available_query, parse_available, plan_host
from remediation.restore.rules import MODULE_SOURCES
from remediation.rollout import engine
from remediation.rollout.journal import Journal
from remediation.transport.fanout import Status, fan_out
from remediation.transport.inventory import Host
from remediation.transport.runner import PlaybookResult, run_playbook

__all__ = ["JOURNAL_PATH", "PLAYBOOK", "KernelChange", "KernelOutcome", "KernelStatus", "KernelUpdateHooks",
           "KernelUpdateOptions", "KernelUpdateResult", "kernel_update", "plan_fleet"]

PLAYBOOK = "gpufleet.remediation.kernel_update"
JOURNAL_PATH = "/var/lib/gpufleet/kernel-update/journal.json"


class KernelStatus(StrEnum):
    MOVED = "moved"  # gate 2 passed, the target is the default
    STAGED = "staged"  # installed, gate 1 passed, no reboot allowed
    FAILED = "failed"
    CURRENT = "current"  # already on the newest (or the requested) kernel
    LEFT_ALONE = "left-alone"
    NOT_STARTED = "not-started"
    PLANNED = "planned"


_STATUS = {
    engine.Verdict.DONE: KernelStatus.MOVED,
    engine.Verdict.PENDING: KernelStatus.STAGED,
    engine.Verdict.FAILED: KernelStatus.FAILED,
    engine.Verdict.UNCHANGED: KernelStatus.CURRENT,
    engine.Verdict.LEFT_ALONE: KernelStatus.LEFT_ALONE,
    engine.Verdict.NOT_STARTED: KernelStatus.NOT_STARTED,
    engine.Verdict.PLANNED: KernelStatus.PLANNED,
}


@dataclass(frozen=True)
class KernelUpdateOptions(engine.RolloutOptions):
    """The kernel update's options: the engine's (:class:`~remediation.rollout.engine.RolloutOptions`) and the kernel
    to move to (None: the newest of the host's flavour). A batch may wait for two reboots (trial and fallback)."""

    kernel: str | None = None

    reboots_per_batch: ClassVar[int] = 2

    def validate(self) -> KernelUpdateOptions:
        if (bad := self.problem("kernel_update")) is not None:
            raise KernelUpdateError(bad)
        if self.module_source not in MODULE_SOURCES:
            raise KernelUpdateError(
                f"--module-source {self.module_source!r} is not one of {', '.join(MODULE_SOURCES)}"
            )
        if self.kernel is not None and not self.kernel.strip():
            raise KernelUpdateError("--kernel is empty: pass a release such as 6.5.0-1025-azure, or leave it out")
        return self


@dataclass(frozen=True)
class KernelOutcome(engine.HostResult[KernelPlan, KernelStatus]):
    """One host at the end of a kernel-update run: its plan and status."""

    statuses = _STATUS

    @property
    def plan(self) -> KernelPlan:
        return self.item


def _offers(
    before: AuditResult, hosts: Sequence[Host], options: AuditOptions
) -> dict[str, dict[str, tuple[Available, ...]]]:
    """What apt offers each probed host for its booted flavour (one SSH round trip per host)."""
    by_query: dict[str, list[Host]] = {}
    by_name = {h.name: h for h in hosts}
    for audit in before.hosts:
        f = audit.facts
        if f is None or not f.system.kernel_flavour:
            continue
        try:
            query = available_query(f.system.kernel_flavour, f.packages.driver_branch)
        except ValueError:  # the host reported a flavour or branch that is no name: nothing is asked, no offers
            continue
        by_query.setdefault(query, []).append(by_name[audit.host])
    out: dict[str, dict[str, tuple[Available, ...]]] = {}
    for command, group in by_query.items():
        runs = fan_out(group, command, concurrency=options.concurrency, connect_timeout=options.connect_timeout,
                       timeout=60)
        for name, run in runs.runs.items():
            out[name] = parse_available(run.stdout) if run.status is Status.OK else {}
    return out


def plan_fleet(
    before: AuditResult, hosts: Sequence[Host], options: KernelUpdateOptions, audit_options: AuditOptions,
    cordon: Mapping[str, str | None], journals: Mapping[str, str] | None = None,
) -> tuple[KernelPlan, ...]:
    """Every host's plan; ``journals`` (host -> why its unfinished journal blocks it) leaves such hosts alone."""
    offers = _offers(before, hosts, audit_options)
    plans = []
    for audit in before.hosts:
        not_probed = None if audit.probed else f"{audit.status.value}: {audit.error or 'not probed'}"
        plans.append(plan_host(
            audit.host, audit.facts, audit.findings, audit.vars, offers.get(audit.host, {}), kernel=options.kernel,
            module_source=options.module_source, force=options.force, cordon_marker=cordon.get(audit.host),
            not_probed=not_probed,
        ))
    blocks = journals or {}
    return tuple(replace(p, blocked=blocks[p.host]) if p.changes_host and p.host in blocks else p for p in plans)


def _settings(options: KernelUpdateOptions, run_id: str, *, lease_held: bool = False) -> dict[str, Any]:
    """The role's variables for run ``run_id``; ``lease_held``: the engine holds the host's rollout lease."""
    return {
        "rollout_lease_held_by": run_id if lease_held else "",
        "gpu_kernel_update_run_id": run_id,
        "gpu_kernel_update_module_source": options.module_source,
        "gpu_kernel_update_kernel": options.kernel or "",
        "gpu_kernel_update_force": options.force,
        "gpu_kernel_update_allow_reboot": options.allow_reboot,
        "gpu_kernel_update_reboot_timeout": options.reboot_timeout,
        "gpu_kernel_update_lock_timeout": options.apt_lock_timeout,
    }


def _gate2(plan: KernelPlan, after: HostAudit) -> tuple[bool, str]:
    facts = after.facts
    if facts is None:
        return False, f"{after.status.value}: {after.error or 'not probed'}"
    if facts.system.kernel != plan.target_kernel:
        return False, f"running {facts.system.kernel}, not {plan.target_kernel}"
    if facts.nvml.failed:
        return False, f"NVML {facts.nvml.error_class}: {facts.nvml.error or 'no message'}"
    if plan.driver_version and facts.nvml.driver_version != plan.driver_version:
        return False, f"driver {facts.nvml.driver_version} != expected {plan.driver_version}"
    return True, f"running {plan.target_kernel}, NVML ok, driver {facts.nvml.driver_version}"


def undo_hosts(hosts: Sequence[str], inventory: str | Path, settings: Mapping[str, Any]) -> PlaybookResult:
    extravars = dict(settings)
    extravars["gpu_kernel_update_operation"] = "undo"
    return run_playbook(PLAYBOOK, inventory, limit=list(hosts), extravars=extravars, job_timeout=1200)


KernelUpdateResult = engine.Rollout[KernelUpdateOptions, KernelPlan, KernelOutcome]
KernelUpdateHooks = engine.RolloutHooks[KernelOutcome]


class KernelChange(engine.PlannedChange[KernelPlan, KernelOutcome]):
    """The kernel update as a change the rollout engine drives."""

    spec = engine.ChangeSpec(engine.ChangeKind.KERNEL_UPDATE, JOURNAL_PATH, PLAYBOOK, "gpu_kernel_update")
    outcome_type = KernelOutcome

    def __init__(self, options: KernelUpdateOptions, inventory: str | Path, audit_options: AuditOptions) -> None:
        self.options = options
        self.inventory = inventory
        self.audit_options = audit_options

    def plan(self, before: AuditResult, hosts: Sequence[Host], cordon: Mapping[str, str | None],
             blocks: Mapping[str, str], run_id: str) -> tuple[KernelPlan, ...]:
        return plan_fleet(before, hosts, self.options, self.audit_options, cordon, blocks)

    def unchanged(self, item: KernelPlan) -> engine.Verdict:
        return engine.Verdict.UNCHANGED if item.action == "none" else engine.Verdict.LEFT_ALONE

    def apply(self, batch: Sequence[KernelPlan], run_id: str) -> engine.Applied:
        extravars = _settings(self.options, run_id, lease_held=True)
        extravars["gpu_kernel_update_operation"] = "update"
        extravars["gpu_kernel_update_planned"] = {p.host: p.target_kernel for p in batch}
        extravars["gpu_kernel_update_plans"] = {p.host: p.to_dict() for p in batch}
        extravars["kernel_update_batch"] = max(1, len(batch))
        extravars["kernel_update_max_fail_percentage"] = 100  # the engine counts failures itself
        result = run_playbook(PLAYBOOK, self.inventory, limit=[p.host for p in batch], extravars=extravars,
                              job_timeout=self.options.batch_timeout)
        return engine.Applied({p.host: result for p in batch})

    def judge(self, item: KernelPlan, after: HostAudit, journal: Journal | None) -> tuple[engine.Verdict, str, str]:
        if not self.options.allow_reboot:
            return engine.Verdict.PENDING, "", (
                f"{item.target_kernel} installed, gate 1 passed, held; the host still boots {item.booted_kernel} "
                "(pass --allow-reboot to move it)")
        ok, why = _gate2(item, after)
        return (engine.Verdict.DONE, "", why) if ok else (engine.Verdict.FAILED, f"gate 2: {why}", why)

    def undo(self, hosts: Sequence[str], run_id: str) -> PlaybookResult:
        return undo_hosts(hosts, self.inventory, _settings(self.options, run_id, lease_held=True))


def kernel_update(
    hosts: Sequence[Host], inventory: str | Path, audit_options: AuditOptions, options: KernelUpdateOptions,
    **controls: Unpack[engine.RolloutControls[KernelPlan, KernelOutcome]],
) -> KernelUpdateResult:
    """Update ``hosts`` (see the module docstring)."""
    options = options.validate()
    change = KernelChange(options, inventory, audit_options)
    return engine.run_rollout(change, hosts, inventory, audit_options, options.rollout(), options, **controls)
