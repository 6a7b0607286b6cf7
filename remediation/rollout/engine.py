"""One engine for every rolling change of the fleet: the driver restore (apt, Azure extension) and the kernel update.

plan -> preview (``--check``) or confirm -> the fleet lock (local) and a lease on every reachable host of the fleet ->
per batch: renew the leases (one lost: stop before the batch) -> apply -> gate (a re-audit of the batch) -> journal
-> undo on every failed host what this run recorded there -> stop rules (failure limit, Ctrl-C) -> final audit of the
touched hosts (a host done reuses its gate audit). The leases are renewed before every batch but the first, which
starts right after they were taken; a batch's gate audit and journal read run at the same time. The change itself
is an adapter (:class:`Change`): it plans each host, applies a batch, judges a host after the gate audit and undoes
a host; the engine owns everything else, so every change gets the same guarantees:

- a batch whose apply times out, crashes or gets SIGINT is a failed batch: its hosts are gated, undone and reported
  like any failed host, the run stops and the incident report says where and why (exit 1, never a traceback); a host
  of that batch whose journal shows its own work finished (applied, staged, reboot-required) is judged by the gate;
- an undo that fails (or cannot reach its host) is reported per host with the state it left, never raised;
- a lease another run holds at a renewal stops the run before the next batch;
- a host whose journal of this change is unfinished (a run killed or cut short, an undo that failed) is left alone
  with one line naming the journal and its undo, also where the plan has nothing to do on it (a run killed after
  its own work took effect, before its journal said so): such a host is never reported unchanged;
- hosts after a stop are not touched, and say why.

The engine is generic over the plan item (``P``: a restore :class:`~remediation.restore.rules.Decision`, a
:class:`~remediation.kernelupdate.rules.KernelPlan`) and the adapter's own outcome type (``OutT``), built from the
engine's :class:`Verdict` by :meth:`Change.outcome`, so each change keeps its own words (restored / moved, ...).
"""

from __future__ import annotations

import datetime as _dt
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from remediation.core.errors import RunnerError
from remediation.core.exitcodes import ExitCode
from remediation.host.audit import AuditOptions, AuditResult, HostAudit, run_audit
from remediation.rollout.cordon import cordon_markers
from remediation.rollout.journal import FINISHED, Journal, journal_from_dict, unfinished_journal
from remediation.rollout.lock import DEFAULT_TTL_S, HostLeases, LockInfo, check_ttl, fleet_lock, host_leases
from remediation.transport.fanout import Status, fan_out
from remediation.transport.inventory import Host
from remediation.transport.runner import HostState, PlaybookResult

__all__ = ["Applied", "Change", "ChangeKind", "ChangeSpec", "HostResult", "Outcome", "PlanItem", "PlannedChange",
           "Rollout", "RolloutControls", "RolloutHooks", "RolloutOptions", "RolloutSettings", "StopReason", "Verdict",
           "apply_failure", "new_run_id", "read_journals", "run_rollout"]


class ChangeKind(StrEnum):
    """What a rolling run changes; recorded in the fleet lock and every host lease it holds."""

    DRIVER_RESTORE = "driver-restore"
    KERNEL_UPDATE = "kernel-update"


@dataclass(frozen=True)
class ChangeSpec:
    """What the engine needs to know of a kind of change besides its methods."""

    kind: ChangeKind
    journal_path: str  # where the role writes this change's journal on a host
    playbook: str  # named in the line that tells how to finish or undo a blocked host
    role: str


class StopReason(StrEnum):
    """Why a run ended before (or instead of) changing every planned host. None on a result: it ran to the end."""

    NOTHING_TO_DO = "nothing to do"
    PREVIEW = "preview"  # --check / --dry-run: the plan only
    DECLINED = "declined"  # the operator answered no
    MAX_FAILURES = "max-failures"
    INTERRUPTED = "interrupted"  # Ctrl-C / SIGINT during a batch
    LEASE_LOST = "lease-lost"  # another run holds a lease this run held

    @property
    def changed_nothing(self) -> bool:
        """True when the run stopped before taking any lock: no host was touched, no report is written."""
        return self in (StopReason.NOTHING_TO_DO, StopReason.PREVIEW, StopReason.DECLINED)


