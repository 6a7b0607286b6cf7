"""What one restore changed on one host, and how to undo exactly that (pure).

The role writes the journal on the host *before* each change (write-ahead), at
``/var/lib/gpufleet/driver-restore/journal.json`` (schema ``gpufleet.restore-journal/1``)::

    {"schema": ..., "run_id": ..., "host": ..., "action": ..., "started_at": ...,
     "changes": [{"kind": "packages_installed", "packages": [...]},   # not installed before this run
                 {"kind": "holds_added", "packages": [...]},          # not held before this run
                 {"kind": "grub_default", "path": "/etc/default/grub", "before": <line or null>, "after": <line>},
                 {"kind": "module_built", "packages": [<kernel>], "path": /lib/modules/<kernel>, "after": <version>},
                 {"kind": "module_removed", "packages": [<kernel>], "path": /lib/modules/<kernel>, "before": <version>},
                 {"kind": "kernel_default", "path": <grubenv>, "before": <saved_entry or null>, "after": <entry>},
                 {"kind": "driver_packages", "before": <JSON: NVIDIA package -> version before the extension ran>},
                 {"kind": "azure_extension", "path": <extension resource id>, "before": <config JSON or null>,
                  "after": <config JSON>}],   # --method azure-extension (remediation/azure/restore.py)
     "undone": [...]}

:func:`undo_steps` turns a journal and the host's *current* state into the undo steps, newest change first, and
only for what is still as this run left it: a package is removed only if it is on the host now (installed, or
left half-configured or unpacked by a step that was cut short), a hold released
only if it is held now, GRUB_DEFAULT put back only if the line is still the one this run wrote. What was there
before the run is never in the journal, so it is never touched. The role's ``undo.yml`` runs these steps (through
its ``gpufleet_restore_undo_steps`` filter); the Python flow renders them in the report.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FINISHED", "JOURNAL_PATH", "JOURNAL_SCHEMA", "Change", "Journal", "UndoStep", "journal_from_dict",
           "undo_steps", "unfinished_journal"]

JOURNAL_PATH = "/var/lib/gpufleet/driver-restore/journal.json"
JOURNAL_SCHEMA = "gpufleet.restore-journal/1"
# The states a journal ends in (the roles' "Mark the journal finished" / "Mark the journal undone"): driver restore
# applied | reboot-required, kernel update applied | staged, both undone. Anything else (running: the run was cut
# short or its undo failed) keeps the host from a new change until the journal is undone, so it is never overwritten.
FINISHED = frozenset({"applied", "reboot-required", "staged", "undone"})
KINDS = ("packages_installed", "holds_added", "holds_released", "grub_default", "module_built", "module_removed",
         "kernel_default", "azure_extension", "driver_packages")


@dataclass(frozen=True)
class Change:
    kind: str
    packages: tuple[str, ...] = ()
    path: str | None = None
    before: str | None = None
    after: str | None = None

    def describe(self) -> str:
        if self.kind == "packages_installed":
            return "installed " + ", ".join(self.packages)
        if self.kind == "holds_added":
            return "held " + ", ".join(self.packages)
        if self.kind == "module_built":
            return f"built NVIDIA module {self.after} for {', '.join(self.packages)} (under {self.path})"
        if self.kind == "module_removed":
            return f"removed the DKMS build nvidia/{self.before} of {', '.join(self.packages)}"
        if self.kind == "holds_released":
            return "released holds on " + ", ".join(self.packages)
        if self.kind == "kernel_default":
            return f"default boot entry {self.before or '(none)'} -> {self.after}"
        if self.kind == "azure_extension":  # written by remediation.azure.restore; undone there, not by the role
            from remediation.azure.extension import status_messages, summary

            name = (self.path or "").rsplit("/", 1)[-1]
            return (f"VM extension {name} re-added ({summary(self.after)}; before: {summary(self.before)})"
                    + status_messages(self.after))
        if self.kind == "driver_packages":  # written by remediation.azure.restore: what its undo brings back
            from remediation.azure.extension import packages_summary

            return f"recorded the NVIDIA packages before the extension ran ({packages_summary(self.before)})"
        return f"{self.path}: {self.before or '(no GRUB_DEFAULT line)'} -> {self.after}"


@dataclass(frozen=True)
class Journal:
    run_id: str
    host: str
    action: str
    started_at: str
    changes: tuple[Change, ...]
    undone: tuple[str, ...] = ()
    status: str = "running"

    @property
    def changed_anything(self) -> bool:
        return any(c.packages or c.kind == "grub_default" for c in self.changes)


@dataclass(frozen=True)
class UndoStep:
    # remove_packages | unhold | hold | grub_restore | grub_remove | dkms_remove | dkms_install | default_restore
    kind: str
    packages: tuple[str, ...] = ()
    path: str | None = None
    line: str | None = None  # grub_restore: the line to put back
    after: str | None = None  # grub_*: the line this run wrote (what is replaced)

    def describe(self) -> str:
        if self.kind == "remove_packages":
            return "remove " + ", ".join(self.packages)
        if self.kind == "unhold":
            return "release hold on " + ", ".join(self.packages)
        if self.kind == "dkms_remove":
            return f"remove the NVIDIA module {self.line} built for {', '.join(self.packages)}"
        if self.kind == "dkms_install":
            return f"rebuild the DKMS module nvidia/{self.line} for {', '.join(self.packages)}"
        if self.kind == "hold":
            return "hold again " + ", ".join(self.packages)
        if self.kind == "default_restore":
            return f"{self.path}: default boot entry back to {self.line or 'the first entry'}"
        if self.kind == "grub_restore":
            return f"{self.path}: put back {self.line}"
        return f"{self.path}: remove {self.after}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "packages": list(self.packages), "path": self.path, "line": self.line,
                "after": self.after, "describe": self.describe()}


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"restore journal: {where} must be a list of strings, got {value!r}")
    return tuple(value)


def journal_from_dict(d: Mapping[str, Any]) -> Journal:
    """Parse the on-host journal; ``ValueError`` naming the field for anything else."""
    if not isinstance(d, Mapping) or d.get("schema") != JOURNAL_SCHEMA:
        raise ValueError(f"not a restore journal (schema {d.get('schema') if isinstance(d, Mapping) else d!r})")
    changes = []
    for i, c in enumerate(d.get("changes") or []):
        if not isinstance(c, Mapping) or c.get("kind") not in KINDS:
            raise ValueError(f"restore journal: changes[{i}] has no known kind: {c!r}")
        changes.append(
            Change(
                kind=str(c["kind"]),
                packages=_strings(c.get("packages"), f"changes[{i}].packages"),
                path=c.get("path"),
                before=c.get("before"),
                after=c.get("after"),
            )
        )
    return Journal(
        run_id=str(d.get("run_id", "")),
        host=str(d.get("host", "")),
        action=str(d.get("action", "")),
        started_at=str(d.get("started_at", "")),
        changes=tuple(changes),
        undone=_strings(d.get("undone"), "undone"),
        status=str(d.get("status", "running")),
    )


def undo_steps(
    journal: Journal,
    installed: Iterable[str],
    held: Iterable[str],
    grub_lines: Mapping[str, str | None],
    present_paths: Iterable[str] = (),
) -> list[UndoStep]:
    """The steps that undo ``journal`` given the current state (see the module docstring).

    ``grub_lines`` maps a file path to its current GRUB_DEFAULT line (None: no such line or no file);
    ``present_paths`` are the module files of ``module_built`` changes that exist now.
    """
    installed_now, held_now, present = set(installed), set(held), set(present_paths)
    steps: list[UndoStep] = []
    for change in reversed(journal.changes):
        if change.kind == "grub_default" and change.path:
            current = grub_lines.get(change.path)
            if current is None or current != change.after:
                continue  # not ours any more (or never written): leave it
            if change.before is None:
                steps.append(UndoStep("grub_remove", path=change.path, after=change.after))
            else:
                steps.append(UndoStep("grub_restore", path=change.path, line=change.before, after=change.after))
        elif change.kind == "module_built":
            if change.path in present:
                steps.append(UndoStep("dkms_remove", change.packages, path=change.path, line=change.after))
        elif change.kind == "module_removed":
            if f"{change.path}/updates/dkms" not in present and change.before:
                steps.append(UndoStep("dkms_install", change.packages, path=change.path, line=change.before))
        elif change.kind == "holds_released":
            names = tuple(p for p in change.packages if p not in held_now and p in installed_now)
            if names:
                steps.append(UndoStep("hold", names))
        elif change.kind == "kernel_default" and change.path:
            current = grub_lines.get(change.path)
            if current == change.after:
                steps.append(UndoStep("default_restore", path=change.path, line=change.before, after=change.after))
        elif change.kind == "holds_added":
            names = tuple(p for p in change.packages if p in held_now)
            if names:
                steps.append(UndoStep("unhold", names))
        elif change.kind == "packages_installed":
            names = tuple(p for p in change.packages if p in installed_now)
            if names:
                steps.append(UndoStep("remove_packages", names))
    return steps


def undo_steps_from_dicts(
    journal: Mapping[str, Any],
    installed: Sequence[str],
    held: Sequence[str],
    grub_lines: Mapping[str, str | None],
    present_paths: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """:func:`undo_steps` over plain data, for the role's filter."""
    return [s.to_dict() for s in undo_steps(journal_from_dict(journal), installed, held, grub_lines, present_paths)]


def unfinished_journal(text: str, *, path: str, host: str, inventory: str, playbook: str, operation_var: str,
                       run_id_var: str) -> str | None:
    """Why the journal ``text`` read from ``host`` blocks a new change there (one line naming the journal and the
    undo command), or None when there is none or it is finished (:data:`FINISHED`)."""
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return (f"the journal {path} on {host} is unreadable: a run may have left changes there; read it, undo by "
                "hand what it lists, move it aside, then run again")
    status = str(doc.get("status", "running"))
    if status in FINISHED:
        return None
    run_id, status = str(doc.get("run_id") or "?")[:100], status[:40]
    undo = (f"ansible-playbook -i {shlex.quote(inventory)} {playbook} --limit {shlex.quote(host)} "
            f"-e {operation_var}=undo -e {run_id_var}={shlex.quote(run_id)}")
    return (f"the journal {path} of run {run_id!r} is still {status!r} (that run did not finish, or its undo "
            f"failed); nothing was changed: undo it with `{undo}`, then run again")
