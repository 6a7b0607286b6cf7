"""``invoke driver-restore --method azure-extension``: plan, apply and undo through the driver VM extension.

:class:`~remediation.restore.methods.AzureExtensionMethod` delegates here. The restore flow around it is the apt
method's: the same audit and rules (:func:`~remediation.restore.rules.decide`) decide whether a host needs a driver
restore, the same guards leave hosts alone (cordoned, GPU processes without ``--force``, a dpkg lock, and for this
method no ``--allow-reboot``: the extension reboots the VM), the same batches, NVML gate and ``--max-failures``.

Per host, :func:`apply` writes the restore journal on the host *before* anything changes (write-ahead, kind
``azure_extension``: the extension's config before and after), then :func:`~.extension.reinstall`; the journal ends
``applied`` with the extension's status messages. :func:`undo` puts the extension back as the journal says it was
(or removes it when there was none) and marks the journal ``undone``.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from remediation.audit import HostAudit
from remediation.fanout import Status, fan_out
from remediation.inventory import Host, load
from remediation.restore.journal import JOURNAL_PATH, JOURNAL_SCHEMA
from remediation.restore.rules import Decision, Prefer, decide
from remediation.runner import HostOutcome, HostState, PlaybookResult, TaskChange

from .client import ArmClient
from .errors import AzureApiError
from .extension import (
    EXTENSION_TYPE,
    PUBLISHER,
    ExtensionConfig,
    VmRef,
    extension_config,
    journal_change,
    put_back,
    reinstall,
    vm_ref,
)
from .session import cli_session
from .settings import AzureSettings

__all__ = ["REBOOT_GUARD", "apply", "guard", "plan_host", "undo"]

REBOOT_GUARD = (
    f"the {EXTENSION_TYPE} extension reboots the VM while it installs the driver: pass --allow-reboot to use"
    " --method azure-extension"
)


def plan_host(audit: HostAudit, *, force: bool, cordon_marker: str | None) -> Decision:
    """The apt method's decision, carried out by the extension: VM mapping and extension config checked here."""
    not_probed = None if audit.probed else f"{audit.status.value}: {audit.error or 'not probed'}"
    decision = decide(audit.host, audit.facts, audit.findings, audit.vars, prefer=Prefer.REBUILD, force=force,
                      cordon_marker=cordon_marker, not_probed=not_probed)
    if not decision.changes_host:
        return decision
    from remediation.restore.errors import RestoreError

    try:
        vm = vm_ref(audit.host, audit.vars)
        config = extension_config(audit.host, audit.vars)
    except AzureApiError as exc:
        raise RestoreError(str(exc)) from None
    expected = decision.expected_version or "the installed driver"
    return replace(
        decision,
        reason=f"{decision.reason.split(': ', 1)[0]}: the {EXTENSION_TYPE} VM extension reinstalls the driver",
        install_packages=(),
        hold_packages=(),
        needs_reboot=True,
        steps=(
            f"VM {vm.describe()}: remove the {EXTENSION_TYPE} extension ({PUBLISHER}) it has",
            f"re-add it: typeHandlerVersion {config.type_handler_version},"
            f" settings {json.dumps(dict(config.settings), sort_keys=True)}",
            "wait for provisioning (the extension installs the driver for the running kernel and reboots the VM)",
            f"gate: NVML answers with {expected}",
        ),
    )


def guard(decision: Decision, *, allow_reboot: bool) -> Decision:
    """Leave a host alone when the extension's reboot is not allowed."""
    if decision.changes_host and not allow_reboot:
        return replace(decision, blocked=REBOOT_GUARD)
    return decision


def _hosts(inventory: str | Path, names: Sequence[str]) -> dict[str, Host]:
    return {h.name: h for h in load(inventory, "all", list(names))}


def _write_journal(host: Host, journal: Mapping[str, Any]) -> str | None:
    """Write the journal on the host (temp file, fsynced, renamed, directory fsynced); None when written, else why."""
    text = json.dumps(dict(journal), indent=2, sort_keys=True) + "\n"
    directory = JOURNAL_PATH.rsplit("/", 1)[0]
    cmd = (f"mkdir -p {directory} && cat > {JOURNAL_PATH}.tmp && sync {JOURNAL_PATH}.tmp"
           f" && mv {JOURNAL_PATH}.tmp {JOURNAL_PATH} && sync {directory}")
    run = fan_out([host], cmd, stdin=text.encode(), concurrency=1, timeout=30).runs[host.name]
    if run.status is Status.OK and run.exit_code == 0:
        return None
    return f"{run.status.value}: {(run.stderr or run.error or '').strip()[:200]}"


def _read_journal(host: Host) -> dict[str, Any] | None:
    run = fan_out([host], f"cat {JOURNAL_PATH} 2>/dev/null || true", concurrency=1, timeout=30).runs[host.name]
    if run.status is not Status.OK or not run.stdout.strip():
        return None
    try:
        data = json.loads(run.stdout)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _client(settings: AzureSettings | None) -> ArmClient:
    return ArmClient(cli_session(), settings)


