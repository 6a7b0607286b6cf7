"""``gpufleet``: the project's tasks under an :class:`invoke.Program` that owns every edge Invoke itself does not.

``gpufleet TASK ...`` runs exactly what ``invoke TASK ...`` runs in the checkout: the same namespace
(:mod:`commands.namespace`, which ``tasks.py`` also exposes), imported from the installed packages, so it works from
any directory; no ``tasks.py`` is searched for or imported. The config files are Invoke's: ``/etc/invoke.yaml``,
``~/.invoke.yaml``, ``INVOKE_*`` variables and ``-f FILE``, over the defaults the namespace registers; and the
project's ``invoke.yaml`` where there is a project: Invoke reads the project file beside the ``tasks.py`` it loads,
and a :class:`~invoke.Program` with a namespace loads none, so :meth:`FleetProgram.parse_collection` finds the
nearest ``tasks.py`` up from the working directory (Invoke's own search, ``tasks.search_root`` respected) and reads
the ``invoke.yaml`` beside it as the project config, checked first as ``tasks.py`` checks it. In a checkout that is
the checkout's ``invoke.yaml`` (its fleets, ``ansible.collections_path``, ...), wherever in it ``gpufleet`` runs;
elsewhere there is no project file and relative config paths are under the working directory. It adds, before and
around the task:

- a config file Invoke cannot load (YAML syntax, a section of the wrong shape, in the project's, the user's, the
  system's or the ``-f`` runtime file): one line on stderr, exit 2, instead of Invoke's traceback (exit 1, which the
  tasks use for "findings");
- Invoke's own parse errors (unknown flag, missing flag value, missing positional): one line, exit 2;
- ``-h``/``--help`` after a task is that task's help (exit 0), also for a task whose positional is not given yet
  (Invoke's parser would read the token as FILE, TEMPLATE or HOST);
- a task whose positional ``file`` is not given while text is piped in reads stdin, as if ``-`` were given; with a
  terminal on stdin it is one line and exit 2 (:func:`no_input_line`: a FILE, ``-`` or piped text), never a wait;
- a reader that closes stdout early (``gpufleet --list | head``): quiet, exit 141.

Plain ``invoke`` keeps working; the tasks' own edge (:func:`commands.edge`) already covers errors inside a task.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from invoke import Exit, ParseError, Program
from invoke.config import AmbiguousMergeError, UnknownFileType
from invoke.vendor import yaml as invoke_yaml

from remediation.core.exitcodes import ExitCode

__all__ = ["FleetProgram", "main", "no_input_line", "parse_error_line", "program"]

#: Positional arguments that mean "stdin" when text is piped in and they are not given.
STDIN_POSITIONALS = frozenset({"file"})


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _config_error(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f"line {mark.line + 1}, column {mark.column + 1}: {_one_line(getattr(exc, 'problem', '') or exc)}"
        return f"config file {mark.name} is not valid YAML ({where}); fix its syntax"
    if isinstance(exc, AmbiguousMergeError):
        return (
            f"a config file gives a section the wrong shape ({_one_line(exc)[:200]}); "
            "each section (audit:, fleets:, ...) is a mapping of key: value"
        )
    return f"a config file cannot be loaded: {_one_line(exc)[:300]}"


#: Config files Invoke cannot load: YAML errors of PyYAML and of the copy Invoke vendors (which reads config files).
_LOAD_ERRORS: tuple[type[Exception], ...] = (
    yaml.YAMLError,
    getattr(invoke_yaml, "YAMLError", yaml.YAMLError),
    UnknownFileType,
    UnicodeDecodeError,
)


def _shape_error(config: Any) -> str | None:
    """The config level that sets a section to a non-mapping where a lower level has a mapping, with its file."""
    mappings: set[str] = set()
    for level in ("defaults", "collection", "system", "user", "project", "env", "runtime"):
        data = getattr(config, f"_{level}", None)
        if not isinstance(data, dict):
            continue
        source = "INVOKE_* variables" if level == "env" else str(getattr(config, f"_{level}_path", None) or level)
        for key, value in data.items():
            if isinstance(value, dict):
                mappings.add(key)
            elif key in mappings:
                return f"setting {key} must be a mapping of settings (key: value), not {value!r:.60} (in {source})"
    return None


def parse_error_line(exc: ParseError, binary: str = "gpufleet") -> str:
    """Invoke's parse error as one line naming the flag and the task, and where its help is."""
    import re

    text = _one_line(exc)
    flag = re.fullmatch(r"Flag <Argument: ([\w-]+)> needed value and was not given one!", text)
    if flag:
        text = f"--{flag.group(1).replace('_', '-')} needs a value"
    unknown = re.fullmatch(r"No idea what '(.*)' is!", text)
    if unknown:
        word = unknown.group(1)
        text = f"unknown flag {word!r}" if word.startswith("-") else f"no task {word!r} (or one argument too many)"
    positional = re.fullmatch(r"'(.+)' did not receive required positional arguments: (.+)", text)
    if positional:
        text = f"{positional.group(1)} needs {positional.group(2).replace(chr(39), '').replace('_', '-').upper()}"
    context = getattr(exc, "context", None)
    task = getattr(context, "name", None)
    where = f"`{binary} --help {task}`" if task else f"`{binary} --help` (tasks: `{binary} --list`)"
    return f"{text}; see {where}"


