"""``invoke driver-restore``: the emergency S1 restore as a rolling, NVML-gated converge flow.

audit (read-only) -> per-host plan (printed) -> ``--check`` stops -> confirm unless ``--yes`` -> the fleet lock
(local) and the restore lease on every reachable host of the fleet (so a second controller or clone is refused) ->
per batch: apply (each host's method: ``playbooks/driver_restore.yml`` through ``run_playbook`` for apt, limited to
the batch) -> health gate (re-audit the batch: NVML answers with the expected driver, no GPU-DRV-001; the
extension method expects the driver the extension reported, read from this run's journal) -> on a failed
host, undo exactly what this run recorded there -> stop after ``max_failures`` failed hosts; hosts after the stop are
not touched. A host whose restore needs a reboot that was not allowed gets the package work, is reported "reboot
required to finish" and counts as not restored (non-zero exit), but not as a gate failure.

Whatever stops a batch half-way is a failure of the hosts in it, never an error of the whole command: a playbook
that times out, a runner that crashes, an operator's Ctrl-C. Those hosts go through the same gate audit and undo
as any failed host, the run stops, and the incident report says where and why.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar

from remediation.audit import AuditOptions, AuditResult, HostAudit, run_audit
from remediation.errors import RunnerError
from remediation.exitcodes import ExitCode
from remediation.fanout import Status, fan_out
from remediation.inventory import Host
from remediation.runner import HostState, PlaybookResult

from .errors import RestoreError
from .journal import JOURNAL_PATH, Journal, journal_from_dict, unfinished_journal
from .lock import DEFAULT_TTL_S, HostLeases, LockInfo, check_ttl, fleet_lock, host_leases
from .methods import RestoreMethod, method_for
from .rules import CORDON_MARKER, MODULE_SOURCES, Action, Decision, Prefer

__all__ = ["HostOutcome", "HostStatus", "RestoreHooks", "RestoreOptions", "RestoreResult", "driver_restore",
           "journal_blocks", "plan_restore", "undo_run"]


class HostStatus(StrEnum):
    RESTORED = "restored"
    REBOOT_REQUIRED = "reboot-required"
    FAILED = "failed"
    HEALTHY = "healthy"  # nothing to do
    LEFT_ALONE = "left-alone"  # blocked by a guard, cordoned, not probed, not a driver problem, manual
    NOT_STARTED = "not-started"  # after the run stopped
    PLANNED = "planned"  # dry run / not confirmed


@dataclass(frozen=True)
class RestoreOptions:
    method: str = "auto"
    prefer: Prefer = Prefer.REBUILD
    allow_reboot: bool = False
    dry_run: bool = False
    batch: int = 1
    max_failures: int = 1
    force: bool = False
    reboot_timeout: int = 600
    apt_lock_timeout: int = 60
    state_dir: Path = Path(".audit")
    lock_ttl_s: float = DEFAULT_TTL_S
    playbook_timeout: int = 0  # seconds one batch's playbook may run; 0: reboot_timeout + 1200
    module_source: str = "auto"  # auto | dkms | signed (rules.choose_module_source)

    @property
    def batch_timeout(self) -> int:
        return self.playbook_timeout or self.reboot_timeout + 1200

    def validate(self) -> RestoreOptions:
        if self.batch < 1:
            raise RestoreError(f"--batch {self.batch} must be at least 1")
        if self.max_failures < 1:
            raise RestoreError(f"--max-failures {self.max_failures} must be at least 1")
        if self.reboot_timeout < 1:
            raise RestoreError(f"--reboot-timeout {self.reboot_timeout} must be a positive number of seconds")
        if self.playbook_timeout < 0:
            raise RestoreError(f"driver_restore.playbook_timeout {self.playbook_timeout} must be 0 or more seconds")
        if (bad := check_ttl(self.lock_ttl_s, "driver_restore.lock_ttl_s")) is not None:
            raise RestoreError(bad)
        Prefer(self.prefer)
        if self.module_source not in MODULE_SOURCES:
            raise RestoreError(
                f"driver_restore.module_source {self.module_source!r} is not one of {', '.join(MODULE_SOURCES)}"
            )
        return self


@dataclass(frozen=True)
class HostOutcome:
    host: str
    decision: Decision
    status: HostStatus
    where: str | None = None  # failed: "apply: <task>" | "gate: <why>"; not-started: why
    detail: str = ""
    changed: tuple[str, ...] = ()  # what this run recorded in the host's journal
    undone: tuple[str, ...] = ()
    undo_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in (HostStatus.RESTORED, HostStatus.HEALTHY)


class _Outcome(Protocol):
    @property
    def host(self) -> str: ...

    @property
    def ok(self) -> bool: ...


_O = TypeVar("_O", bound=_Outcome)


def new_run_id() -> str:
    """The id of one rolling run (restore or kernel update): UTC time plus a random suffix."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def rolling_outcome(outcomes: Sequence[_O], host: str) -> _O:
    """The outcome of ``host`` in a rolling run's outcomes (KeyError when it was not part of the run)."""
    for o in outcomes:
        if o.host == host:
            return o
    raise KeyError(host)


