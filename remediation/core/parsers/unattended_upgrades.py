"""``/var/log/unattended-upgrades/unattended-upgrades.log`` → :class:`UnattendedLog` (a tuple of :class:`UuRun`).

The grammar is unattended-upgrades' own logging (checked against ``/usr/bin/unattended-upgrade`` 2.9.1, Debian 12,
and the older wording of 0.8x/1.x): each line is ``YYYY-MM-DD HH:MM:SS,mmm LEVEL message`` in the log file, a bare
``message`` on a terminal (``-v``/``-d``), or ``unattended-upgrade[PID]: message`` in syslog/journal. A run starts at
"Starting unattended upgrades script" (a fragment that starts later opens one at its first line, and a second
"Allowed origins are:" or "Initial blacklist:" opens the next). Messages read:

- ``Allowed origins are: o=Debian,a=stable, o=Debian,a=stable-updates`` (entries joined by ", "; old versions print
  a Python list ``['o=Ubuntu,a=bionic', ...]``);
- ``Initial blacklist: linux-image nvidia-`` (old: ``Initial blacklisted packages: ...``), ``Initial whitelist (not
  strict): ...`` (old: ``Initial whitelisted packages: ...``): entries joined by spaces, possibly none;
- ``Packages that will be upgraded: a b c`` (the mailed report: ``Packages that were upgraded:`` with the names on
  the next, indented line; ``Packages with upgradable origin but kept back:``); ``Removing unused kernel packages:
  ...``, ``Packages that were
  successfully auto-removed: ...`` (old: ``Packages that are auto removed: '...'``), ``Packages that are kept
  back: ...`` (kept from being auto-removed);
- why a package was kept back: ``Package X is blacklisted.``, ``Package X is marked to be held back.``, ``Package X
  is not on the strict whitelist.``, ``Package X is not whitelisted and ...``, ``Package X's origin is not
  trusted.``, ``Package X is kept back because a related package is kept back ...``; with ``-d`` also ``skipping
  blacklisted package X``, ``pkg X package has been blacklisted``, ``pkg X is on hold``;
- the outcome: ``All upgrades installed``, ``Installing the upgrades failed!`` (with ``error message: ...`` and
  ``dpkg returned a error! See ... for details``), ``No packages found that can be upgraded unattended and no pending
  auto-removals``; ``Package X has conffile prompt and needs to be upgraded manually``; ``Lock could not be
  acquired (another package manager running?)``, ``Cache has broken packages, exiting``, ERROR lines;
- ``Option --dry-run given, *not* performing real actions`` and ``The list of kept packages can't be calculated in
  dry-run mode.`` mark a dry run: nothing was installed.

Kernel and NVIDIA packages are recognised with apt history's classification
(:func:`~remediation.core.parsers.apt_history.is_kernel_package`,
:func:`~remediation.core.parsers.apt_history.is_nvidia_package`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from remediation.core.parsers._text import split_lines, unique
from remediation.core.parsers.apt_history import is_kernel_package, is_nvidia_package

__all__ = ["KeptBack", "UnattendedLog", "UuRun", "parse"]


@dataclass(frozen=True)
class KeptBack:
    package: str
    reason: str  # "blacklisted" | "held" | "not whitelisted" | "origin not trusted" | "related package kept back"
    text: str


@dataclass(frozen=True)
class UuRun:
    """One run of ``unattended-upgrade`` as its log shows it; ``None``: the log does not say."""

    start: str | None  # "YYYY-MM-DD HH:MM:SS" of the run's first line
    allowed_origins: tuple[str, ...] | None
    blacklist: tuple[str, ...] | None
    whitelist: tuple[str, ...] | None
    packages: tuple[str, ...]  # "Packages that will be upgraded"
    removed: tuple[str, ...]
    kept_back: tuple[KeptBack, ...]
    conffile_prompts: tuple[str, ...]
    dry_run: bool
    result: str | None  # "installed" | "failed" | "nothing to do" | None (not in the log)
    errors: tuple[str, ...]
    text: tuple[str, ...]  # the run's lines as they appear

    @property
    def kernel_packages(self) -> tuple[str, ...]:
        return tuple(p for p in self.packages if is_kernel_package(p))

    @property
    def nvidia_packages(self) -> tuple[str, ...]:
        return tuple(p for p in self.packages if is_nvidia_package(p))

    @property
    def installed(self) -> bool:
        """Packages were (or were attempted to be) installed for real: not a dry run, something to upgrade."""
        return not self.dry_run and bool(self.packages) and self.result != "nothing to do"

    def lines_with(self, *needles: str) -> tuple[str, ...]:
        return tuple(line for line in self.text if any(n in line for n in needles))


@dataclass(frozen=True)
class UnattendedLog:
    runs: tuple[UuRun, ...] = field(default_factory=tuple)

    @property
    def is_empty(self) -> bool:
        return not self.runs

    @property
    def packages(self) -> tuple[str, ...]:
        return unique(p for r in self.runs for p in r.packages)

    @property
    def kernel_packages(self) -> tuple[str, ...]:
        return tuple(p for p in self.packages if is_kernel_package(p))

    @property
    def nvidia_packages(self) -> tuple[str, ...]:
        return tuple(p for p in self.packages if is_nvidia_package(p))

    @property
    def blacklist(self) -> tuple[str, ...] | None:
        """The blacklist of the newest run that logs one (the configuration now, as far as the log knows)."""
        for run in reversed(self.runs):
            if run.blacklist is not None:
                return run.blacklist
        return None

    @property
    def allowed_origins(self) -> tuple[str, ...] | None:
        for run in reversed(self.runs):
            if run.allowed_origins is not None:
                return run.allowed_origins
        return None

    @property
    def blacklisted_packages(self) -> tuple[str, ...]:
        return unique(k.package for r in self.runs for k in r.kept_back if k.reason == "blacklisted")

    @property
    def held_packages(self) -> tuple[str, ...]:
        return unique(k.package for r in self.runs for k in r.kept_back if k.reason == "held")


_A = re.ASCII
_FILE_PREFIX = re.compile(
    r"^(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[ T](?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})(?:[,.][0-9]+)?\s+"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+",
    _A,
)
_SYSLOG_PREFIX = re.compile(
    r"^(?:(?:[A-Z][a-z]{2}\s+[0-9]{1,2}\s+[0-9:]{8}|[0-9]{4}-[0-9]{2}-[0-9]{2}T\S+)\s+\S+\s+)?"
    r"unattended-upgrades?(?:-shutdown)?(?:\[[0-9]+\])?:\s+",
    _A,
)
_START = re.compile(r"^Starting unattended upgrades script", _A)
_PRELUDE = re.compile(r"^Checking if (?:system is running on battery|connection is metered)", _A)
_ORIGINS = re.compile(r"^Allowed origins are:\s*(?P<v>.*)$", _A)
_BLACKLIST = re.compile(r"^Initial blacklist(?:ed packages)?\s*:\s*(?P<v>.*)$", _A)
_WHITELIST = re.compile(r"^Initial whitelist(?:ed packages)?(?:\s*\((?:not )?strict\))?\s*:\s*(?P<v>.*)$", _A)
_UPGRADE = re.compile(r"^Packages that will be upgraded:\s*(?P<v>.*)$", _A)
# The report unattended-upgrades mails: "Packages that were upgraded:" and the names on the next, indented line.
_MAIL_LIST = re.compile(
    r"^Packages (?:that were upgraded|that attempted to upgrade|with upgradable origin but kept back):\s*(?P<v>.*)$", _A
)
_REMOVED = re.compile(
    r"^(?:Packages that were successfully auto-removed|Packages that are auto removed|Removing unused kernel "
    r"packages)\s*:\s*(?P<v>.*)$",
    _A,
)
_EXCUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Package (?P<p>\S+) is blacklisted\.?$", _A), "blacklisted"),
    (re.compile(r"^Package (?P<p>\S+) is marked to be held back\.?$", _A), "held"),
    (re.compile(r"^pkg (?P<p>\S+) is on hold$", _A), "held"),
    (re.compile(r"^Package (?P<p>\S+) is not (?:on the strict whitelist|whitelisted)\b", _A), "not whitelisted"),
    (re.compile(r"^Package (?P<p>\S+?)'s origin is not trusted", _A), "origin not trusted"),
    (re.compile(r"^Package (?P<p>\S+) is kept back because", _A), "related package kept back"),
)
_DEBUG_BLACKLISTED = re.compile(
    r"^(?:skipping blacklisted package (?P<a>\S+)|pkg (?P<b>\S+) package has been blacklisted)$", _A
)
_CONFFILE = re.compile(r"^Package (?P<p>\S+) has conffile prompt", _A)
_DRY_RUN = re.compile(r"^Option --dry-run given|can't be calculated in dry-run mode", _A)
_INSTALLED = re.compile(r"^All upgrades installed", _A)
_FAILED = re.compile(r"^Installing the upgrades failed", _A)
_NOTHING = re.compile(r"^No packages found that can be upgraded unattended", _A)
_ERROR_TEXT = re.compile(
    r"^(?:error message:|dpkg returned a?n? error|Lock could not be acquired|Cache has broken packages"
    r"|Apt returned an error|An error occurred|The URI .* failed to download|Auto-removing the packages failed"
    r"|package \S+ upgradable but fails to be marked)",
    _A | re.I,
)
_DATE_TIME = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})[ T]([0-9]{2}:[0-9]{2}:[0-9]{2})", _A)


def _words(value: str) -> tuple[str, ...]:
    value = value.strip().strip("'\"")
    return tuple(w.strip("'\",") for w in value.split() if w.strip("'\","))


def _origins(value: str) -> tuple[str, ...]:
    value = value.strip()
    if value.startswith("["):
        return tuple(re.findall(r"'([^']*)'", value)) or tuple(re.findall(r'"([^"]*)"', value))
    return tuple(o.strip() for o in re.split(r",\s+", value) if o.strip())


class _Run:
    """A run being read."""

    def __init__(self, start: str | None) -> None:
        self.start = start
        self.origins: tuple[str, ...] | None = None
        self.blacklist: tuple[str, ...] | None = None
        self.whitelist: tuple[str, ...] | None = None
        self.packages: list[str] = []
        self.removed: list[str] = []
        self.kept: list[KeptBack] = []
        self.conffile: list[str] = []
        self.dry_run = False
        self.result: str | None = None
        self.errors: list[str] = []
        self.text: list[str] = []
        self.started = False

    def acted(self) -> bool:
        """The run got past its configuration lines (it listed, kept back, removed or finished something)."""
        return bool(self.packages or self.result or self.kept or self.removed or self.dry_run)

    def freeze(self) -> UuRun:
        kept: list[KeptBack] = []
        for k in self.kept:
            if not any(x.package == k.package and x.reason == k.reason for x in kept):
                kept.append(k)
        return UuRun(
            start=self.start,
            allowed_origins=self.origins,
            blacklist=self.blacklist,
            whitelist=self.whitelist,
            packages=unique(self.packages),
            removed=unique(self.removed),
            kept_back=tuple(kept),
            conffile_prompts=unique(self.conffile),
            dry_run=self.dry_run,
            result=self.result,
            errors=tuple(self.errors),
            text=tuple(self.text),
        )


def _message(line: str) -> tuple[str | None, str | None, str]:
    """(date-time, level, message) of one log line, whatever its prefix."""
    m = _FILE_PREFIX.match(line)
    if m:
        return f"{m.group('date')} {m.group('time')}", m.group("level"), line[m.end() :].strip()
    s = _SYSLOG_PREFIX.match(line)
    if s:
        dt = _DATE_TIME.search(line[: s.end()])
        return (f"{dt.group(1)} {dt.group(2)}" if dt else None), None, line[s.end() :].strip()
    return None, None, line.strip()


def parse(text: str) -> UnattendedLog:
    """Parse unattended-upgrades' log. Never raises; text of another kind gives an empty :class:`UnattendedLog`."""
    runs: list[UuRun] = []
    run: _Run | None = None
    last_time: str | None = None

    def new_run(start: str | None) -> _Run:
        nonlocal run
        if run is not None and (run.started or run.text):
            runs.append(run.freeze())
        run = _Run(start)
        return run

    pending: str | None = None  # the mail report's list header whose packages follow on the next, indented line
    for raw in split_lines(text):
        if not raw.strip():
            continue
        if pending is not None and raw[:1].isspace() and run is not None:
            names = _words(raw)
            if pending == "upgraded":
                run.packages.extend(names)
            else:
                run.kept.extend(KeptBack(n, "kept back", raw.strip()) for n in names)
            run.text.append(raw.strip())
            pending = None
            continue
        pending = None
        when, level, msg = _message(raw)
        last_time = when or last_time
        line = raw.strip()
        known = True
        current: _Run | None
        if _START.match(msg) or _PRELUDE.match(msg):
            # A new run, unless the current one has only what comes before this line so far: 2.x checks battery and
            # metered connection first, 0.x/1.x logged the initial black/whitelist before "Starting ...".
            current = run if run is not None and not run.started and not run.acted() else new_run(when)
            current.started = current.started or _START.match(msg) is not None
        elif (o := _ORIGINS.match(msg)) is not None:
            current = run if run is not None and run.origins is None else new_run(when)
            current.origins = _origins(o.group("v"))
        elif (b := _BLACKLIST.match(msg)) is not None:
            current = run if run is not None and run.blacklist is None else new_run(when)
            current.blacklist = _words(b.group("v"))
        else:
            current = run if run is not None else None
            known = False
        if current is None:
            current = new_run(when)
        if known:
            current.text.append(line)
            continue
        if (w := _WHITELIST.match(msg)) is not None:
            current.whitelist = _words(w.group("v"))
        elif (u := _UPGRADE.match(msg)) is not None:
            current.packages.extend(_words(u.group("v")))
        elif (m := _MAIL_LIST.match(msg)) is not None:
            kind = "kept" if "kept back" in m.group(0) else "upgraded"
            if m.group("v").strip():
                names = _words(m.group("v"))
                if kind == "upgraded":
                    current.packages.extend(names)
                else:
                    current.kept.extend(KeptBack(n, "kept back", line) for n in names)
            else:
                pending = kind
        elif (r := _REMOVED.match(msg)) is not None:
            current.removed.extend(_words(r.group("v")))
        elif (c := _CONFFILE.match(msg)) is not None:
            current.conffile.append(c.group("p"))
        elif (d := _DEBUG_BLACKLISTED.match(msg)) is not None:
            current.kept.append(KeptBack(d.group("a") or d.group("b"), "blacklisted", line))
        elif _DRY_RUN.search(msg):
            current.dry_run = True
        elif _INSTALLED.match(msg):
            current.result = "installed"
        elif _FAILED.match(msg):
            current.result = "failed"
            current.errors.append(msg)
        elif _NOTHING.match(msg):
            current.result = current.result or "nothing to do"
        else:
            matched = False
            for pattern, reason in _EXCUSES:
                e = pattern.match(msg)
                if e is not None:
                    current.kept.append(KeptBack(e.group("p"), reason, line))
                    matched = True
                    break
            if not matched and (level in ("ERROR", "CRITICAL") or _ERROR_TEXT.match(msg)):
                current.errors.append(msg)
            elif not matched and level is None and when is None and not _looks_like_uu(msg):
                continue  # terminal noise between log lines (dpkg output of -v): not part of the run's text
        current.text.append(line)
        if current.start is None:
            current.start = last_time
    if run is not None and (run.started or run.text):
        runs.append(run.freeze())
    return UnattendedLog(tuple(r for r in runs if _meaningful(r)))


_UU_WORDS = re.compile(
    r"unattended|upgrad|blacklist|whitelist|origin|dpkg log|conffile|auto-remov|kept back|held back|dry-run", re.I
)


def _looks_like_uu(msg: str) -> bool:
    return _UU_WORDS.search(msg) is not None


def _meaningful(run: UuRun) -> bool:
    return bool(
        run.allowed_origins is not None
        or run.blacklist is not None
        or run.packages
        or run.removed
        or run.kept_back
        or run.result
        or run.dry_run
        or any(_START.match(_message(line)[2]) for line in run.text)
    )
