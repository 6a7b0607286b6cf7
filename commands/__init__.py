"""Invoke task modules, one per area; :mod:`commands.namespace` assembles them (``tasks.py`` in the checkout and the
installed ``gpufleet`` console script both run that namespace).

Each module holds the thin tasks of one namespace: parse the flags, load the area's typed settings
(:mod:`remediation.config`), call one ``remediation.*`` function, render, ``raise Exit(code=...)``. What every area
shares lives here: :func:`edge` (the library's errors become one line on stderr and an exit code, here and nowhere
else), the fleet flags and the fleet lookup. Heavy imports stay inside the tasks, so ``invoke --list`` is instant.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke import Argument, Exit, Task

from remediation.core.exitcodes import ExitCode

F = TypeVar("F", bound=Callable[..., Any])

#: The two names of the human-readable output: some tasks call it ``table``, some ``text``; both work on every task.
TEXT_FORMATS = ("text", "table")


def check_format(value: Any, allowed: tuple[str, ...]) -> str:
    """``--format VALUE`` as the task's own name for it (one of ``allowed``, the first the default): ``text`` and
    ``table`` both name the task's human-readable output, case and spaces do not matter; anything else is one line
    (UsageError, exit 2) naming what the task takes."""
    from remediation.core.errors import UsageError

    fmt = allowed[0] if value is None else str(value).strip().lower()
    own = next((name for name in allowed if name in TEXT_FORMATS), None)
    if fmt in TEXT_FORMATS and own is not None:
        return own
    if fmt not in allowed:
        names = ", ".join("text (or table)" if name == own else name for name in allowed)
        raise UsageError(f"--format {value!r} is not one of {names}")
    return fmt


def formats(*allowed: str) -> Callable[[F], F]:
    """The task's ``format`` flag through :func:`check_format` before the task runs (under :func:`edge`, so a bad
    one is one line and exit 2); ``allowed`` is kept on the task's body as ``formats`` (tests/cli checks every task).
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if "format" in kwargs:
                kwargs["format"] = check_format(kwargs["format"], allowed)
            return func(*args, **kwargs)

        wrapper.formats = allowed  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


class WholeNumberArgument(Argument):
    """A flag whose value is a whole number: ``--batch=INT`` in the help (Invoke names the value by the argument's
    kind), while the text is handed to the task as given, which types it and says what is wrong in one line (exit 2):
    Invoke's own cast would end ``--batch abc`` in a traceback."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        super().set_value(value, cast=False)


class NumbersTask(Task[Any]):
    """A task (``@task(klass=NumbersTask, numbers=(...))``) whose ``numbers`` flags are whole numbers in its help
    (:class:`WholeNumberArgument`); everything else is Invoke's :class:`~invoke.Task`."""

    def __init__(self, *args: Any, numbers: tuple[str, ...] = (), **kwargs: Any) -> None:
        self.numbers = frozenset(numbers)
        super().__init__(*args, **kwargs)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        arguments: list[Argument] = super().get_arguments(ignore_unknown_help)
        unknown = self.numbers - {a.name for a in arguments}
        if unknown:
            raise ValueError(f"numbers names no flag of {self.name}: {sorted(unknown)}")
        return [
            WholeNumberArgument(
                names=a.names, kind=int, default=a.default, help=a.help, positional=a.positional,
                optional=a.optional, incrementable=a.incrementable, attr_name=a.attr_name,
            )
            if a.name in self.numbers
            else a
            for a in arguments
        ]


def format_help(*allowed: str, **notes: str) -> str:
    """The help of a task's ``--format``, worded alike on every task: the names it takes (:func:`formats`), the first
    the default, ``text or table`` for the human-readable output (two names of one output), a note per name."""
    parts = []
    for index, name in enumerate(allowed):
        label = "text or table" if name in TEXT_FORMATS else name
        extras = [note for note in ("the default" if index == 0 else "", notes.get(name, "")) if note]
        parts.append(f"{label} ({'; '.join(extras)})" if extras else label)
    return " | ".join(parts)


