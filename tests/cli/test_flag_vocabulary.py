"""One flag vocabulary for every task (README "Flags every task uses"), checked over the project's namespace.

Long flags only (no automatic short flag: ``-h`` is always help), no parameter named ``h``, and ``-h``/``--help``
after any task prints that task's help and exits 0 under ``invoke`` and ``gpufleet``, also where the task's
positional (FILE, TEMPLATE, HOST) is not given yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invoke import Collection

from commands.namespace import ns

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]
GPUFLEET = [sys.executable, "-m", "commands.cli"]


def tasks(collection: Collection = ns, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, task in collection.tasks.items():
        yield prefix + name, task
    for name, sub in collection.collections.items():
        yield from tasks(sub, f"{prefix}{name}.")


TASKS = sorted(tasks(), key=lambda item: item[0])
NAMES = [name for name, _task in TASKS]


def cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(("name", "task"), TASKS, ids=NAMES)
def test_every_flag_is_long(name: str, task: Any) -> None:
    arguments = task.get_arguments()
    assert arguments or name in ("lab.status",)
    for argument in arguments:
        assert argument.name != "h", name
        assert all(len(flag) > 1 for flag in argument.names), (name, argument.names)


def test_help_lists_no_short_flag_and_no_bare_dashes() -> None:
    r = cli([*INVOKE, "--help", "train.plan"])
    assert r.returncode == 0, r.stderr
    assert "--lora-targets=STRING" in r.stdout and "--=STRING" not in r.stdout
    assert " -h," not in r.stdout and " -g," not in r.stdout


def positionals(task: Any) -> int:
    return sum(1 for argument in task.get_arguments() if argument.positional)


def in_process(program: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``program`` (``invoke`` or ``gpufleet``) run on ``argv`` in this process, as its console script runs it: the
    same :class:`invoke.Program` object (``invoke.main.program``, which :func:`commands._task_help` also reads, or
    ``commands.cli.program``), from the checkout; returns (exit status, stdout, stderr)."""
    import invoke.main

    import commands.cli

    runner = invoke.main.program if program == "invoke" else commands.cli.program
    capsys.readouterr()
    try:
        runner.run([program, *argv])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def checkout_cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The working directory and environment of ``cli``: the checkout (Invoke finds tasks.py and invoke.yaml there),
    no user config file (HOME is an empty temp dir, as nothing in the checkout may depend on ~/.invoke.yaml)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HOME", str(tmp_path))


def check_task_help(program: str, usage: str, name: str, task: Any, code: int, out: str, err: str) -> None:
    # at most one positional: with two, Invoke's parser gives -h to the first and misses the second before any task
    # code runs (aoai.alerts, aoai.apim and lab.fault take flags for that reason)
    assert positionals(task) <= 1, name
    assert code == 0, err
    assert out.startswith(f"Usage: {usage} [--core-opts] {name} "), out[:200]
    assert err == ""


