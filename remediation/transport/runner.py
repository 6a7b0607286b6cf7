"""The one wrapper around ansible-runner: every playbook this project runs goes through ``run_playbook``.

Habits from AWX and ansible-navigator: a private data dir from ``mkdtemp`` (0700), always a job timeout and
an idle timeout, ``ident`` = the run id, ``quiet=True``, an allowlist of environment variables passed to
Ansible, ``--check``/``--diff``/``--limit``/``--tags`` through the runner's own arguments. Events are turned
into per-host outcomes as they arrive (cheap handler); ``stats['dark']`` (unreachable) is reported apart
from failed.

The environment Ansible sees is exactly: the names in ``ENV_ALLOWLIST``, every ``ANSIBLE_*`` variable (vault
password files and identity lists, callbacks, SSH settings: what an Ansible user sets), and the values this
wrapper forces (``FORCED_ENV``). ansible-runner itself starts from a copy of the whole process environment,
so the wrapper filters the runner's prepared environment before the run: a cloud secret or a passphrase file
name in the controller's environment never reaches a playbook. Host key checking is forced on: ansible-runner
turns it off unless told otherwise, which would let Ansible trust (and record) any key a host shows. Kept
artifacts never carry environment values (``command`` keeps the names only).

Playbooks run by name from the collection ``gpufleet.remediation`` (``run_playbook("driver_restore", ...)`` runs
``ansible-playbook gpufleet.remediation.driver_restore``), never from a path computed from a checkout: from an
install, Ansible finds the collection on the user's collections path (``ANSIBLE_COLLECTIONS_PATH``, else
``~/.ansible/collections`` and ``/usr/share/ansible/collections``); in a checkout, the project's config puts the
checkout's ``collections/`` first (:func:`collections_first`; ``ansible.collections_path`` in ``invoke.yaml``), where
``ansible_collections/gpufleet/remediation`` links back to the working tree. Every run gets the same Ansible settings
whatever the working directory: the wrapper writes its own ``ansible.cfg`` (:data:`ANSIBLE_SETTINGS`, what the
checkout's ``ansible.cfg`` says) into the run's private data directory and forces ``ANSIBLE_CONFIG`` to it; an
``ansible.cfg`` in the working directory or the user's ``~/.ansible.cfg`` is not read (``ANSIBLE_*`` variables
still override single settings, as Ansible lets them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from remediation.core.errors import RunnerError

#: The collection whose playbooks :func:`run_playbook` runs by name.
COLLECTION = "gpufleet.remediation"
ENV_ALLOWLIST = (
    "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "TZ", "SSH_AUTH_SOCK", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
)
ENV_PREFIXES = ("ANSIBLE_",)
# Set by this wrapper whatever the environment says (the run's own config, home and temp dir; host keys checked).
FORCED_ENV = ("PATH", "ANSIBLE_CONFIG", "ANSIBLE_FORCE_COLOR", "ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_HOME",
              "ANSIBLE_LOCAL_TEMP", "ANSIBLE_COLLECTIONS_PATH")
#: Ansible's own names for the collections path, read from the caller's environment (the plural is the old name).
COLLECTIONS_PATH_VARS = ("ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_COLLECTIONS_PATHS")
REDACTED = "<redacted>"
#: The run's ansible.cfg (section -> settings): what the project's ansible.cfg gives in a checkout, for every run
#: from any directory. ``collections_path`` is added per run (:func:`collections_path`); host key checking is also
#: forced in the environment, where an ``ANSIBLE_HOST_KEY_CHECKING`` of the caller cannot turn it off.
ANSIBLE_SETTINGS: Mapping[str, Mapping[str, str]] = {
    "defaults": {
        "host_key_checking": "True",
        "forks": "30",
        "interpreter_python": "auto_silent",
        "retry_files_enabled": "False",
        "stdout_callback": "ansible.builtin.default",
        "callback_result_format": "yaml",
        "gathering": "smart",
        "timeout": "30",
    },
    "ssh_connection": {"pipelining": "True"},
}
_PLAYBOOK_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_FQCN = re.compile(r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*")
#: Collection directories searched first (see :func:`collections_first`).
_collections_first: tuple[Path, ...] = ()


class HostState(StrEnum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class TaskChange:
    task: str
    changed: bool
    diff: tuple[str, ...] = ()
    msg: str | None = None


@dataclass(frozen=True)
class HostOutcome:
    host: str
    state: HostState
    changes: tuple[TaskChange, ...]
    failures: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return any(c.changed for c in self.changes)


@dataclass(frozen=True)
class PlaybookResult:
    run_id: str
    rc: int
    status: str
    hosts: Mapping[str, HostOutcome]
    stdout_tail: str = ""

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, o in self.hosts.items() if o.state is HostState.FAILED)

    @property
    def unreachable_hosts(self) -> list[str]:
        return sorted(h for h, o in self.hosts.items() if o.state is HostState.UNREACHABLE)

    @property
    def changed_hosts(self) -> list[str]:
        return sorted(h for h, o in self.hosts.items() if o.changed)


def _render_diff(diff: Any) -> list[str]:
    """Ansible diffs come as dicts (before/after, or prepared text) or lists of them."""
    import difflib

    out: list[str] = []
    for d in diff if isinstance(diff, list) else [diff]:
        if not isinstance(d, dict):
            continue
        if d.get("prepared"):
            out.append(str(d["prepared"]))
            continue
        before, after = d.get("before"), d.get("after")
        if isinstance(before, str) and isinstance(after, str):
            out.extend(
                difflib.unified_diff(
                    before.splitlines(keepends=True),
                    after.splitlines(keepends=True),
                    fromfile=str(d.get("before_header", "before")),
                    tofile=str(d.get("after_header", "after")),
                )
            )
        elif before is not None or after is not None:
            out.append(f"- {before!r}\n+ {after!r}\n")
    return out


@dataclass
class _Collector:
    changes: dict[str, list[TaskChange]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    on_event: Callable[[Mapping[str, Any]], None] | None = None

    def __call__(self, event: Mapping[str, Any]) -> bool:
        if self.on_event is not None:
            self.on_event(event)
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if host is None or not kind.startswith("runner_on_"):
            return True
        self.seen.add(host)
        res = data.get("res") or {}
        task = str(data.get("task", ""))
        if kind == "runner_on_ok":
            changed = bool(res.get("changed"))
            diff = tuple(_render_diff(res.get("diff"))) if res.get("diff") else ()
            if changed or diff:
                self.changes.setdefault(host, []).append(TaskChange(task, changed, diff, res.get("msg")))
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self.failures.setdefault(host, []).append(f"{task}: {res.get('msg') or res.get('stderr') or 'failed'}")
        elif kind == "runner_on_unreachable":
            self.failures.setdefault(host, []).append(f"unreachable: {res.get('msg', '')}")
        return True  # keep the event on disk (job artifacts) as well


@contextlib.contextmanager
def collections_first(paths: Iterable[str | Path]) -> Iterator[None]:
    """Inside the block, runs search these collection directories (each one holding ``ansible_collections/``) before
    the user's: how a checkout's ``collections/`` (its link to itself) wins over an installed copy of the collection.
    The tasks set it from ``ansible.collections_path``; nested blocks put their directories in front."""
    global _collections_first
    saved = _collections_first
    _collections_first = (*(Path(p).expanduser().absolute() for p in paths), *saved)
    try:
        yield
    finally:
        _collections_first = saved


def collections_path(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where a run looks for collections, first match wins: :func:`collections_first`'s directories, then the
    caller's ``ANSIBLE_COLLECTIONS_PATH`` (or ``ANSIBLE_COLLECTIONS_PATHS``), else Ansible's defaults for the caller
    (``$ANSIBLE_HOME/collections`` or ``~/.ansible/collections``, and ``/usr/share/ansible/collections``). Ansible
    also finds ``ansible_collections`` packages on Python's path (``collections_scan_sys_path``)."""
    environ = os.environ if environ is None else environ
    given = next((environ[name] for name in COLLECTIONS_PATH_VARS if environ.get(name)), None)
    if given is not None:
        rest = [Path(p).expanduser() for p in given.split(os.pathsep) if p]
    else:
        home = Path(environ["ANSIBLE_HOME"]).expanduser() if environ.get("ANSIBLE_HOME") else Path.home() / ".ansible"
        rest = [home / "collections", Path("/usr/share/ansible/collections")]
    out: list[Path] = []
    for path in (*_collections_first, *rest):
        if path not in out:
            out.append(path)
    return out