def renamed(**old_to_new: str) -> Callable[[F], F]:
    """Flags a task took under another name, kept only to say so: ``@renamed(limit="vcpus")`` refuses ``--limit N``
    with one line naming ``--vcpus`` (UsageError, exit 2, under :func:`edge`). The names are kept on the body as
    ``renamed`` (tests/cli checks the README's flag table without them)."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from remediation.core.errors import UsageError

            for old, new in old_to_new.items():
                if kwargs.get(old) is not None:
                    flag, to = old.replace("_", "-"), new.replace("_", "-")
                    raise UsageError(f"--{flag} is now --{to} on this task: give --{to} {kwargs[old]}")
            return func(*args, **kwargs)

        wrapper.renamed = dict(old_to_new)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


#: Help for the flags every fleet task takes.
FLEET_HELP = {
    "fleet": "fleet name from invoke.yaml (fleets:), default gpu",
    "inventory": "Ansible inventory to use instead of the fleet's",
    "limit": "comma-separated host names or glob patterns",
}
#: Help for the one word every mutating task uses for "show the plan, change nothing".
CHECK_HELP = "show the per-host plan and diff, then stop: nothing changes on any host (--dry-run is an alias)"


def edge(func: F) -> F:
    """Turn the library's errors into one line and an exit code (BAD_INPUT unless the error says otherwise).

    A reader that closed stdout early (``... | head``) is BROKEN_PIPE (128 + SIGPIPE, as a shell reports a writer
    killed by the signal), quiet, no traceback; Ctrl-C is INTERRUPTED.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from remediation.core.errors import RemediationError

        if any(isinstance(value, str) and value in HELP_FLAGS for value in kwargs.values()):
            _task_help()
        try:
            try:
                return func(*args, **kwargs)
            finally:
                sys.stdout.flush()  # a reader that went away is seen here, not at interpreter exit
        except RemediationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise Exit(code=ExitCode.INTERRUPTED) from None
        except BrokenPipeError:
            quiet_stdout()
            raise Exit(code=ExitCode.BROKEN_PIPE) from None

    return wrapper  # type: ignore[return-value]


#: The program's help flags; Invoke's parser gives one to a task's positional still missing (``invoke diagnose -h``).
HELP_FLAGS = frozenset({"-h", "--help"})


def _task_help() -> None:
    """``invoke TASK -h`` where the task's positional was still missing: Invoke read ``-h`` as FILE, TEMPLATE or
    HOST. Print the task's help as ``invoke --help TASK`` does and exit 0 (``gpufleet`` sees it before parsing)."""
    from invoke.main import program

    if getattr(program, "parser", None) is None:
        return
    for context in getattr(program, "tasks", None) or ():
        given = [getattr(arg, "value", None) for arg in context.args.values()]
        if any(isinstance(value, str) and value in HELP_FLAGS for value in given):
            program.print_task_help(context.name)
            raise Exit(code=ExitCode.OK)


def required_flags(task: str, **flags: Any) -> None:
    """Flags a task needs, taken as flags rather than a second positional (with two, Invoke's parser gives ``-h`` to
    the first and fails on the second before the task's help): one line naming the missing ones (exit 2)."""
    from remediation.core.errors import UsageError

    missing = [f"--{name.replace('_', '-')}" for name, value in flags.items() if value in (None, "")]
    if missing:
        raise UsageError(f"{task} needs {' and '.join(missing)}; see `gpufleet --help {task}`")


def require_confirmation(what: str, *, check: bool, yes: bool, preview: str) -> None:
    """Refuse a task that changes something when it can neither ask nor was told: one line, BAD_INPUT.

    Nothing is refused with ``--check`` (nothing changes), ``--yes`` (told) or a terminal on stdin (:func:`ask` asks
    there). ``what`` is the task and what it does ("harden changes hosts"), ``preview`` what ``--check`` shows
    ("to preview"): ``WHAT and there is no terminal to confirm on: pass --yes, or --check PREVIEW``.
    """
    if check or yes or (sys.stdin is not None and sys.stdin.isatty()):
        return
    from remediation.core.errors import UsageError

    raise UsageError(f"{what} and there is no terminal to confirm on: pass --yes, or --check {preview}")