@contextmanager
def _edge(config: Any = None) -> Iterator[None]:
    """Invoke's and the config loader's errors as ``Exit(message, code=ExitCode.BAD_INPUT)``; Program prints it."""
    try:
        yield
    except ParseError as exc:
        raise Exit(f"error: {parse_error_line(exc)}", code=ExitCode.BAD_INPUT) from None
    except AmbiguousMergeError as exc:
        raise Exit(f"error: {_shape_error(config) or _config_error(exc)}", code=ExitCode.BAD_INPUT) from None
    except _LOAD_ERRORS as exc:
        raise Exit(f"error: {_config_error(exc)}", code=ExitCode.BAD_INPUT) from None


class FleetProgram(Program):
    """:class:`invoke.Program` with the edges above; everything else is Invoke's."""

    def run(self, argv: Any = None, exit: bool = True) -> None:
        try:
            try:
                super().run(argv, exit)
            finally:
                sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
            sys.exit(ExitCode.BROKEN_PIPE)

    def create_config(self) -> None:
        with _edge():
            super().create_config()

    def parse_core(self, argv: Any) -> None:
        with _edge():
            super().parse_core(argv)

    def parse_collection(self) -> None:
        with _edge(self.config):
            super().parse_collection()
            self._load_project_config()

    def _load_project_config(self) -> None:
        """The project's ``invoke.yaml`` (beside the nearest ``tasks.py`` up from the working directory), loaded as
        Invoke's project config level, as ``invoke`` loads it after finding ``tasks.py``; none outside a project."""
        project = project_dir(self.config)
        if project is None:
            return
        from commands import preflight

        preflight(project / "invoke.yaml")
        self.config.set_project_location(str(project))
        self.config.load_project()

    def parse_tasks(self) -> None:
        asked = self._help_asked_for()
        if asked is not None:
            self.parser = self._make_parser()
            self.print_task_help(asked)
            raise Exit
        with _edge():
            try:
                super().parse_tasks()
            except ParseError as exc:
                if not self._stdin_for_missing_file(exc):
                    raise
                super().parse_tasks()

    def parse_cleanup(self) -> None:
        with _edge():
            super().parse_cleanup()

    def update_config(self, merge: bool = True) -> None:
        with _edge(self.config):
            super().update_config(merge)

    def execute(self) -> None:
        with _edge(self.config):
            super().execute()

    def task_list_opener(self, extra: str = "") -> str:
        """Invoke's own heading (``Available tasks``, with ``--list`` root and depth), as ``invoke --list`` prints it,
        not the bare ``Subcommands`` of a bundled namespace: one listing under both names."""
        namespace, self.namespace = self.namespace, None
        try:
            return str(super().task_list_opener(extra))
        finally:
            self.namespace = namespace

    def _help_asked_for(self) -> str | None:
        """The task a ``-h``/``--help`` after it asks help for (``gpufleet diagnose -h``): Invoke's parser would give
        the token to a positional still missing (FILE, TEMPLATE, HOST) and run the task with it."""
        tasks = self._task_names()
        current = None
        for word in self.core.unparsed:
            if word == "--":
                break
            if word in tasks:
                current = word
            elif word in ("-h", "--help") and current is not None:
                return current
        return None

    def _stdin_for_missing_file(self, exc: ParseError) -> bool:
        """A task missing only its ``file`` while text is piped in: give it ``-`` and parse again (True)."""
        context = getattr(exc, "context", None)
        missing = {a.name for a in getattr(context, "missing_positional_args", None) or ()}
        if context is None or not missing or not missing <= STDIN_POSITIONALS:
            return False
        if sys.stdin is None or sys.stdin.isatty():
            raise Exit(f"error: {no_input_line(context.name, self.name)}", code=ExitCode.BAD_INPUT)
        names = {context.name, *context.aliases}
        unparsed = self.core.unparsed
        at = next((i for i, token in enumerate(unparsed) if token in names), None)
        if at is None:
            return False
        tasks = self._task_names()
        end = next((j for j in range(at + 1, len(unparsed)) if unparsed[j] in tasks), len(unparsed))
        unparsed.insert(end, "-")
        return True

    def _task_names(self) -> set[str]:
        names: set[str] = set()
        for context in self.collection.to_contexts():
            names.add(str(context.name))
            names.update(context.aliases)
        return names


def no_input_line(task: str, binary: str = "gpufleet") -> str:
    """What a task reading text says when it was given no FILE and stdin is a terminal (nothing piped in)."""
    return (
        f"{task}: no input: give a FILE, - to read stdin (paste, then Ctrl-D), or pipe the text in "
        f"(... | {binary} {task})"
    )


def project_dir(config: Any) -> Path | None:
    """The directory of the nearest ``tasks.py`` (or ``tasks/`` package) up from ``tasks.search_root`` or the
    working directory, found by Invoke's own loader (nothing imported); None outside any project."""
    from invoke.exceptions import CollectionNotFound
    from invoke.loader import FilesystemLoader

    try:
        spec = FilesystemLoader(config=config).find(config.tasks.collection_name)
    except CollectionNotFound:
        return None
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent
    return found.parent if spec.submodule_search_locations else found


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-fleet-remediation")
    except PackageNotFoundError:
        return "0"


def _namespace() -> Any:
    from commands.namespace import ns

    return ns


program = FleetProgram(
    name="gpufleet", binary="gpufleet", binary_names=["gpufleet"], version=_version(), namespace=_namespace()
)
main: Callable[[], None] = program.run

if __name__ == "__main__":
    main()