@pytest.mark.parametrize(
    ("program", "usage"), [("invoke", "inv[oke]"), ("gpufleet", "gpufleet")], ids=["invoke", "gpufleet"]
)
@pytest.mark.parametrize(("name", "task"), TASKS, ids=NAMES)
def test_dash_h_after_any_task_is_its_help(
    program: str, usage: str, name: str, task: Any, checkout_cwd: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every task, in process (one interpreter for all: the parse and the help are Invoke's and FleetProgram's
    Python, the same code the console scripts run); the subprocess cases below run the programs themselves."""
    check_task_help(program, usage, name, task, *in_process(program, [name, "-h"], capsys))


#: The programs themselves, end to end (``python -m invoke`` and ``python -m commands.cli``), on tasks of each kind:
#: no positional (audit.run, lab.status, train.plan, aoai.alerts: flags only, it once had two positionals), one
#: positional (diagnose, k8s.render).
SUBPROCESS_TASKS = ["audit.run", "diagnose", "aoai.alerts", "lab.status", "k8s.render", "train.plan"]


@pytest.mark.parametrize(
    ("program", "usage"), [(INVOKE, "inv[oke]"), (GPUFLEET, "gpufleet")], ids=["invoke", "gpufleet"]
)
@pytest.mark.parametrize("name", SUBPROCESS_TASKS)
def test_dash_h_after_a_task_is_its_help_as_a_program(program: list[str], usage: str, name: str) -> None:
    task = dict(TASKS)[name]
    r = cli([*program, name, "-h"])
    check_task_help("invoke" if program is INVOKE else "gpufleet", usage, name, task, r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("argv", [["audit", "-h"], ["k8s.render", "--help"], ["train.plan", "--model", "x", "-h"]])
def test_help_after_an_alias_or_other_flags(argv: list[str]) -> None:
    r = cli([*GPUFLEET, *argv])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: gpufleet [--core-opts] {argv[0]} "), r.stdout[:200]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["audit", "--bogus"], "error: unknown flag '--bogus'; see `gpufleet --help audit.run`"),
        (["audit", "--timeout"], "error: --timeout needs a value; see `gpufleet --help audit.run`"),
        (["train.plan", "--lora-targets"], "error: --lora-targets needs a value; see `gpufleet --help train.plan`"),
        (["train.monitor"], "error: train.monitor needs HOST; see `gpufleet --help train.monitor`"),
        (["no-such-task"], "error: no task 'no-such-task' (or one argument too many); see `gpufleet --help` "
         "(tasks: `gpufleet --list`)"),
    ],
)
def test_invokes_own_parse_errors_are_one_line_and_exit_2_under_gpufleet(argv: list[str], line: str) -> None:
    r = cli([*GPUFLEET, *argv])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [line]


def test_plain_invoke_keeps_its_own_parse_error_exit_as_the_readme_says() -> None:
    """Stock `invoke` runs Invoke's Program (tasks.py only gives it the namespace): its parse errors stay exit 1;
    the README sends scripts that need exit 2 to `gpufleet`. If Invoke ever changes this, change the README."""
    r = cli([*INVOKE, "audit", "--bogus"])
    assert r.returncode == 1 and r.stderr.strip() == "No idea what '--bogus' is!"
    readme = (ROOT / "README.md").read_text()
    assert "Invoke's own parse errors" in readme


FORMAT_TASKS = [(name, task) for name, task in TASKS if any(a.name == "format" for a in task.get_arguments())]


def test_the_tasks_with_a_format_flag() -> None:
    assert len(FORMAT_TASKS) >= 13, [name for name, _task in FORMAT_TASKS]


@pytest.mark.parametrize(("name", "task"), FORMAT_TASKS, ids=[name for name, _task in FORMAT_TASKS])
def test_every_format_flag_takes_text_and_table_alike(name: str, task: Any) -> None:
    from commands import TEXT_FORMATS, check_format

    allowed = getattr(task.body, "formats", None)
    assert allowed, f"{name}: its format flag is not checked by commands.formats"
    default = next(a.default for a in task.get_arguments() if a.name == "format")
    assert default == allowed[0], name  # the default output is unchanged: the task's own first name
    own = [fmt for fmt in allowed if fmt in TEXT_FORMATS]
    if own:
        assert check_format("text", allowed) == check_format("table", allowed) == check_format(" Table ", allowed)
        assert check_format("text", allowed) == own[0]
    if "json" in allowed:
        assert check_format("json", allowed) == check_format("JSON", allowed) == "json"
    for fmt in allowed:
        assert check_format(fmt, allowed) == fmt
    with pytest.raises(Exception, match="--format 'xml' is not one of"):
        check_format("xml", allowed)


def test_the_audits_formats_are_the_reports() -> None:
    from remediation.report.formats import FORMATS

    assert dict(TASKS)["audit.run"].body.formats == FORMATS


TOUR = ROOT / "tests" / "fixtures" / "tour"


@pytest.mark.parametrize(
    "argv",
    [
        ["diagnose", str(TOUR / "s1-after-reboot.txt")],
        ["k8s.diagnose-pending", "--events", str(TOUR / "failedscheduling.txt")],
        ["train.plan", "--model", "Llama-3-8B", "--gpu", "A100-80GB"],
    ],
    ids=["diagnose", "k8s.diagnose-pending", "train.plan"],
)
def test_text_and_table_give_the_default_output(argv: list[str]) -> None:
    default, text, table = (cli([*INVOKE, *argv, *more]) for more in ([], ["--format", "text"], ["--format", "table"]))
    assert default.returncode in (0, 1) and default.stderr == "", default.stderr
    assert default.stdout and default.stdout == text.stdout == table.stdout
    assert default.returncode == text.returncode == table.returncode


def test_an_unknown_format_is_one_line_naming_both_names() -> None:
    r = cli([*INVOKE, "k8s.diagnose-latency", str(TOUR / "latency-snapshot"), "--format", "xml"])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["error: --format 'xml' is not one of text (or table), json"]


def readme_flags() -> dict[str, set[str] | None]:
    """The README's "Flags every task uses" table: parameter name -> the tasks it lists (None: every task)."""
    text = (ROOT / "README.md").read_text()
    table = text.split("<!-- flags:begin -->", 1)[1].split("<!-- flags:end -->", 1)[0]
    rows: dict[str, set[str] | None] = {}
    for line in table.strip().splitlines()[2:]:
        flag, _meaning, where = (cell.strip() for cell in line.strip("|").split("|"))
        name = flag.split("`")[1].split()[0].lstrip("-").replace("-", "_")
        rows[name] = None if where == "every task" else {t.strip() for t in where.split(",")}
    return rows


def short(name: str) -> str:
    return name.removesuffix(".run")


def renamed(task: Any, argument: Any) -> bool:
    """A flag kept only to say its new name (quota.request's --limit, now --vcpus): refused with one line, exit 2."""
    return argument.name in getattr(task.body, "renamed", {})


def test_the_readme_table_names_every_task_of_each_shared_flag() -> None:
    rows = readme_flags()
    assert set(rows) == {"format", "out", "fleet", "inventory", "limit", "check", "yes", "h"}
    assert rows["h"] is None
    for name, listed in rows.items():
        if listed is None:
            continue
        actual = {
            short(task) for task, t in TASKS if any(a.name == name and not renamed(t, a) for a in t.get_arguments())
        }
        assert listed == actual, (name, sorted(listed ^ actual))


def test_dry_run_is_only_check_and_yes_comes_with_check() -> None:
    for name, task in TASKS:
        params = {a.name for a in task.get_arguments()}
        assert "dry_run" not in params or "check" in params, name
        assert ("yes" in params) == ("check" in params), name


@pytest.mark.parametrize("word", ["output", "outfile", "output_file", "fmt", "assume_yes", "force_yes", "hosts_file"])
def test_no_task_names_a_shared_flag_otherwise(word: str) -> None:
    assert not [name for name, task in TASKS if any(a.name == word for a in task.get_arguments())]


@pytest.mark.parametrize("program", [INVOKE, GPUFLEET], ids=["invoke", "gpufleet"])
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["quota.request", "--location", "eastus", "--family", "cores", "--limit", "96"],
         "error: --limit is now --vcpus on this task: give --vcpus 96"),
        (["aoai.alerts", "--deployment", "d"],
         "error: aoai.alerts needs --account-id; see `gpufleet --help aoai.alerts`"),
        (["aoai.apim"], "error: aoai.apim needs --apim and --primary-url and --secondary-url; "
         "see `gpufleet --help aoai.apim`"),
        (["train.plan", "--model", "Llama-2-7b", "--batch", "abc"], "error: --batch 'abc': give a whole number"),
    ],
    ids=["quota.request --limit", "aoai.alerts", "aoai.apim", "train.plan --batch abc"],
)
def test_renamed_and_missing_flags_are_one_line_and_exit_2(program: list[str], argv: list[str], line: str) -> None:
    r = cli([*program, *argv])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [line]