def ask(question: str) -> bool:
    """Ask ``QUESTION? [y/N]`` on the terminal: True for y or yes (any case, spaces around), anything else is no."""
    answer = input(f"{question}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that nothing (Python's exit-time flush included) writes to a closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (captured): nothing to protect
        pass


def project_dir(c: Any) -> Path:
    """The directory relative config paths are under: the project's (where Invoke found ``tasks.py`` and reads its
    ``invoke.yaml``: the checkout, whichever subdirectory ``invoke`` or ``gpufleet`` runs from), else the working
    directory (``gpufleet`` from an install, outside any project). Fleet inventories, ``.audit``, the lab's state and
    a ``k8s.templates_dir`` of your own are found there; nothing is computed from where this code is installed."""
    prefix = getattr(c.config, "_project_prefix", None)
    return Path(prefix) if prefix else Path.cwd()


def under_project(c: Any, path: str | Path) -> Path:
    """``path`` (``~`` expanded) as it is, when absolute, else under :func:`project_dir`."""
    return project_dir(c) / Path(path).expanduser()


def shown(path: Path) -> str:
    """``path`` for a printed command: relative to the working directory when it is under it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def config_source(c: Any, name: str) -> str:
    """The config file (or ``INVOKE_*`` variables) that set the ``name:`` section, for messages; highest level first."""
    config = c.config
    for level, label in (
        ("runtime", None),
        ("env", "INVOKE_* variables"),
        ("project", None),
        ("user", None),
        ("system", None),
    ):
        data = getattr(config, f"_{level}", None)
        if isinstance(data, dict) and name in data:
            return label or str(getattr(config, f"_{level}_path", None) or "invoke.yaml")
    return "invoke.yaml"


def preflight(path: Path) -> None:
    """Check the project's ``invoke.yaml`` before Invoke loads it (``tasks.py`` calls this when Invoke imports it).

    Invoke reads the project's config file after it imports ``tasks.py`` and before any task runs, and a YAML syntax
    error or a section of the wrong shape there ends in its traceback (exit 1, which means "findings" here). This
    turns them into one line on stderr and exit 2.
    """
    from remediation.config import check_config_file
    from remediation.core.errors import RemediationError

    try:
        check_config_file(path, SECTIONS)
    except RemediationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


#: The config sections that are mappings (Invoke merges them with the defaults ``tasks.py`` registers).
SECTIONS = ("fleets", "ansible", "audit", "driver_restore", "kernel_update", "lab", "k8s", "aoai", "azure", "train",
            "remediate")


def settings(c: Any, cls: type[Any], name: str) -> Any:
    """The ``name:`` config section as its typed settings class."""
    from remediation.config import load_section

    return load_section(cls, c.config.get(name, {}), name, config_source(c, name))


def with_collections(func: F) -> F:
    """Run a task that runs playbooks with ``ansible.collections_path`` (under the project directory) searched first
    for the collection ``gpufleet.remediation`` (:func:`remediation.transport.runner.collections_first`). Goes under
    :func:`edge`, which reports a bad ``ansible:`` section."""

    @functools.wraps(func)
    def wrapper(c: Any, *args: Any, **kwargs: Any) -> Any:
        from remediation.config import AnsibleSettings
        from remediation.transport.runner import collections_first

        cfg = settings(c, AnsibleSettings, "ansible")
        with collections_first(under_project(c, path) for path in cfg.directories()):
            return func(c, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def fleet_hosts(c: Any, fleet: str, inventory: str | None, limit: str | None) -> tuple[list[Any], str, str]:
    """The fleet's hosts (after ``--limit``), the inventory path and the group, from ``fleets:`` or ``--inventory``."""
    from remediation.config import fleets_from_mapping
    from remediation.core.errors import InventoryError
    from remediation.transport.inventory import load

    fleets = fleets_from_mapping(c.config.get("fleets", {}), config_source(c, "fleets"))
    if fleet not in fleets and inventory is None:
        raise InventoryError(
            f"fleet {fleet!r} is not configured (fleets: {', '.join(fleets) or 'none'}); "
            "add it under fleets: in invoke.yaml or pass --inventory"
        )
    spec = fleets.get(fleet)
    group = spec.group_name if spec is not None else fleet
    path = inventory or str(under_project(c, spec.inventory if spec is not None else "inventories/lab/hosts.yml"))
    hosts = load(path, group, limit)
    if not hosts:
        after = f" (after --limit {limit})" if limit else ""
        raise InventoryError(
            f"no hosts in group {group} of inventory {path}{after}: add hosts to the group or choose another --fleet"
        )
    return hosts, path, group


def audit_options(c: Any, concurrency: Any = None, timeout: Any = None) -> Any:
    """:class:`~remediation.host.audit.AuditOptions` from ``audit:``, with the flags that override it."""
    from remediation.config import AuditSettings, positive
    from remediation.host.api import AuditOptions

    cfg = settings(c, AuditSettings, "audit")
    # None (no flag, no audit.concurrency): chosen from the machine and the fleet (fanout.auto_concurrency)
    wanted = cfg.concurrency if concurrency is None else concurrency
    return AuditOptions(
        concurrency=None if wanted is None else int(positive(wanted, int, "--concurrency")),
        connect_timeout=cfg.connect_timeout,
        timeout=float(positive(cfg.timeout if timeout is None else timeout, float, "--timeout")),
        nvml_timeout=cfg.nvml_timeout,
        temp_alert_c=cfg.temp_alert_c,
        memory_full_pct=cfg.memory_full_pct,
        expected_driver_version=cfg.expected_driver_version,
    )


def read_input(file: str | None, task: str = "diagnose") -> tuple[str, str]:
    """The text of ``file`` (``-`` for stdin; empty or None: stdin when text is piped in) and a name for it.

    Bytes are decoded as UTF-8 with stray bytes replaced (field text holds them), whatever the locale says: stdin is
    read from its byte buffer, never through the locale's strict text layer.
    """
    from remediation.core.errors import ParseError, UsageError

    if not file:
        if sys.stdin is None or sys.stdin.isatty():
            from commands.cli import no_input_line

            raise UsageError(no_input_line(task))
        file = "-"
    if file == "-":
        if sys.stdin is not None and sys.stdin.isatty():
            print("reading the text from the terminal: paste it, then Ctrl-D", file=sys.stderr)
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "replace")
        return data.decode("utf-8", errors="replace"), "<stdin>"
    try:
        return Path(file).read_bytes().decode("utf-8", errors="replace"), file
    except OSError as exc:
        raise ParseError(f"cannot read {file}: {exc.strerror}; pass a readable file or - for stdin") from None
