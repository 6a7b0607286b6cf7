"""``invoke driver-restore --method azure-extension``: plan, apply and undo through the driver VM extension.

:class:`~remediation.restore.methods.AzureExtensionMethod` delegates here. The restore flow around it is the apt
method's: the same audit and rules (:func:`~remediation.restore.rules.decide`) decide whether a host needs a driver
restore, the same guards leave hosts alone (cordoned, GPU processes without ``--force``, a dpkg lock, and for this
method no ``--allow-reboot``: the extension reboots the VM), the same batches and ``--max-failures``.

Planning also checks the extension's documented limits against the host's facts (:mod:`.limits`): a Secure Boot
host, a release the extension does not support for the VM's driver type, an AMD size: the host is left alone with
one line naming the reason and the apt method's signed-module path, before anything changes anywhere.

Per host, :func:`apply` reads the host's NVIDIA packages, writes the restore journal on the host *before* anything
changes (write-ahead: kind ``driver_packages``, the packages and versions before; kind ``azure_extension``, the
extension's config before and after), then :func:`~.extension.reinstall`; the journal ends ``applied`` with the
extension's status messages and the driver version they name. The gate
(:meth:`~remediation.restore.methods.AzureExtensionMethod.verify`) accepts the driver the extension installed (it
installs the latest supported one unless told otherwise): NVML answers with the version the extension reported.

:func:`undo` never runs the extension again (putting the old settings back would make it install the latest driver
again, not the previous one): it brings the previous NVIDIA packages back with apt when the extension changed them,
and says plainly what the host and the extension resource are left as.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from remediation.azure.client import ArmClient
from remediation.azure.errors import AzureApiError
from remediation.azure.extension import (
    EXTENSION_TYPE,
    PUBLISHER,
    ExtensionConfig,
    VmRef,
    extension_config,
    extension_state,
    journal_change,
    packages_change,
    reinstall,
    vm_ref,
)
from remediation.azure.limits import refusal, reported_driver_version
from remediation.azure.session import cli_session
from remediation.azure.settings import AzureSettings
from remediation.host.audit import HostAudit
from remediation.restore.rules import Decision, Prefer, decide
from remediation.rollout.journal import JOURNAL_PATH, JOURNAL_SCHEMA
from remediation.transport.fanout import Status, fan_out
from remediation.transport.inventory import Host, load
from remediation.transport.runner import HostOutcome, HostState, PlaybookResult, TaskChange

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
    assert audit.facts is not None  # a changing decision was made from facts
    why = refusal(audit.facts, audit.vars)
    if why is not None:
        return replace(decision, blocked=f"--method azure-extension refused: {why}")
    from remediation.restore.errors import RestoreError

    try:
        vm = vm_ref(audit.host, audit.vars)
        config = extension_config(audit.host, audit.vars)
    except AzureApiError as exc:
        raise RestoreError(str(exc)) from None
    return replace(
        decision,
        reason=f"{decision.reason.split(': ', 1)[0]}: the {EXTENSION_TYPE} VM extension reinstalls the driver",
        install_packages=(),
        hold_packages=(),
        needs_reboot=True,
        expected_version=None,  # the extension installs the latest supported driver: the gate takes its word
        steps=(
            "record the host's NVIDIA packages in the journal (what an undo brings back)",
            f"VM {vm.describe()}: remove the {EXTENSION_TYPE} extension ({PUBLISHER}) it has",
            f"re-add it: typeHandlerVersion {config.type_handler_version},"
            f" settings {json.dumps(dict(config.settings), sort_keys=True)}",
            "wait for provisioning (the extension installs the latest supported driver for the running kernel"
            " and reboots the VM)",
            "gate: NVML answers with the driver version the extension reports",
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


#: The host's NVIDIA packages: what the extension may change, and what an undo brings back.
PACKAGES_CMD = "dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n' 'nvidia-*' 'libnvidia-*'"
_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,120}$")
_VERSION = re.compile(r"^[A-Za-z0-9.+~:-]{1,120}$")


def parse_packages(text: str) -> dict[str, str]:
    """``dpkg-query`` lines -> installed package -> version (only ``ii``; names and versions as Debian allows them:
    what comes from the host is untrusted and later reaches a command line, quoted)."""
    out: dict[str, str] = {}
    for line in text.splitlines()[:2000]:
        parts = line.split("\t")
        if len(parts) < 3 or not parts[2].startswith("ii"):
            continue
        name, version = parts[0].strip(), parts[1].strip()
        if _PACKAGE_NAME.match(name) and _VERSION.match(version):
            out[name] = version
    return out


def _read_packages(host: Host) -> tuple[dict[str, str] | None, str]:
    """(package -> version, "") from the host, or (None, why it could not be read)."""
    run = fan_out([host], PACKAGES_CMD + " 2>/dev/null; true", concurrency=1, timeout=60).runs[host.name]
    if run.status is not Status.OK or run.exit_code != 0:
        return None, f"{run.status.value}: {(run.stderr or run.error or '').strip()[:200]}"
    return parse_packages(run.stdout), ""


def _driver(packages: Mapping[str, str]) -> str:
    """``nvidia-driver-535 535.183.01-0ubuntu1`` (the driver metapackages), or ``no NVIDIA driver package``."""
    names = sorted(n for n in packages if n.startswith("nvidia-driver-"))
    return ", ".join(f"{n} {packages[n]}" for n in names) or "no NVIDIA driver package"


def _recorded(before: Any) -> dict[str, str]:
    """The journal's package -> version record, as :func:`parse_packages` admits them (the journal is read back from
    the host: a name that is not a Debian package name never reaches apt, where it could pass as an option)."""
    if not isinstance(before, Mapping):
        raise ValueError(f"the journal's driver_packages record is not a mapping: {str(before)[:80]!r}")
    return {str(n): str(v) for n, v in before.items() if _PACKAGE_NAME.match(str(n)) and _VERSION.match(str(v))}


def _bring_back(host: Host, before: Mapping[str, str], settings: Mapping[str, Any]) -> tuple[bool, str]:
    """Put the host's NVIDIA packages back as ``before`` (apt, downgrades allowed): (ok, what the host is now)."""
    now, why = _read_packages(host)
    if now is None:
        return False, f"could not read the host's NVIDIA packages ({why}): its driver state is unknown"
    changed = {n: v for n, v in before.items() if now.get(n) != v}
    added = sorted(n for n in now if n not in before)
    if not changed and not added:
        return True, f"NVIDIA packages as before this run ({_driver(now)}): nothing to bring back"
    lock = int(settings.get("nvidia_driver_restore_lock_timeout", 60))
    words = ["apt-get", "install", "-y", "-q", "--allow-downgrades", "-o", f"DPkg::Lock::Timeout={lock}",
             "-o", "Dpkg::Options::=--force-confold", *(f"{n}={v}" for n, v in sorted(changed.items())),
             *(f"{n}-" for n in added)]
    cmd = "DEBIAN_FRONTEND=noninteractive " + shlex.join(words)
    run = fan_out([host], cmd, concurrency=1, timeout=900).runs[host.name]
    if run.status is not Status.OK or run.exit_code != 0:
        lines = (run.stderr or run.stdout or run.error or "").strip().splitlines()
        last = lines[-1][:200] if lines else "failed"
        return False, (f"could not bring the previous NVIDIA packages back (apt: {last}); the host keeps what the"
                       f" extension installed: {_driver(now)}")
    after, _ = _read_packages(host)
    was = _driver(now)
    return True, (f"brought the previous NVIDIA packages back with apt ({was} -> {_driver(after or before)}"
                  + (f"; removed {', '.join(added)}, added by the extension" if added else "")
                  + "): the running kernel module stays the extension's until the host reboots")


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
        before_packages, why = _read_packages(host)
        if before_packages is None:
            outcomes[d.host] = HostOutcome(d.host, HostState.FAILED, (), (
                f"{EXTENSION_TYPE}: could not read the host's NVIDIA packages ({why}): nothing changed",))
            continue
        journal: dict[str, Any] = {
            "schema": JOURNAL_SCHEMA, "run_id": run_id, "host": d.host, "action": d.action.value,
            "started_at": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "changes": [], "undone": [], "status": "running", "method": "azure-extension",
        }

        def write_ahead(ext_id: str, before: Mapping[str, Any] | None, after: Mapping[str, Any],
                        _host: Host = host, _journal: dict[str, Any] = journal,
                        _packages: Mapping[str, str] = before_packages) -> None:
            _journal["changes"] = [packages_change(_packages), journal_change(ext_id, before, after)]
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
        reported = reported_driver_version(result.messages)
        if journal["changes"]:
            ext = journal["changes"][-1]
            after = json.loads(ext["after"])
            after["statusMessages"] = list(result.messages)
            after["reportedDriverVersion"] = reported
            ext["after"] = json.dumps(after, sort_keys=True)
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


