"""``invoke harden``: keep unattended-upgrades from breaking GPU hosts, as a converge flow.

audit (the probe) -> plan (which hosts need which role; compliant hosts cost no Ansible run) ->
``--check`` shows the per-host diff and stops -> confirm unless ``--yes`` -> apply ``playbooks/harden.yml``
through ansible-runner, limited to the hosts that need it -> re-audit (each batch's hosts as soon as the next batch
starts, while it runs; the rest at the end) -> not converged means non-zero exit.
Hosts that cannot be changed safely (unreachable, dpkg lock held) are reported and left alone; the others go on.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remediation.core.exitcodes import ExitCode
from remediation.host.audit import AuditOptions, AuditResult, HostAudit, run_audit
from remediation.rollout.engine import StopReason
from remediation.transport.inventory import Host
from remediation.transport.runner import PlaybookResult, run_playbook

PLAYBOOK = "gpufleet.remediation.harden"
# finding -> the role that remediates it
REMEDIES = {
    "GPU-KRN-002": "gpu_kernel_hold",
    "GPU-KRN-003": "unattended_upgrades_blacklist",
    "GPU-KRN-004": "unattended_upgrades_blacklist",
}
BLOCKERS = {"GPU-APT-001": "dpkg lock held"}


@dataclass(frozen=True)
class HostPlan:
    host: str
    findings: tuple[str, ...]  # the finding IDs harden remediates on this host
    roles: tuple[str, ...]
    blocked: str | None = None  # why the host is left alone

    @property
    def needs_change(self) -> bool:
        return bool(self.roles) and self.blocked is None


@dataclass(frozen=True)
class HardenPlan:
    hosts: tuple[HostPlan, ...]

    @property
    def to_change(self) -> list[str]:
        return [h.host for h in self.hosts if h.needs_change]

    @property
    def compliant(self) -> list[str]:
        return [h.host for h in self.hosts if not h.roles and h.blocked is None]

    @property
    def blocked(self) -> list[HostPlan]:
        return [h for h in self.hosts if h.blocked is not None]


@dataclass(frozen=True)
class HardenResult:
    before: AuditResult
    plan: HardenPlan
    applied: PlaybookResult | None
    after: AuditResult | None
    stopped: StopReason | None  # preview | declined | nothing to do | None (applied)

    @property
    def not_converged(self) -> list[str]:
        """Hosts that still have a finding harden remediates, or that could not be hardened (blocked)."""
        final = plan(self.after) if self.after is not None else self.plan
        return sorted(h.host for h in final.hosts if h.roles or h.blocked)

    @property
    def exit_code(self) -> ExitCode:
        """OK converged (or only previewed/declined); FINDINGS a host is not hardened after the run."""
        if self.stopped in (StopReason.PREVIEW, StopReason.DECLINED):
            return ExitCode.OK
        return ExitCode.FINDINGS if self.not_converged else ExitCode.OK


def plan(audit: AuditResult) -> HardenPlan:
    hosts = []
    for h in audit.hosts:
        if not h.probed:
            hosts.append(HostPlan(h.host, (), (), blocked=f"{h.status.value}: {h.error or 'not probed'}"))
            continue
        ids = tuple(sorted({f.id for f in h.findings if f.id in REMEDIES}))
        roles = tuple(sorted({REMEDIES[i] for i in ids}))
        blocker = next(
            (BLOCKERS[f.id] + ": " + "; ".join(f.evidence[:1]) for f in h.findings if f.id in BLOCKERS), None
        )
        hosts.append(HostPlan(h.host, ids, roles, blocked=blocker if roles else None))
    return HardenPlan(tuple(hosts))


def audit_answers(audit: AuditResult) -> dict[str, dict[str, Any]]:
    """What the audit has just read on each host that the playbook would otherwise ask the host again, as its extra
    vars (data: ansible-runner hands them to the playbook as JSON): ``harden_booted_kernels`` (host -> ``uname -r``:
    no fact gathering). A host whose facts lack the answer (not probed) is left out: the playbook asks it. (Holds are
    not passed: gpu_kernel_hold's ``dpkg_hold`` module reads dpkg's database in the same run that sets them.)"""
    kernels = {h.host: h.facts.system.kernel for h in audit.hosts if h.facts is not None and h.facts.system.kernel}
    return {"harden_booted_kernels": kernels}


def harden(
    hosts: Sequence[Host],
    inventory: str | Path,
    options: AuditOptions,
    *,
    check: bool = False,
    diff: bool = True,
    batch: str | int = "25%",
    max_fail_percentage: int = 10,
    confirm: Callable[[HardenPlan, PlaybookResult | None], bool] | None = None,
    show_plan: Callable[[HardenPlan, PlaybookResult | None], None] | None = None,
) -> HardenResult:
    before = run_audit(hosts, options, inventory=str(inventory))
    the_plan = plan(before)
    if not the_plan.to_change:
        return HardenResult(before, the_plan, None, None, StopReason.NOTHING_TO_DO)
    extravars = {
        "harden_batch": batch,
        "harden_max_fail_percentage": max_fail_percentage,
        "harden_gather_facts": False,
        **audit_answers(before),
    }
    preview = None
    if check or confirm is not None:
        preview = run_playbook(
            PLAYBOOK, inventory, limit=the_plan.to_change, check=True, diff=True, extravars=extravars
        )
    if show_plan is not None:
        show_plan(the_plan, preview)
    if check:
        return HardenResult(before, the_plan, preview, None, StopReason.PREVIEW)
    if confirm is not None and not confirm(the_plan, preview):
        return HardenResult(before, the_plan, preview, None, StopReason.DECLINED)
    with _BatchAudits(hosts, options, inventory) as audits:
        applied = run_playbook(PLAYBOOK, inventory, limit=the_plan.to_change, diff=diff, extravars=extravars,
                               on_event=audits.on_event)
        after = audits.result()
    return HardenResult(before, the_plan, applied, after, None)


class _BatchAudits:
    """The re-audit of a harden run, done while the playbook still runs: when a ``serial`` batch starts, the hosts of
    the batch before it are finished (Ansible runs batches one after the other) and are audited in the background
    while this batch runs; :meth:`result` audits the rest (the last batch, hosts the play did not touch) and gives one
    :class:`AuditResult` of every host, in the order of ``hosts``."""

    def __init__(self, hosts: Sequence[Host], options: AuditOptions, inventory: str | Path) -> None:
        self.hosts = list(hosts)
        self.by_name = {h.name: h for h in hosts}
        self.options = options
        self.inventory = str(inventory)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harden-audit")
        self.pending: list[Future[AuditResult]] = []
        self.batch: list[str] = []  # hosts of the running batch
        self.sent: set[str] = set()

    def __enter__(self) -> _BatchAudits:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def on_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event", "")
        if kind == "playbook_on_play_start":
            self._send()
            return
        host = (event.get("event_data") or {}).get("host")
        if kind.startswith("runner_on_") and host in self.by_name and host not in self.sent and host not in self.batch:
            self.batch.append(host)

    def _send(self) -> None:
        if self.batch:
            batch = [self.by_name[n] for n in self.batch]
            self.sent.update(self.batch)
            self.batch = []
            self.pending.append(self.pool.submit(run_audit, batch, self.options, inventory=self.inventory))

    def result(self) -> AuditResult:
        started = _dt.datetime.now(_dt.UTC)
        t0 = time.monotonic()
        rest = [h for h in self.hosts if h.name not in self.sent]
        last = run_audit(rest, self.options, inventory=self.inventory) if rest else None
        by_host: dict[str, HostAudit] = {}
        for part in [*(f.result() for f in self.pending), *([last] if last is not None else [])]:
            started = min(started, part.started_at)
            by_host.update((h.host, h) for h in part.hosts)
        return AuditResult(last.fleet if last is not None else "gpu", self.inventory, started,
                           time.monotonic() - t0, tuple(by_host[h.name] for h in self.hosts if h.name in by_host))