class Verdict(StrEnum):
    """The engine's view of one host at the end of a run (each adapter names these in its own words)."""

    DONE = "done"  # changed and the gate passed
    PENDING = "pending"  # changed as far as allowed; a reboot the run was not allowed to do is left
    FAILED = "failed"
    UNCHANGED = "unchanged"  # nothing to do on this host
    LEFT_ALONE = "left-alone"  # a guard, a cordon, a journal, not probed, not leased
    NOT_STARTED = "not-started"  # after the run stopped
    PLANNED = "planned"  # preview / declined


@dataclass(frozen=True)
class RolloutSettings:
    """How a rolling change runs, whatever it changes."""

    batch: int = 1
    max_failures: int = 1
    dry_run: bool = False
    state_dir: Path = Path(".audit")
    lock_ttl_s: float = DEFAULT_TTL_S
    batch_timeout: int = 1800  # seconds one batch's apply may run

    def problem(self, section: str) -> str | None:
        """Why these settings cannot run (one line naming the input), or None."""
        if self.batch < 1:
            return f"--batch {self.batch} must be at least 1"
        if self.max_failures < 1:
            return f"--max-failures {self.max_failures} must be at least 1"
        return check_ttl(self.lock_ttl_s, f"{section}.lock_ttl_s")


@dataclass(frozen=True)
class RolloutOptions:
    """The options every change's run shares (each adapter's options add their own); :meth:`rollout` is what the
    engine takes from them."""

    allow_reboot: bool = False
    dry_run: bool = False
    batch: int = 1
    max_failures: int = 1
    force: bool = False
    reboot_timeout: int = 600
    apt_lock_timeout: int = 60
    state_dir: Path = Path(".audit")
    lock_ttl_s: float = DEFAULT_TTL_S
    playbook_timeout: int = 0  # seconds one batch's playbook may run; 0: reboots_per_batch x reboot_timeout + 1200
    module_source: str = "auto"  # auto | dkms | signed

    #: Reboots one batch may wait for (the default batch timeout counts them).
    reboots_per_batch: ClassVar[int] = 1

    @property
    def batch_timeout(self) -> int:
        return self.playbook_timeout or self.reboots_per_batch * self.reboot_timeout + 1200

    def rollout(self) -> RolloutSettings:
        return RolloutSettings(self.batch, self.max_failures, self.dry_run, self.state_dir, self.lock_ttl_s,
                               self.batch_timeout)

    def problem(self, section: str) -> str | None:
        """Why these options cannot run (one line naming the input), or None; ``section``: the settings' section."""
        if (bad := self.rollout().problem(section)) is not None:
            return bad
        if self.reboot_timeout < 1:
            return f"--reboot-timeout {self.reboot_timeout} must be a positive number of seconds"
        if self.playbook_timeout < 0:
            return f"{section}.playbook_timeout {self.playbook_timeout} must be 0 or more seconds"
        return None


class PlanItem(Protocol):
    """What the engine's adapters plan for one host (a restore decision, a kernel plan)."""

    @property
    def host(self) -> str: ...

    @property
    def blocked(self) -> str | None: ...

    @property
    def reason(self) -> str: ...

    @property
    def changes_host(self) -> bool: ...


class _HasHost(Protocol):
    @property
    def host(self) -> str: ...


P = TypeVar("P")
OutT = TypeVar("OutT", bound=_HasHost)
OutT_co = TypeVar("OutT_co", bound=_HasHost, covariant=True)
S = TypeVar("S")
St = TypeVar("St")
PI = TypeVar("PI", bound="PlanItem")
OutR = TypeVar("OutR", bound="HostResult[Any, Any]")