def rolling_exit_code(outcomes: Sequence[_Outcome], stopped: str | None) -> ExitCode:
    """OK: every host ok, or nothing was to change (--check, declined); FINDINGS: a host is not ok."""
    if stopped in ("dry-run", "declined"):
        return ExitCode.OK
    return ExitCode.OK if all(o.ok for o in outcomes) else ExitCode.FINDINGS


@dataclass(frozen=True)
class RestoreResult:
    fleet: str
    run_id: str
    options: RestoreOptions
    before: AuditResult
    plan: tuple[Decision, ...]
    outcomes: tuple[HostOutcome, ...]
    after: AuditResult | None
    stopped: str | None  # "dry-run" | "declined" | "nothing to do" | "stopped after N failure(s) at HOST" | None
    lock: LockInfo | None = None
    seconds: float = 0.0
    leases: HostLeases | None = None

    def outcome(self, host: str) -> HostOutcome:
        return rolling_outcome(self.outcomes, host)

    @property
    def failed(self) -> list[HostOutcome]:
        return [o for o in self.outcomes if o.status is HostStatus.FAILED]

    @property
    def exit_code(self) -> ExitCode:
        """OK: every host restored or healthy (or a dry run / not confirmed); FINDINGS: a host is not restored."""
        return rolling_exit_code(self.outcomes, self.stopped)