def playbook_target(playbook: str | Path) -> str:
    """What ``ansible-playbook`` is given for ``playbook``: ``gpufleet.remediation.NAME`` for a name (``"harden"``),
    the old in-repository form (``"playbooks/harden.yml"``) or a FQCN; an absolute path to a playbook file as it is
    (a playbook of your own, or a test's). :class:`RunnerError` for anything else."""
    text = str(playbook)
    if os.path.isabs(text):
        if not Path(text).is_file():
            raise RunnerError(f"playbook {text} does not exist")
        return text
    match = re.fullmatch(r"(?:\./)?playbooks/([^/]+)\.ya?ml", text)
    name = match.group(1) if match else text
    if _PLAYBOOK_NAME.fullmatch(name):
        return f"{COLLECTION}.{name}"
    if _FQCN.fullmatch(name):
        return name
    raise RunnerError(
        f"playbook {text!r}: give a playbook name of the collection {COLLECTION} (e.g. driver_restore), a FQCN "
        "(namespace.collection.playbook) or an absolute path to a playbook file"
    )


def _find_collection_playbook(fqcn: str, paths: Sequence[Path]) -> Path | None:
    """The file ``ansible-playbook`` will run for ``fqcn``: the first collection on ``paths`` (then Python's path,
    as Ansible scans it) that has the collection; None when no directory has it."""
    namespace, collection, *rest = fqcn.split(".")
    relative = Path(*rest[:-1]) if len(rest) > 1 else Path()
    for base in (*paths, *(Path(p) for p in sys.path if p)):
        root = base / "ansible_collections" / namespace / collection
        if base.name == "ansible_collections":
            root = base / namespace / collection
        if (root / "MANIFEST.json").is_file() or (root / "galaxy.yml").is_file() or (root / "playbooks").is_dir():
            for suffix in (".yml", ".yaml"):
                candidate = root / "playbooks" / relative / f"{rest[-1]}{suffix}"
                if candidate.is_file():
                    return candidate
            return None  # the first collection found is the one Ansible uses
    return None