@dataclass(frozen=True)
class HostResult(Generic[P, St]):
    """One host at the end of a run: its plan item and a status (the engine's :class:`Verdict`, or an adapter's own
    words for it)."""

    host: str
    item: P
    status: St
    where: str | None = None  # failed: "apply: <task>" | "gate: <why>"; not-started / left alone: why
    detail: str = ""
    changed: tuple[str, ...] = ()  # what this run recorded in the host's journal
    undone: tuple[str, ...] = ()
    undo_error: str | None = None

    #: An adapter's outcome type: its status for each of the engine's verdicts.
    statuses: ClassVar[Mapping[Verdict, Any]] = {}

    @property
    def ok(self) -> bool:
        """Done, or nothing to do."""
        return self.status in (self.statuses.get(Verdict.DONE, Verdict.DONE),
                               self.statuses.get(Verdict.UNCHANGED, Verdict.UNCHANGED))


@dataclass(frozen=True)
class Outcome(HostResult[P, Verdict]):
    """One host at the end of a run, as the engine saw it (adapters turn it into their own outcome type)."""

    @property
    def verdict(self) -> Verdict:
        return self.status


@dataclass(frozen=True)
class Applied:
    """What applying one batch gave: each host's playbook result, or why the apply stopped before it had one."""

    results: dict[str, PlaybookResult] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)  # host -> why its apply did not finish
    interrupted: bool = False


class Change(Protocol[P, OutT_co]):
    """One kind of fleet change, as the engine drives it."""

    spec: ChangeSpec

    def plan(self, before: AuditResult, hosts: Sequence[Host], cordon: Mapping[str, str | None],
             blocks: Mapping[str, str], run_id: str) -> tuple[P, ...]:
        """Every host's plan item (pure but for read-only questions to hosts); ``blocks``: host -> why its
        unfinished journal leaves it alone."""

    def host_of(self, item: P) -> str: ...

    def changes(self, item: P) -> bool:
        """Whether the item changes its host (planned, not blocked)."""

    def unchanged(self, item: P) -> Verdict:
        """UNCHANGED (nothing to do) or LEFT_ALONE for an item that does not change its host."""

    def reason(self, item: P) -> str: ...

    def apply(self, batch: Sequence[P], run_id: str) -> Applied:
        """Apply one batch; may raise (a timeout, a crash, KeyboardInterrupt): the engine fails the batch."""

    def judge(self, item: P, after: HostAudit, journal: Journal | None) -> tuple[Verdict, str, str]:
        """A host whose apply finished: (DONE | PENDING | FAILED, where, detail) from the gate audit and this run's
        journal on the host (None: nothing, or another run's)."""

    def undo(self, hosts: Sequence[str], run_id: str) -> PlaybookResult:
        """Undo what run ``run_id`` recorded on ``hosts`` (may raise: the engine reports it per host)."""

    def outcome(self, o: Outcome[P]) -> OutT_co: ...