@dataclass
class RestoreHooks:
    """Callbacks for progress output and tests: each gets the batch's host names."""

    before_batch: Callable[[list[str]], None] | None = None
    after_batch: Callable[[list[str], list[HostOutcome]], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _cordon_markers(hosts: Sequence[Host], options: AuditOptions) -> dict[str, str | None]:
    cmd = f"if [ -e {CORDON_MARKER} ]; then echo GPUFLEET-CORDONED; head -c 400 {CORDON_MARKER}; fi"
    runs = fan_out(hosts, cmd, concurrency=options.concurrency, connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, str | None] = {}
    for name, run in runs.runs.items():
        if run.status is Status.OK and run.stdout.startswith("GPUFLEET-CORDONED"):
            out[name] = run.stdout.split("\n", 1)[1] if "\n" in run.stdout else ""
        else:
            out[name] = None
    return out


def read_journals(hosts: Sequence[Host], options: AuditOptions) -> dict[str, Journal | None]:
    runs = fan_out(hosts, f"cat {JOURNAL_PATH} 2>/dev/null || true", concurrency=options.concurrency,
                   connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, Journal | None] = {}
    for name, run in runs.runs.items():
        try:
            out[name] = journal_from_dict(json.loads(run.stdout)) if run.status is Status.OK and run.stdout else None
        except ValueError:
            out[name] = None
    return out


def journal_blocks(
    hosts: Sequence[Host], options: AuditOptions, inventory: str | Path, *, path: str = JOURNAL_PATH,
    playbook: str = "playbooks/driver_restore.yml", role: str = "nvidia_driver_restore",
) -> dict[str, str]:
    """host -> why its journal at ``path`` blocks a new change (a run not finished, or whose undo failed)."""
    runs = fan_out(hosts, f"cat {path} 2>/dev/null || true", concurrency=options.concurrency,
                   connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, str] = {}
    for name, run in runs.runs.items():
        if run.status is not Status.OK:
            continue  # not reachable now: the role refuses it there if it comes back with such a journal
        why = unfinished_journal(run.stdout, path=path, host=name, inventory=str(inventory), playbook=playbook,
                                 operation_var=f"{role}_operation", run_id_var=f"{role}_run_id")
        if why is not None:
            out[name] = why
    return out


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
        from .methods import AptMethod

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


UNLEASED = ("not changed by this run: unreachable when the run took its leases, so nothing kept another run off it;"
            " run again once it answers")


def _status_without_change(d: Decision) -> HostStatus:
    return HostStatus.HEALTHY if d.action is Action.NONE and d.blocked is None else HostStatus.LEFT_ALONE


def _settings(options: RestoreOptions, run_id: str) -> dict[str, Any]:
    return {
        "nvidia_driver_restore_run_id": run_id,
        "nvidia_driver_restore_prefer": Prefer(options.prefer).value,
        "nvidia_driver_restore_module_source": options.module_source,
        "nvidia_driver_restore_force": options.force,
        "nvidia_driver_restore_allow_reboot": options.allow_reboot,
        "nvidia_driver_restore_reboot_timeout": options.reboot_timeout,
        "nvidia_driver_restore_lock_timeout": options.apt_lock_timeout,
        "nvidia_driver_restore_playbook_timeout": options.batch_timeout,
    }


@dataclass(frozen=True)
class _Applied:
    """What applying one batch gave: each method's result, or why the apply stopped before it had one."""

    results: dict[str, PlaybookResult]  # host -> the result of its method's run
    broken: dict[str, str]  # host -> why its apply stopped (timeout, runner crash, Ctrl-C)
    interrupted: bool = False


def _apply_batch(
    batch: Sequence[Decision], methods: dict[str, RestoreMethod], inventory: str | Path, settings: dict[str, Any]
) -> _Applied:
    """Apply each method to its hosts of the batch; a method run that does not finish fails its hosts."""
    groups: dict[str, list[Decision]] = {}
    for d in batch:
        groups.setdefault(methods[d.host].name, []).append(d)
    results: dict[str, PlaybookResult] = {}
    broken: dict[str, str] = {}
    for decisions in groups.values():
        method = methods[decisions[0].host]
        try:
            result = method.apply(decisions, inventory, settings)
        except KeyboardInterrupt:
            for d in decisions:
                broken[d.host] = "interrupted (Ctrl-C) while the batch was being applied"
            return _Applied(results, broken, interrupted=True)
        except Exception as exc:  # a timeout, a crashed runner: a failure of these hosts, handled like any other
            why = str(exc) if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
            for d in decisions:
                broken[d.host] = f"{method.name} did not finish: {why}"
            continue
        for d in decisions:
            results[d.host] = result
    return _Applied(results, broken)


def _apply_failure(applied: _Applied, host: str) -> tuple[str, str] | None:
    """(where, detail) when the apply did not finish for the host, or Ansible failed it or could not reach it."""
    if host in applied.broken:
        return "apply: did not finish", applied.broken[host]
    result = applied.results.get(host)
    if result is None:
        return "apply", "no result from Ansible for this host"
    outcome = result.hosts.get(host)
    if outcome is None:
        return "apply", "no result from Ansible for this host"
    if outcome.state is HostState.UNREACHABLE:
        return "apply: host unreachable", "; ".join(outcome.failures) or "unreachable"
    if outcome.state is HostState.FAILED:
        first = outcome.failures[0] if outcome.failures else "failed"
        task = first.split(": ", 1)[0]
        detail = "; ".join(outcome.failures)
        plain = [why for text, why in _ANSIBLE_FAILURES if text in detail]
        return f"apply: {task}", "; ".join([*plain, detail])
    return None


# Ansible's words for what went wrong -> what happened to the host, in the report's first words.
_ANSIBLE_FAILURES = (
    (
        "Timed out waiting for last boot time check",
        "the host did not reboot, or did not come back, within the reboot timeout (its boot id never changed)",
    ),
    (
        "Timed out waiting for post-reboot test command",
        "the host rebooted but did not run commands again within the reboot timeout",
    ),
    ("Could not get lock", "another apt/dpkg process held the dpkg lock past the lock timeout"),
)


def driver_restore(
    hosts: Sequence[Host],
    inventory: str | Path,
    audit_options: AuditOptions,
    options: RestoreOptions,
    *,
    fleet: str = "gpu",
    confirm: Callable[[tuple[Decision, ...]], bool] | None = None,
    show_plan: Callable[[tuple[Decision, ...]], None] | None = None,
    hooks: RestoreHooks | None = None,
    lease_hosts: Sequence[Host] | None = None,
) -> RestoreResult:
    """Restore ``hosts`` (see the module docstring). ``lease_hosts``: the whole fleet, whose every reachable host
    carries this run's lease while it runs (default: ``hosts``)."""
    options = options.validate()
    hooks = hooks or RestoreHooks()
    t0 = time.monotonic()
    run_id = new_run_id()
    before = run_audit(hosts, audit_options, fleet=fleet, inventory=str(inventory))
    probed = [h for h in hosts if before.host(h.name).probed]
    cordon = _cordon_markers(probed, audit_options)
    plan, methods = plan_restore(before, hosts, options, cordon, journal_blocks(probed, audit_options, inventory))
    if show_plan is not None:
        show_plan(plan)
    to_change = [d for d in plan if d.changes_host]

    def _outcomes(status_for_change: HostStatus) -> tuple[HostOutcome, ...]:
        return tuple(
            HostOutcome(d.host, d, status_for_change if d.changes_host else _status_without_change(d),
                        detail=d.blocked or d.reason)
            for d in plan
        )

    def _done(outcomes: tuple[HostOutcome, ...], after: AuditResult | None, stopped: str | None,
              lock: LockInfo | None = None, leases: HostLeases | None = None) -> RestoreResult:
        return RestoreResult(fleet, run_id, options, before, plan, outcomes, after, stopped, lock,
                             time.monotonic() - t0, leases)

    if not to_change:
        return _done(_outcomes(HostStatus.PLANNED), None, "nothing to do")
    if options.dry_run:
        return _done(_outcomes(HostStatus.PLANNED), None, "dry-run")
    if confirm is not None and not confirm(plan):
        return _done(_outcomes(HostStatus.PLANNED), None, "declined")

    by_name = {h.name: h for h in hosts}
    settings = _settings(options, run_id)
    results: dict[str, HostOutcome] = {
        d.host: HostOutcome(d.host, d, _status_without_change(d), detail=d.blocked or d.reason)
        for d in plan if not d.changes_host
    }
    failures: list[str] = []
    stopped: str | None = None
    planned = [d.host for d in to_change]
    with (
        fleet_lock(options.state_dir, fleet, planned, ttl_s=options.lock_ttl_s) as lock,
        host_leases(
            lease_hosts if lease_hosts is not None else hosts, run_id=run_id, fleet=fleet, planned=planned,
            ttl_s=options.lock_ttl_s, connect_timeout=audit_options.connect_timeout,
            concurrency=audit_options.concurrency,
        ) as leases,
    ):
        for d in to_change:
            if d.host in leases.unreachable:
                results[d.host] = HostOutcome(d.host, d, HostStatus.LEFT_ALONE, where="not leased", detail=UNLEASED)
        leased = [d for d in to_change if d.host not in leases.unreachable]
        batches = [leased[i : i + options.batch] for i in range(0, len(leased), options.batch)]
        for batch in batches:
            names = [d.host for d in batch]
            if stopped is not None:
                for d in batch:
                    results[d.host] = HostOutcome(d.host, d, HostStatus.NOT_STARTED, where=stopped,
                                                  detail="not touched: the run stopped before this batch")
                continue
            if hooks.before_batch is not None:
                hooks.before_batch(names)
            leases.renew()
            applied = _apply_batch(batch, methods, inventory, settings)
            gate_audit = run_audit([by_name[n] for n in names], audit_options, fleet=fleet, inventory=str(inventory))
            journals = read_journals([by_name[n] for n in names], audit_options)
            batch_out: list[HostOutcome] = []
            failed_here: list[Decision] = []
            for d in batch:
                journal = journals.get(d.host)
                changed = tuple(c.describe() for c in journal.changes) if journal and journal.run_id == run_id else ()
                failure = _apply_failure(applied, d.host)
                after_h = gate_audit.host(d.host)
                if failure is None:
                    pending = d.needs_reboot and not options.allow_reboot
                    if pending:
                        batch_out.append(HostOutcome(d.host, d, HostStatus.REBOOT_REQUIRED, detail=(
                            "package work done; reboot required to finish (pass --allow-reboot)"), changed=changed))
                        continue
                    ours = journal if journal is not None and journal.run_id == run_id else None
                    gate = methods[d.host].verify(d, after_h, ours)
                    if gate.ok:
                        batch_out.append(HostOutcome(d.host, d, HostStatus.RESTORED, detail=gate.detail,
                                                     changed=changed))
                        continue
                    failure = (f"gate: {gate.detail}", gate.detail)
                failed_here.append(d)
                batch_out.append(HostOutcome(d.host, d, HostStatus.FAILED, where=failure[0], detail=failure[1],
                                             changed=changed))
            if failed_here:
                batch_out = _undo_failed(batch_out, methods, inventory, settings, by_name, audit_options, run_id)
                failures.extend(d.host for d in failed_here)
                first = next(o for o in batch_out if o.status is HostStatus.FAILED)
                if applied.interrupted:
                    stopped = f"interrupted (Ctrl-C) during the batch {', '.join(names)}: {first.host} undone"
                elif len(failures) >= options.max_failures:
                    stopped = (f"stopped after {len(failures)} failed host(s) (--max-failures "
                               f"{options.max_failures}): {first.host} at {first.where}")
            for o in batch_out:
                results[o.host] = o
            if hooks.after_batch is not None:
                hooks.after_batch(names, batch_out)
    touched = [h for h in hosts if results[h.name].status not in (HostStatus.NOT_STARTED,)]
    after = run_audit(touched, audit_options, fleet=fleet, inventory=str(inventory)) if touched else None
    outcomes = tuple(results[d.host] for d in plan)
    return _done(outcomes, after, stopped, lock, leases)


def _undo_failed(
    batch_out: list[HostOutcome],
    methods: dict[str, RestoreMethod],
    inventory: str | Path,
    settings: dict[str, Any],
    by_name: dict[str, Host],
    audit_options: AuditOptions,
    run_id: str,
) -> list[HostOutcome]:
    """Undo on the failed hosts what this run recorded (the role's rescue may have done it: then nothing is left)."""
    failed = [o for o in batch_out if o.status is HostStatus.FAILED]
    journals = read_journals([by_name[o.host] for o in failed], audit_options)
    reachable = [
        o.host for o in failed if journals.get(o.host) is not None or _reachable(by_name[o.host], audit_options)
    ]
    needs = [h for h in reachable if (j := journals.get(h)) is not None and j.run_id == run_id and j.status != "undone"]
    undo_results: dict[str, PlaybookResult] = {}
    by_method: dict[str, list[str]] = {}
    for h in needs:
        by_method.setdefault(methods[h].name, []).append(h)
    for names in by_method.values():
        result = methods[names[0]].undo(names, inventory, settings)
        undo_results.update(dict.fromkeys(names, result))
    after = read_journals([by_name[o.host] for o in failed], audit_options) if needs else journals
    out = []
    for o in batch_out:
        if o.status is not HostStatus.FAILED:
            out.append(o)
            continue
        j = after.get(o.host)
        error = None
        if o.host not in reachable:
            error = "host unreachable: could not undo; the journal on the host lists this run's changes"
        elif o.host in undo_results:
            u = undo_results[o.host].hosts.get(o.host)
            if u is None or u.state in (HostState.FAILED, HostState.UNREACHABLE):
                error = "undo failed: " + ("; ".join(u.failures) if u else "no result")
        undone = j.undone if j is not None and j.run_id == run_id else ()
        out.append(HostOutcome(o.host, o.decision, o.status, o.where, o.detail, o.changed, undone, error))
    return out


def _reachable(host: Host, audit_options: AuditOptions) -> bool:
    run = fan_out([host], "true", concurrency=1, connect_timeout=audit_options.connect_timeout, timeout=15)
    return run.runs[host.name].status is Status.OK


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
    from .methods import METHODS

    journals = read_journals(hosts, audit_options or AuditOptions())
    by_method: dict[str, list[str]] = {}
    for h in hosts:
        journal = journals.get(h.name)
        azure = journal is not None and any(c.kind == "azure_extension" for c in journal.changes)
        by_method.setdefault("azure-extension" if azure else "apt", []).append(h.name)
    results = [METHODS[name]().undo(names, inventory, _settings(options, run_id)) for name, names in by_method.items()]
    merged: dict[str, Any] = {}
    for result in results:
        merged.update(result.hosts)
    worst = max((r.rc for r in results), default=0)
    status = next((r.status for r in results if r.rc), results[0].status if results else "successful")
    return PlaybookResult(run_id, worst, status, merged, "\n".join(r.stdout_tail for r in results if r.stdout_tail))


def host_audit(result: AuditResult | None, host: str) -> HostAudit | None:
    if result is None:
        return None
    try:
        return result.host(host)
    except KeyError:
        return None