def _write_config(path: Path, collections: Sequence[Path]) -> Path:
    lines: list[str] = []
    for section, values in ANSIBLE_SETTINGS.items():
        lines.append(f"[{section}]")
        if section == "defaults":
            lines.append(f"collections_path = {os.pathsep.join(str(p) for p in collections)}")
        lines.extend(f"{key} = {value}" for key, value in values.items())
        lines.append("")
    path.write_text("\n".join(lines))
    path.chmod(0o600)
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWLIST or k.startswith(ENV_PREFIXES)}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        [venv_bin, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    )
    env.pop("ANSIBLE_COLLECTIONS_PATHS", None)  # folded into ANSIBLE_COLLECTIONS_PATH (collections_path)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(str(p) for p in collections_path())
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["ANSIBLE_HOST_KEY_CHECKING"] = "True"
    return env


def _runner_env(prepared: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """ansible-runner's prepared environment without what it copied from ours but the allowlist does not pass:
    what we gave it, plus what the runner set or changed itself (its callback plugin, artifact dir, ...)."""
    return {
        k: v
        for k, v in prepared.items()
        if k in ours or k not in os.environ or os.environ[k] != v
    }


def _scrub_artifacts(run_dir: Path) -> None:
    """Kept artifacts keep the names of the environment's variables, not their values."""
    import json

    command = run_dir / "command"
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads(command.read_text())
        if isinstance(doc.get("env"), dict):
            doc["env"] = {k: REDACTED for k in sorted(doc["env"])}
        command.write_text(json.dumps(doc))


@contextlib.contextmanager
def _sigint_cancels() -> Iterator[threading.Event]:
    """While a playbook runs, SIGINT (Ctrl-C, ``kill -INT``) only sets the returned event; ansible-runner polls it as
    its cancel callback and kills the playbook's whole process group, so no Ansible worker goes on changing a host
    after the controller was interrupted. :func:`run_playbook` raises ``KeyboardInterrupt`` once the run is down.
    Outside the main thread (no signal handler can be set) the event is never set and SIGINT acts as usual."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda _sig, _frame: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


def run_playbook(
    playbook: str | Path,
    inventory: str | Path,
    *,
    limit: Sequence[str] | None = None,
    check: bool = False,
    diff: bool = False,
    tags: Sequence[str] | None = None,
    extravars: Mapping[str, Any] | None = None,
    forks: int = 30,
    job_timeout: int = 1800,
    idle_timeout: int = 600,
    keep_artifacts: Path | None = None,
    on_event: Callable[[Mapping[str, Any]], None] | None = None,
) -> PlaybookResult:
    """Run one playbook; every host targeted is in the result (ok, changed, failed, unreachable, skipped).

    ``playbook``: a playbook name of the collection (``"driver_restore"``), its FQCN, or an absolute path to a
    playbook file; the old ``"playbooks/NAME.yml"`` still means the collection's NAME (see :func:`playbook_target`).
    ``on_event``: called with each of Ansible's events as it arrives, while the playbook runs (keep it quick: the
    run's output waits for it), e.g. to start work on the hosts of a ``serial`` batch as soon as the next one starts.
    """
    import ansible_runner.interface

    target = playbook_target(playbook)
    env = _env()
    collections = [Path(p) for p in env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)]
    if not os.path.isabs(target) and _find_collection_playbook(target, collections) is None:
        raise RunnerError(
            f"playbook {target} not found: no collection on the collections path ({', '.join(map(str, collections))}) "
            f"has it; install the collection (ansible-galaxy collection install gpufleet-remediation-*.tar.gz), set "
            "ANSIBLE_COLLECTIONS_PATH, or ansible.collections_path in invoke.yaml"
        )
    if shutil.which("ansible-playbook", path=env["PATH"]) is None:
        raise RunnerError("ansible-playbook not found next to this Python: install the project (./run setup)")
    run_id = uuid.uuid4().hex[:12]
    private = Path(tempfile.mkdtemp(prefix=f"gpufleet-runner-{run_id}-"))
    private.chmod(0o700)
    env["ANSIBLE_CONFIG"] = str(_write_config(private / "ansible.cfg", collections))
    env["ANSIBLE_HOME"] = str(private / "ansible-home")
    env["ANSIBLE_LOCAL_TEMP"] = str(private / "tmp")
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    collector = _Collector(on_event=on_event)
    try:
        runner = ansible_runner.interface.init_runner(
            private_data_dir=str(private),
            ident=run_id,
            playbook=target,
            inventory=str(Path(inventory).resolve()),
            limit=",".join(limit) if limit else None,
            tags=",".join(tags) if tags else None,
            extravars=dict(extravars or {}),
            envvars=env,
            cmdline=" ".join(cmdline) or None,
            forks=forks,
            quiet=True,
            event_handler=collector,
            settings={"job_timeout": job_timeout, "idle_timeout": idle_timeout, "suppress_ansible_output": True},
        )
        runner.config.env = _runner_env(runner.config.env, env)
        with _sigint_cancels() as interrupted:
            runner.cancel_callback = interrupted.is_set
            runner.run()
        if interrupted.is_set():
            raise KeyboardInterrupt(f"playbook {target} interrupted; its processes were stopped")
        stats = runner.stats or {}
        tail = ""
        with contextlib.suppress(OSError, ValueError):
            tail = "".join(runner.stdout.readlines()[-40:])
        hosts: dict[str, HostOutcome] = {}
        names = set(collector.seen)
        for key in ("ok", "changed", "failures", "dark", "skipped"):
            names |= set((stats.get(key) or {}).keys())
        for name in sorted(names):
            if name in (stats.get("dark") or {}):
                state = HostState.UNREACHABLE
            elif name in (stats.get("failures") or {}):
                state = HostState.FAILED
            elif name in (stats.get("changed") or {}):
                state = HostState.CHANGED
            elif name in (stats.get("ok") or {}):
                state = HostState.OK
            else:
                state = HostState.SKIPPED
            hosts[name] = HostOutcome(
                name, state, tuple(collector.changes.get(name, ())), tuple(collector.failures.get(name, ()))
            )
        if runner.status in ("timeout",):
            raise RunnerError(f"playbook {target} timed out (job {job_timeout} s / idle {idle_timeout} s)")
        return PlaybookResult(run_id, int(runner.rc or 0), str(runner.status), hosts, tail)
    finally:
        if keep_artifacts is not None and (private / "artifacts" / run_id).is_dir():
            keep_artifacts.mkdir(parents=True, exist_ok=True)
            _scrub_artifacts(private / "artifacts" / run_id)
            shutil.copytree(private / "artifacts", keep_artifacts / run_id, dirs_exist_ok=True)
        shutil.rmtree(private, ignore_errors=True)
