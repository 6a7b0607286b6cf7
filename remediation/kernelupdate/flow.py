"""``invoke kernel-update``: move GPU hosts to a newer kernel of their flavour, rolling and gated twice.

audit (read-only) + what apt offers each host -> per-host plan (printed) -> ``--check`` stops -> confirm unless
``--yes`` -> the fleet lock and the lease on every reachable host (the restore's: a kernel update and a driver restore
never run at once) -> per batch: ``playbooks/kernel_update.yml`` limited to the batch (install, gate 1, one-shot trial
boot, gate 2, promote or fall back and undo, hold) -> the batch is audited again (gate 2 from the controller: the
host runs the target and NVML answers with the driver) -> stop after ``max_failures`` failed hosts; later hosts are not
touched. Without ``--allow-reboot`` a host's kernel is staged (installed, gate 1 passed, held): it counts as not moved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from remediation.audit import AuditOptions, AuditResult, HostAudit, run_audit
from remediation.errors import RunnerError
from remediation.exitcodes import ExitCode
from remediation.fanout import Status, fan_out
from remediation.inventory import Host
from remediation.restore.flow import (
    UNLEASED,
    _Applied,
    _apply_failure,
    _cordon_markers,
    journal_blocks,
    new_run_id,
    rolling_exit_code,
    rolling_outcome,
)
from remediation.restore.journal import Journal, journal_from_dict
from remediation.restore.lock import DEFAULT_TTL_S, HostLeases, LockInfo, check_ttl, fleet_lock, host_leases
from remediation.restore.rules import MODULE_SOURCES
from remediation.runner import HostState, PlaybookResult, run_playbook

from .errors import KernelUpdateError
from .rules import Available, KernelPlan, available_query, parse_available, plan_host

__all__ = ["JOURNAL_PATH", "PLAYBOOK", "KernelOutcome", "KernelStatus", "KernelUpdateOptions", "KernelUpdateResult",
           "kernel_update", "plan_fleet"]

PLAYBOOK = "playbooks/kernel_update.yml"
JOURNAL_PATH = "/var/lib/gpufleet/kernel-update/journal.json"


class KernelStatus(StrEnum):
    MOVED = "moved"  # gate 2 passed, the target is the default
    STAGED = "staged"  # installed, gate 1 passed, no reboot allowed
    FAILED = "failed"
    CURRENT = "current"  # already on the newest (or the requested) kernel
    LEFT_ALONE = "left-alone"
    NOT_STARTED = "not-started"
    PLANNED = "planned"


@dataclass(frozen=True)
class KernelUpdateOptions:
    kernel: str | None = None
    module_source: str = "auto"
    allow_reboot: bool = False
    dry_run: bool = False
    batch: int = 1
    max_failures: int = 1
    force: bool = False
    reboot_timeout: int = 600
    apt_lock_timeout: int = 60
    state_dir: Path = Path(".audit")
    lock_ttl_s: float = DEFAULT_TTL_S
    playbook_timeout: int = 0  # 0: 2 x reboot_timeout + 1200

    @property
    def batch_timeout(self) -> int:
        return self.playbook_timeout or 2 * self.reboot_timeout + 1200

    def validate(self) -> KernelUpdateOptions:
        if self.batch < 1:
            raise KernelUpdateError(f"--batch {self.batch} must be at least 1")
        if self.max_failures < 1:
            raise KernelUpdateError(f"--max-failures {self.max_failures} must be at least 1")
        if self.reboot_timeout < 1:
            raise KernelUpdateError(f"--reboot-timeout {self.reboot_timeout} must be a positive number of seconds")
        if self.module_source not in MODULE_SOURCES:
            raise KernelUpdateError(
                f"--module-source {self.module_source!r} is not one of {', '.join(MODULE_SOURCES)}"
            )
        if self.kernel is not None and not self.kernel.strip():
            raise KernelUpdateError("--kernel is empty: pass a release such as 6.5.0-1025-azure, or leave it out")
        if (bad := check_ttl(self.lock_ttl_s, "kernel_update.lock_ttl_s")) is not None:
            raise KernelUpdateError(bad)
        return self


@dataclass(frozen=True)
class KernelOutcome:
    host: str
    plan: KernelPlan
    status: KernelStatus
    where: str | None = None
    detail: str = ""
    changed: tuple[str, ...] = ()
    undone: tuple[str, ...] = ()
    undo_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in (KernelStatus.MOVED, KernelStatus.CURRENT)


@dataclass(frozen=True)
class KernelUpdateResult:
    fleet: str
    run_id: str
    options: KernelUpdateOptions
    before: AuditResult
    plan: tuple[KernelPlan, ...]
    outcomes: tuple[KernelOutcome, ...]
    after: AuditResult | None
    stopped: str | None
    lock: LockInfo | None = None
    seconds: float = 0.0
    leases: HostLeases | None = None

    def outcome(self, host: str) -> KernelOutcome:
        return rolling_outcome(self.outcomes, host)

    @property
    def failed(self) -> list[KernelOutcome]:
        return [o for o in self.outcomes if o.status is KernelStatus.FAILED]

    @property
    def exit_code(self) -> ExitCode:
        """OK: every host moved or current (or --check / not confirmed); FINDINGS: a host did not move."""
        return rolling_exit_code(self.outcomes, self.stopped)


@dataclass
class KernelUpdateHooks:
    before_batch: Callable[[list[str]], None] | None = None
    after_batch: Callable[[list[str], list[KernelOutcome]], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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


def _settings(options: KernelUpdateOptions, run_id: str) -> dict[str, Any]:
    return {
        "gpu_kernel_update_run_id": run_id,
        "gpu_kernel_update_module_source": options.module_source,
        "gpu_kernel_update_kernel": options.kernel or "",
        "gpu_kernel_update_force": options.force,
        "gpu_kernel_update_allow_reboot": options.allow_reboot,
        "gpu_kernel_update_reboot_timeout": options.reboot_timeout,
        "gpu_kernel_update_lock_timeout": options.apt_lock_timeout,
    }


def _read_journals(hosts: Sequence[Host], options: AuditOptions) -> dict[str, Journal | None]:
    runs = fan_out(hosts, f"cat {JOURNAL_PATH} 2>/dev/null || true", concurrency=options.concurrency,
                   connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, Journal | None] = {}
    for name, run in runs.runs.items():
        try:
            out[name] = journal_from_dict(json.loads(run.stdout)) if run.status is Status.OK and run.stdout else None
        except ValueError:
            out[name] = None
    return out


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


def _apply(batch: Sequence[KernelPlan], inventory: str | Path, settings: dict[str, Any], timeout: int) -> _Applied:
    extravars = dict(settings)
    extravars["gpu_kernel_update_operation"] = "update"
    extravars["gpu_kernel_update_planned"] = {p.host: p.target_kernel for p in batch}
    extravars["gpu_kernel_update_plans"] = {p.host: p.to_dict() for p in batch}
    extravars["kernel_update_batch"] = max(1, len(batch))
    extravars["kernel_update_max_fail_percentage"] = 100  # the flow counts failures itself
    try:
        result = run_playbook(PLAYBOOK, inventory, limit=[p.host for p in batch], extravars=extravars,
                              job_timeout=timeout)
    except KeyboardInterrupt:
        return _Applied({}, {p.host: "interrupted (Ctrl-C) while the batch was being applied" for p in batch},
                        interrupted=True)
    except Exception as exc:  # a timeout, a crashed runner: a failure of these hosts
        why = str(exc) if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
        return _Applied({}, {p.host: f"the playbook did not finish: {why}" for p in batch})
    return _Applied({p.host: result for p in batch}, {})


def undo_hosts(hosts: Sequence[str], inventory: str | Path, settings: Mapping[str, Any]) -> PlaybookResult:
    extravars = dict(settings)
    extravars["gpu_kernel_update_operation"] = "undo"
    return run_playbook(PLAYBOOK, inventory, limit=list(hosts), extravars=extravars, job_timeout=1200)


def kernel_update(
    hosts: Sequence[Host],
    inventory: str | Path,
    audit_options: AuditOptions,
    options: KernelUpdateOptions,
    *,
    fleet: str = "gpu",
    confirm: Callable[[tuple[KernelPlan, ...]], bool] | None = None,
    show_plan: Callable[[tuple[KernelPlan, ...]], None] | None = None,
    hooks: KernelUpdateHooks | None = None,
    lease_hosts: Sequence[Host] | None = None,
) -> KernelUpdateResult:
    """Update ``hosts`` (see the module docstring)."""
    options = options.validate()
    hooks = hooks or KernelUpdateHooks()
    t0 = time.monotonic()
    run_id = new_run_id()
    before = run_audit(hosts, audit_options, fleet=fleet, inventory=str(inventory))
    probed = [h for h in hosts if before.host(h.name).probed]
    cordon = _cordon_markers(probed, audit_options)
    blocks = journal_blocks(probed, audit_options, inventory, path=JOURNAL_PATH, playbook=PLAYBOOK,
                            role="gpu_kernel_update")
    plan = plan_fleet(before, hosts, options, audit_options, cordon, blocks)
    if show_plan is not None:
        show_plan(plan)
    to_change = [p for p in plan if p.changes_host]

    def _still(p: KernelPlan) -> KernelStatus:
        if p.action == "none":
            return KernelStatus.CURRENT
        return KernelStatus.LEFT_ALONE

    def _outcomes(status: KernelStatus) -> tuple[KernelOutcome, ...]:
        return tuple(KernelOutcome(p.host, p, status if p.changes_host else _still(p), detail=p.blocked or p.reason)
                     for p in plan)

    def _done(outcomes: tuple[KernelOutcome, ...], after: AuditResult | None, stopped: str | None,
              lock: LockInfo | None = None, leases: HostLeases | None = None) -> KernelUpdateResult:
        return KernelUpdateResult(fleet, run_id, options, before, plan, outcomes, after, stopped, lock,
                                  time.monotonic() - t0, leases)

    if not to_change:
        return _done(_outcomes(KernelStatus.PLANNED), None, "nothing to do")
    if options.dry_run:
        return _done(_outcomes(KernelStatus.PLANNED), None, "dry-run")
    if confirm is not None and not confirm(plan):
        return _done(_outcomes(KernelStatus.PLANNED), None, "declined")

    by_name = {h.name: h for h in hosts}
    settings = _settings(options, run_id)
    results: dict[str, KernelOutcome] = {
        p.host: KernelOutcome(p.host, p, _still(p), detail=p.blocked or p.reason) for p in plan if not p.changes_host
    }
    failures: list[str] = []
    stopped: str | None = None
    planned = [p.host for p in to_change]
    with (
        fleet_lock(options.state_dir, fleet, planned, ttl_s=options.lock_ttl_s) as lock,
        host_leases(
            lease_hosts if lease_hosts is not None else hosts, run_id=run_id, fleet=fleet, planned=planned,
            ttl_s=options.lock_ttl_s, connect_timeout=audit_options.connect_timeout,
            concurrency=audit_options.concurrency,
        ) as leases,
    ):
        for p in to_change:
            if p.host in leases.unreachable:
                results[p.host] = KernelOutcome(p.host, p, KernelStatus.LEFT_ALONE, where="not leased", detail=UNLEASED)
        leased = [p for p in to_change if p.host not in leases.unreachable]
        batches = [leased[i : i + options.batch] for i in range(0, len(leased), options.batch)]
        for batch in batches:
            names = [p.host for p in batch]
            if stopped is not None:
                for p in batch:
                    results[p.host] = KernelOutcome(p.host, p, KernelStatus.NOT_STARTED, where=stopped,
                                                    detail="not touched: the run stopped before this batch")
                continue
            if hooks.before_batch is not None:
                hooks.before_batch(names)
            leases.renew()
            applied = _apply(batch, inventory, settings, options.batch_timeout)
            gate = run_audit([by_name[n] for n in names], audit_options, fleet=fleet, inventory=str(inventory))
            journals = _read_journals([by_name[n] for n in names], audit_options)
            batch_out: list[KernelOutcome] = []
            for p in batch:
                journal = journals.get(p.host)
                mine = journal is not None and journal.run_id == run_id
                changed = tuple(c.describe() for c in journal.changes) if mine and journal else ()
                undone = journal.undone if mine and journal else ()
                failure = _apply_failure(applied, p.host)
                if failure is None and not options.allow_reboot:
                    batch_out.append(KernelOutcome(p.host, p, KernelStatus.STAGED, detail=(
                        f"{p.target_kernel} installed, gate 1 passed, held; the host still boots {p.booted_kernel} "
                        "(pass --allow-reboot to move it)"), changed=changed))
                    continue
                if failure is None:
                    ok, why = _gate2(p, gate.host(p.host))
                    if ok:
                        batch_out.append(KernelOutcome(p.host, p, KernelStatus.MOVED, detail=why, changed=changed))
                        continue
                    failure = (f"gate 2: {why}", why)
                    if mine and journal is not None and journal.status != "undone":
                        undo = undo_hosts([p.host], inventory, settings)
                        state = undo.hosts.get(p.host)
                        after_j = _read_journals([by_name[p.host]], audit_options).get(p.host)
                        undone = after_j.undone if after_j is not None and after_j.run_id == run_id else ()
                        if state is None or state.state in (HostState.FAILED, HostState.UNREACHABLE):
                            batch_out.append(KernelOutcome(p.host, p, KernelStatus.FAILED, failure[0], failure[1],
                                                           changed, undone, "undo failed: " + (
                                                               "; ".join(state.failures) if state else "no result")))
                            continue
                batch_out.append(KernelOutcome(p.host, p, KernelStatus.FAILED, where=failure[0], detail=failure[1],
                                               changed=changed, undone=undone))
            failed_here = [o for o in batch_out if o.status is KernelStatus.FAILED]
            if failed_here:
                failures.extend(o.host for o in failed_here)
                if applied.interrupted:
                    stopped = f"interrupted (Ctrl-C) during the batch {', '.join(names)}"
                elif len(failures) >= options.max_failures:
                    stopped = (f"stopped after {len(failures)} failed host(s) (--max-failures {options.max_failures}):"
                               f" {failed_here[0].host} at {failed_here[0].where}")
            for o in batch_out:
                results[o.host] = o
            if hooks.after_batch is not None:
                hooks.after_batch(names, batch_out)
    touched = [h for h in hosts if results[h.name].status is not KernelStatus.NOT_STARTED]
    after = run_audit(touched, audit_options, fleet=fleet, inventory=str(inventory)) if touched else None
    return _done(tuple(results[p.host] for p in plan), after, stopped, lock, leases)