def _extension_left(arm: ArmClient, change: Mapping[str, Any]) -> str:
    """What the extension resource is left as (the undo never writes it: see the module docstring)."""
    path = str(change.get("path") or "")
    name = path.rsplit("/", 1)[-1] or EXTENSION_TYPE
    try:
        now = extension_state(arm, path)
    except AzureApiError as exc:
        return f"the {name} extension resource could not be read ({exc}); it was not changed by the undo"
    if now is None:
        return f"the {name} extension resource is not on the VM (the undo did not change it)"
    before = json.loads(change["before"]) if change.get("before") else None
    was = f"typeHandlerVersion {before.get('typeHandlerVersion', '?')}" if before else "none"
    return (f"the {name} extension resource stays as this run left it (typeHandlerVersion {now.type_handler_version}"
            f", provisioning {now.provisioning_state or 'unknown'}; before the run: {was}): putting the old settings "
            "back would make the extension install the latest driver again, not the previous one")


def undo(
    hosts: Sequence[str],
    inventory: str | Path,
    settings: Mapping[str, Any],
    *,
    azure: AzureSettings | None = None,
    client: ArmClient | None = None,
) -> PlaybookResult:
    """Bring back each host's NVIDIA packages as this run's journal recorded them; say what the host and the
    extension resource are left as; the journal marked ``undone`` when the host's driver is as before."""
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
        failures: list[str] = []
        try:
            for change in journal.get("changes") or []:  # the host's driver first, then the resource's state
                if change.get("kind") == "azure_extension":
                    arm = arm or _client(azure)
                    done.append(_extension_left(arm, change))
                elif change.get("kind") == "driver_packages":
                    before = json.loads(change["before"]) if change.get("before") else {}
                    ok, what = _bring_back(host, _recorded(before), settings)
                    (done if ok else failures).append(what)
        except (AzureApiError, ValueError, KeyError, TypeError) as exc:
            failures.append(f"undo {EXTENSION_TYPE}: {exc}")
        journal["undone"] = done + failures
        if not failures:
            journal["status"] = "undone"
        why = _write_journal(host, journal)
        if why is not None:
            failures.append(f"journal: {why}")
        state = HostState.FAILED if failures else HostState.CHANGED
        outcomes[name] = HostOutcome(name, state, tuple(TaskChange(s, True) for s in done), tuple(failures))
    failed = any(o.state in (HostState.FAILED, HostState.UNREACHABLE) for o in outcomes.values())
    return PlaybookResult(run_id, 2 if failed else 0, "failed" if failed else "successful", outcomes)