@dataclass
class RolloutHooks(Generic[OutT]):
    """Callbacks for progress output and tests: each gets the batch's host names."""

    before_batch: Callable[[list[str]], None] | None = None
    after_batch: Callable[[list[str], list[OutT]], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class RolloutControls(TypedDict, Generic[P, OutT], total=False):
    """What a caller may pass to a change's entry (``driver_restore``, ``kernel_update``) besides its options."""

    fleet: str
    confirm: Callable[[tuple[P, ...]], bool] | None
    show_plan: Callable[[tuple[P, ...]], None] | None
    hooks: RolloutHooks[OutT] | None
    lease_hosts: Sequence[Host] | None  # the whole fleet, whose every reachable host carries the run's lease


class PlannedChange(Generic[PI, OutR]):
    """What the adapters of :class:`Change` share: a plan item that names its host, whether it changes it and why
    (:class:`PlanItem`), and an outcome type that is a :class:`HostResult` in the adapter's words (its
    ``statuses``: the adapter's status for each :class:`Verdict`)."""

    spec: ChangeSpec
    outcome_type: type[OutR]

    def host_of(self, item: PI) -> str:
        return item.host

    def changes(self, item: PI) -> bool:
        return item.changes_host

    def reason(self, item: PI) -> str:
        return item.blocked or item.reason

    def outcome(self, o: Outcome[PI]) -> OutR:
        build = self.outcome_type
        return build(o.host, o.item, build.statuses[o.verdict], o.where, o.detail, o.changed, o.undone, o.undo_error)


@dataclass(frozen=True)
class Rollout(Generic[S, P, OutT]):
    """What one run planned and did (``S``: the change's options, ``P`` its plan item, ``OutT`` its outcome)."""

    fleet: str
    run_id: str
    change: ChangeKind
    options: S
    before: AuditResult
    plan: tuple[P, ...]
    outcomes: tuple[OutT, ...]
    verdicts: Mapping[str, Verdict]
    after: AuditResult | None
    stopped: StopReason | None
    stop_detail: str = ""  # the stop in one line (which host, where, why)
    lock: LockInfo | None = None
    seconds: float = 0.0
    leases: HostLeases | None = None

    def outcome(self, host: str) -> OutT:
        """The outcome of ``host`` (KeyError when it was not part of the run)."""
        for o in self.outcomes:
            if o.host == host:
                return o
        raise KeyError(host)

    @property
    def failed(self) -> list[OutT]:
        return [o for o in self.outcomes if self.verdicts.get(o.host) is Verdict.FAILED]

    @property
    def exit_code(self) -> ExitCode:
        """OK: every host done or unchanged, or the plan only (preview, declined); FINDINGS: a host is not (also when
        nothing was to do because every host that needs a change is left alone)."""
        if self.stopped in (StopReason.PREVIEW, StopReason.DECLINED):
            return ExitCode.OK
        done = all(v in (Verdict.DONE, Verdict.UNCHANGED) for v in self.verdicts.values())
        return ExitCode.OK if done else ExitCode.FINDINGS


def new_run_id() -> str:
    """The id of one rolling run: UTC time plus a random suffix."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def read_journals(hosts: Sequence[Host], path: str, options: AuditOptions) -> dict[str, Journal | None]:
    """Each host's journal at ``path`` (None: none, unreadable, or the host did not answer)."""
    runs = fan_out(hosts, f"cat {path} 2>/dev/null || true", concurrency=options.concurrency,
                   connect_timeout=options.connect_timeout, timeout=30)
    out: dict[str, Journal | None] = {}
    for name, run in runs.runs.items():
        try:
            out[name] = journal_from_dict(json.loads(run.stdout)) if run.status is Status.OK and run.stdout else None
        except ValueError:
            out[name] = None
    return out


def journal_blocks(hosts: Sequence[Host], options: AuditOptions, inventory: str | Path, *, path: str,
                   playbook: str, role: str) -> dict[str, str]:
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


def apply_failure(applied: Applied, host: str) -> tuple[str, str] | None:
    """(where, detail) when the apply did not finish for the host, or Ansible failed it or could not reach it."""
    if host in applied.broken:
        return "apply: did not finish", applied.broken[host]
    result = applied.results.get(host)
    outcome = result.hosts.get(host) if result is not None else None
    if outcome is None:
        return "apply", "no result from Ansible for this host"
    if outcome.state is HostState.UNREACHABLE:
        return "apply: host unreachable", "; ".join(outcome.failures) or "unreachable"
    if outcome.state is HostState.FAILED:
        first = outcome.failures[0] if outcome.failures else "failed"
        detail = "; ".join(outcome.failures)
        plain = [why for text, why in _ANSIBLE_FAILURES if text in detail]
        return f"apply: {first.split(': ', 1)[0]}", "; ".join([*plain, detail])
    return None


def _apply_guarded(change: Change[P, OutT], batch: Sequence[P], run_id: str) -> Applied:
    """The adapter's apply; whatever stops it half-way fails the batch's hosts instead of the whole command."""
    names = [change.host_of(p) for p in batch]
    try:
        return change.apply(batch, run_id)
    except KeyboardInterrupt:
        return Applied({}, dict.fromkeys(names, "interrupted (Ctrl-C) while the batch was being applied"),
                       interrupted=True)
    except Exception as exc:  # a timeout, a crashed runner: a failure of these hosts, handled like any other
        why = str(exc) if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
        return Applied({}, dict.fromkeys(names, f"the apply did not finish: {why}"))


def _reachable(host: Host, options: AuditOptions) -> bool:
    run = fan_out([host], "true", concurrency=1, connect_timeout=options.connect_timeout, timeout=15)
    return run.runs[host.name].status is Status.OK


def _undo_failed(change: Change[P, OutT], failed: list[Outcome[P]], by_name: Mapping[str, Host], run_id: str,
                 options: AuditOptions) -> list[Outcome[P]]:
    """Undo on the failed hosts what this run recorded (a role's rescue may have done it: then nothing is left).

    Never raises: an undo that fails, times out or cannot reach its host is that host's ``undo_error``, with its
    journal (on the host) still listing what is left."""
    if not failed:
        return []
    hosts = [by_name[o.host] for o in failed]
    journals = read_journals(hosts, change.spec.journal_path, options)
    reachable = {o.host for o in failed if journals.get(o.host) is not None or _reachable(by_name[o.host], options)}
    needs = [o.host for o in failed if o.host in reachable and (j := journals.get(o.host)) is not None
             and j.run_id == run_id and j.status != "undone"]
    errors: dict[str, str] = {}
    if needs:
        try:
            result = change.undo(needs, run_id)
        except KeyboardInterrupt:
            errors.update(dict.fromkeys(needs, "undo interrupted (Ctrl-C)"))
        except Exception as exc:
            why = str(exc) if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
            errors.update(dict.fromkeys(needs, f"undo did not finish: {why}"))
        else:
            for h in needs:
                u = result.hosts.get(h)
                if u is None or u.state in (HostState.FAILED, HostState.UNREACHABLE):
                    errors[h] = "undo failed: " + ("; ".join(u.failures) if u else "no result from Ansible")
        journals = read_journals(hosts, change.spec.journal_path, options)
    out = []
    for o in failed:
        j = journals.get(o.host)
        mine = j if j is not None and j.run_id == run_id else None
        error = errors.get(o.host)
        if o.host not in reachable:
            error = "host unreachable: could not undo; the journal on the host lists this run's changes"
        if error is not None and mine is not None and mine.status != "undone":
            error += f" (journal {change.spec.journal_path} on the host: {mine.status}, {len(mine.changes)} change(s))"
        out.append(Outcome(o.host, o.item, o.verdict, o.where, o.detail, o.changed,
                           mine.undone if mine is not None else (), error))
    return out


def run_rollout(
    change: Change[P, OutT],
    hosts: Sequence[Host],
    inventory: str | Path,
    audit_options: AuditOptions,
    settings: RolloutSettings,
    options: S,
    *,
    fleet: str = "gpu",
    confirm: Callable[[tuple[P, ...]], bool] | None = None,
    show_plan: Callable[[tuple[P, ...]], None] | None = None,
    hooks: RolloutHooks[OutT] | None = None,
    lease_hosts: Sequence[Host] | None = None,
    run_id: str | None = None,
) -> Rollout[S, P, OutT]:
    """Run ``change`` on ``hosts`` (see the module docstring). ``lease_hosts``: the whole fleet, whose every
    reachable host carries this run's lease while it runs (default: ``hosts``)."""
    hooks = hooks or RolloutHooks()
    t0 = time.monotonic()
    run_id = run_id or new_run_id()
    before = run_audit(hosts, audit_options, fleet=fleet, inventory=str(inventory))
    probed = [h for h in hosts if before.host(h.name).probed]
    cordon = cordon_markers(probed, audit_options, own_run=run_id)
    spec = change.spec
    blocks = journal_blocks(probed, audit_options, inventory, path=spec.journal_path, playbook=spec.playbook,
                            role=spec.role)
    plan = change.plan(before, hosts, cordon, blocks, run_id)
    if show_plan is not None:
        show_plan(plan)
    to_change = [p for p in plan if change.changes(p)]
    verdicts: dict[str, Verdict] = {}
    results: dict[str, OutT] = {}

    def record(o: Outcome[P]) -> OutT:
        verdicts[o.host] = o.verdict
        results[o.host] = change.outcome(o)
        return results[o.host]

    def done(stopped: StopReason | None, detail: str = "", after: AuditResult | None = None,
             lock: LockInfo | None = None, leases: HostLeases | None = None) -> Rollout[S, P, OutT]:
        names = [change.host_of(p) for p in plan]
        return Rollout(fleet, run_id, change.spec.kind, options, before, plan, tuple(results[n] for n in names),
                       {n: verdicts[n] for n in names}, after, stopped, detail, lock, time.monotonic() - t0, leases)

    for p in plan:
        if not change.changes(p):
            host = change.host_of(p)
            if host in blocks:  # an unfinished journal, even where nothing is to do now: it is never passed over
                record(Outcome(host, p, Verdict.LEFT_ALONE, detail=blocks[host]))
            else:
                record(Outcome(host, p, change.unchanged(p), detail=change.reason(p)))
    early = (StopReason.NOTHING_TO_DO if not to_change else StopReason.PREVIEW if settings.dry_run
             else StopReason.DECLINED if confirm is not None and not confirm(plan) else None)
    if early is not None:
        for p in to_change:
            record(Outcome(change.host_of(p), p, Verdict.PLANNED, detail=change.reason(p)))
        return done(early)

    by_name = {h.name: h for h in hosts}
    failures: list[str] = []
    stopped: StopReason | None = None
    stop_detail = ""
    planned = [change.host_of(p) for p in to_change]
    with (
        fleet_lock(settings.state_dir, fleet, planned, ttl_s=settings.lock_ttl_s, change=change.spec.kind) as lock,
        host_leases(
            lease_hosts if lease_hosts is not None else hosts, run_id=run_id, fleet=fleet, planned=planned,
            ttl_s=settings.lock_ttl_s, connect_timeout=audit_options.connect_timeout,
            concurrency=audit_options.concurrency, change=change.spec.kind,
        ) as leases,
    ):
        for p in to_change:
            if change.host_of(p) in leases.unreachable:
                record(Outcome(change.host_of(p), p, Verdict.LEFT_ALONE, where="not leased", detail=UNLEASED))
        leased = [p for p in to_change if change.host_of(p) not in leases.unreachable]
        gates: dict[str, HostAudit] = {}  # host -> its batch's gate audit
        for i in range(0, len(leased), settings.batch):
            batch = leased[i : i + settings.batch]
            names = [change.host_of(p) for p in batch]
            # The leases were taken just before the first batch; every later batch renews them first.
            if stopped is None and i > 0 and (lost := leases.renew()):
                host, why = next(iter(lost.items()))
                stopped = StopReason.LEASE_LOST
                stop_detail = (f"stopped before the batch {', '.join(names)}: the lease on {host} is no longer this"
                               f" run's ({why})")
            if stopped is not None:
                for p in batch:
                    record(Outcome(change.host_of(p), p, Verdict.NOT_STARTED, where=stop_detail,
                                   detail="not touched: the run stopped before this batch"))
                continue
            if hooks.before_batch is not None:
                hooks.before_batch(names)
            applied = _apply_guarded(change, batch, run_id)
            gate, journals = _gate_and_journals(change, [by_name[n] for n in names], audit_options, fleet, inventory)
            gates.update((n, gate.host(n)) for n in names if _has(gate, n))
            batch_out: list[Outcome[P]] = []
            for p in batch:
                host = change.host_of(p)
                journal = journals.get(host)
                mine = journal if journal is not None and journal.run_id == run_id else None
                changed = tuple(c.describe() for c in mine.changes) if mine is not None else ()
                failure = apply_failure(applied, host)
                if failure is not None and host in applied.broken and mine is not None and mine.status in _DONE:
                    failure = None  # its own work finished before the batch stopped (its journal says so): gate it
                if failure is None:
                    verdict, where, detail = change.judge(p, gate.host(host), mine)
                    if verdict is not Verdict.FAILED:
                        batch_out.append(Outcome(host, p, verdict, None, detail, changed))
                        continue
                    failure = (where, detail)
                batch_out.append(Outcome(host, p, Verdict.FAILED, failure[0], failure[1], changed,
                                         mine.undone if mine is not None else ()))
            failed = [o for o in batch_out if o.verdict is Verdict.FAILED]
            undone = {o.host: o for o in _undo_failed(change, failed, by_name, run_id, audit_options)}
            batch_out = [undone.get(o.host, o) for o in batch_out]
            if failed:
                failures.extend(o.host for o in failed)
                first = undone[failed[0].host]
                if applied.interrupted:
                    stopped = StopReason.INTERRUPTED
                    stop_detail = (f"interrupted (Ctrl-C) during the batch {', '.join(names)}: "
                                   + ", ".join(f"{o.host} {'not undone' if o.undo_error else 'undone'}"
                                               for o in undone.values()))
                elif len(failures) >= settings.max_failures:
                    stopped = StopReason.MAX_FAILURES
                    stop_detail = (f"stopped after {len(failures)} failed host(s) (--max-failures "
                                   f"{settings.max_failures}): {first.host} at {first.where}")
            hooks_out = [record(o) for o in batch_out]
            if hooks.after_batch is not None:
                hooks.after_batch(names, hooks_out)
    touched = [h for h in hosts if verdicts.get(h.name) is not Verdict.NOT_STARTED]
    # A host done (or pending) was audited by its batch's gate after its change and nothing of this run touched it
    # since: the final audit reuses that and probes only the other touched hosts (unchanged, left alone, failed and
    # undone after their gate).
    reuse = {h.name: gates[h.name] for h in touched
             if h.name in gates and verdicts.get(h.name) in (Verdict.DONE, Verdict.PENDING)}
    after = _final_audit(touched, reuse, audit_options, fleet, inventory) if touched else None
    return done(stopped, stop_detail, after, lock, leases)


def _has(result: AuditResult, host: str) -> bool:
    return any(h.host == host for h in result.hosts)


def _gate_and_journals(change: Change[P, OutT], batch: Sequence[Host], options: AuditOptions, fleet: str,
                       inventory: str | Path) -> tuple[AuditResult, dict[str, Journal | None]]:
    """The batch's gate audit and its journals, read at the same time (both read-only, the same hosts)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        journals = pool.submit(read_journals, batch, change.spec.journal_path, options)
        gate = run_audit(batch, options, fleet=fleet, inventory=str(inventory))
        return gate, journals.result()


def _final_audit(touched: Sequence[Host], reuse: Mapping[str, HostAudit], options: AuditOptions, fleet: str,
                 inventory: str | Path) -> AuditResult:
    """The audit of ``touched`` at the end of a run: ``reuse``'s gate audits, a fresh probe of the other hosts."""
    rest = [h for h in touched if h.name not in reuse]
    if not reuse:
        return run_audit(rest, options, fleet=fleet, inventory=str(inventory))
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.monotonic()
    fresh = run_audit(rest, options, fleet=fleet, inventory=str(inventory)) if rest else None
    by_host = dict(reuse)
    if fresh is not None:
        started = fresh.started_at
        by_host.update((h.host, h) for h in fresh.hosts)
    return AuditResult(fleet, str(inventory), started, time.monotonic() - t0,
                       tuple(by_host[h.name] for h in touched if h.name in by_host))


_DONE = FINISHED - {"undone"}  # a journal that says the host's own work finished
UNLEASED = ("not changed by this run: unreachable when the run took its leases, so nothing kept another run off it;"
            " run again once it answers")


def host_audit(result: AuditResult | None, host: str) -> HostAudit | None:
    """``host`` in ``result`` (None when there is no result or the host is not in it)."""
    if result is None:
        return None
    try:
        return result.host(host)
    except KeyError:
        return None