def test_quota_request_takes_vcpus_and_no_printed_command_says_limit() -> None:
    request = dict(TASKS)["quota.request"]
    assert request.body.renamed == {"limit": "vcpus"}
    assert "vcpus" in {a.name for a in request.get_arguments()}
    import re

    for path in [*ROOT.glob("remediation/**/*.py"), *ROOT.glob("demo/*.py"), ROOT / "README.md"]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"quota\.request[^\n`]*--limit", text), path


def help_of_every_flag() -> dict[str, dict[str, list[str]]]:
    """task -> flag -> [value shown in --help, help text], from a fresh interpreter (Invoke hands a task's help
    strings out once: get_arguments pops them)."""
    import json

    code = (
        "import json\n"
        "from invoke.parser import ParserContext\n"
        "from commands.namespace import ns\n"
        "def walk(c, prefix=''):\n"
        "    for n, task in c.tasks.items():\n"
        "        yield prefix + n, task\n"
        "    for n, sub in c.collections.items():\n"
        "        yield from walk(sub, prefix + n + '.')\n"
        "out = {}\n"
        "for name, task in walk(ns):\n"
        "    ctx = ParserContext(name=name, args=task.get_arguments())\n"
        "    out[name] = {a.name: list(ctx.help_for('--' + a.name.replace('_', '-'))) for a in ctx.args.values()}\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                       check=True)
    return json.loads(r.stdout)  # type: ignore[no-any-return]


HELP = help_of_every_flag()


@pytest.mark.parametrize(("name", "task"), FORMAT_TASKS, ids=[name for name, _task in FORMAT_TASKS])
def test_every_format_help_is_worded_alike(name: str, task: Any) -> None:
    from commands import TEXT_FORMATS

    allowed = task.body.formats
    text = HELP[name]["format"][1]
    first = "text or table" if allowed[0] in TEXT_FORMATS else allowed[0]
    assert text.startswith(f"{first} (the default"), (name, text)
    assert "table |" not in text and "text |" not in text and " or json" not in text, (name, text)
    shown = [("text or table" if fmt in TEXT_FORMATS else fmt) for fmt in allowed]
    at = [text.index(label) for label in shown]
    assert at == sorted(at), (name, text)  # every name, in the order the task takes them


def test_whole_numbers_show_as_int_and_no_flag_is_nameless() -> None:
    for flag in ("batch", "seq_len", "grad_accum", "gpus", "zero_stage", "lora_r"):
        for task in ("train.plan", "train.diagnose-oom"):
            assert HELP[task][flag][0].endswith("=INT"), (task, flag, HELP[task][flag])
    assert HELP["train.monitor"]["count"][0] == "--count=INT"
    assert HELP["quota.request"]["vcpus"][0] == "--vcpus=INT"
    for task, flags in HELP.items():
        for flag, (spec, _text) in flags.items():
            assert not spec.startswith("--="), (task, flag, spec)