def _timeout(settings: Mapping[str, Any]) -> float:
    """How long one extension operation may take: the reboot timeout plus the driver install."""
    return float(settings.get("nvidia_driver_restore_reboot_timeout", 600)) + 1200.0


def apply(
    decisions: Sequence[Decision],
    inventory: str | Path,
    settings: Mapping[str, Any],
    *,
    azure: AzureSettings | None = None,
    client: ArmClient | None = None,
) -> PlaybookResult:
    """Re-add the extension on every host of the batch; every host is in the result."""
    run_id = str(settings.get("nvidia_driver_restore_run_id") or "")
    hosts = _hosts(inventory, [d.host for d in decisions])
    outcomes: dict[str, HostOutcome] = {}
    arm = client
    for d in decisions:
        host = hosts[d.host]
        try:
            vm: VmRef = vm_ref(d.host, host.vars)
            config: ExtensionConfig = extension_config(d.host, host.vars)
            arm = arm or _client(azure)
        except AzureApiError as exc:
            outcomes[d.host] = HostOutcome(d.host, HostState.FAILED, (), (f"{EXTENSION_TYPE}: {exc}",))
            continue
        journal: dict[str, Any] = {
            "schema": JOURNAL_SCHEMA, "run_id": run_id, "host": d.host, "action": d.action.value,
            "started_at": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "changes": [], "undone": [], "status": "running", "method": "azure-extension",
        }

        def write_ahead(ext_id: str, before: Mapping[str, Any] | None, after: Mapping[str, Any],
                        _host: Host = host, _journal: dict[str, Any] = journal) -> None:
            _journal["changes"] = [journal_change(ext_id, before, after)]
            why = _write_journal(_host, _journal)
            if why is not None:
                raise AzureApiError(f"could not write the restore journal on the host ({why}): nothing changed")

        try:
            result = reinstall(arm, vm, config, journal=write_ahead, timeout_s=_timeout(settings))
        except AzureApiError as exc:
            outcomes[d.host] = HostOutcome(d.host, HostState.FAILED, (), (f"{EXTENSION_TYPE}: {exc}",))
            if journal["changes"]:
                journal["status"] = "failed"
                _write_journal(host, journal)
            continue
        if journal["changes"]:
            after = json.loads(journal["changes"][0]["after"])
            after["statusMessages"] = list(result.messages)
            journal["changes"][0]["after"] = json.dumps(after, sort_keys=True)
            journal["status"] = "applied" if result.ok else "failed"
            _write_journal(host, journal)
        changes = tuple(TaskChange(step, True, msg="; ".join(result.messages) or None) for step in result.steps)
        if result.ok:
            outcomes[d.host] = HostOutcome(d.host, HostState.CHANGED, changes, ())
        else:
            detail = result.error or "failed"
            if result.messages and not any(m in detail for m in result.messages):
                detail += " | " + "; ".join(result.messages)
            outcomes[d.host] = HostOutcome(d.host, HostState.FAILED, changes, (f"{EXTENSION_TYPE}: {detail}",))
    failed = any(o.state is HostState.FAILED for o in outcomes.values())
    return PlaybookResult(run_id, 2 if failed else 0, "failed" if failed else "successful", outcomes)


def undo(
    hosts: Sequence[str],
    inventory: str | Path,
    settings: Mapping[str, Any],
    *,
    azure: AzureSettings | None = None,
    client: ArmClient | None = None,
) -> PlaybookResult:
    """Put each host's extension back as this run's journal recorded it; the journal marked ``undone``."""
    run_id = str(settings.get("nvidia_driver_restore_run_id") or "")
    by_name = _hosts(inventory, hosts)
    outcomes: dict[str, HostOutcome] = {}
    arm = client
    for name in hosts:
        host = by_name[name]
        journal = _read_journal(host)
        if journal is None:
            outcomes[name] = HostOutcome(name, HostState.UNREACHABLE, (), ("could not read the restore journal",))
            continue
        if str(journal.get("run_id")) != run_id or journal.get("status") == "undone":
            outcomes[name] = HostOutcome(name, HostState.OK, (), ())
            continue
        done: list[str] = []
        try:
            arm = arm or _client(azure)
            for change in reversed(journal.get("changes") or []):
                if change.get("kind") != "azure_extension":
                    continue
                before = json.loads(change["before"]) if change.get("before") else None
                done.append(put_back(arm, str(change["path"]), before, timeout_s=_timeout(settings)))
        except (AzureApiError, ValueError, KeyError) as exc:
            outcomes[name] = HostOutcome(name, HostState.FAILED, (), (f"undo {EXTENSION_TYPE}: {exc}",))
            continue
        journal["status"] = "undone"
        journal["undone"] = done
        why = _write_journal(host, journal)
        state = HostState.CHANGED if why is None else HostState.FAILED
        outcomes[name] = HostOutcome(name, state, tuple(TaskChange(s, True) for s in done),
                                     () if why is None else (f"journal: {why}",))
    failed = any(o.state in (HostState.FAILED, HostState.UNREACHABLE) for o in outcomes.values())
    return PlaybookResult(run_id, 2 if failed else 0, "failed" if failed else "successful", outcomes)
