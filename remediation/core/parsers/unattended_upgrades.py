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
    # the lines that show what the run did, in any of the log's languages: its start, its blacklist, what it will
    # upgrade, how it ended
    key_lines: tuple[str, ...] = ()

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
# The messages in the program's translations (gettext, so a run under LANG=de_DE.UTF-8 logs them in German), as its
# po files have them: mvo5/unattended-upgrades po/de.po, po/es.po, po/pt_BR.po (unattended-upgrades 0.8x, POT
# 2015-07-02) and po/fr.po (POT 2009-07-03; 2008 revision: "mise à jour" where the later one says "mise à niveau").
# Entries marked fuzzy there are not compiled into the catalogue, so those messages stay in English and are not
# listed. "Package X is blacklisted / held back / kept back" and the dry-run messages are not in those po files.
_START = re.compile(
    r"^(?:Starting unattended upgrades script|Skript für unbeaufsichtigte Upgrades wird gestartet"
    r"|Démarrage du script de mise à (?:niveau|jour) automatique|Iniciando guión de actualizaciones desatendidas"
    r"|Iniciando o script da atualização desacompanhada)"
)
_PRELUDE = re.compile(r"^Checking if (?:system is running on battery|connection is metered)", _A)
_ORIGINS = re.compile(
    r"^(?:Allowed origins are|erlaubte Ursprünge sind|Les origines permises sont|Fuentes permitidas"
    r"|São origens permitidas)\s*:\s*(?P<v>.*)$",
    re.I,
)
_BLACKLIST = re.compile(
    r"^(?:Initial blacklist(?:ed packages)?|Pakete, die anfangs auf die schwarzen Liste standen"
    r"|Paquets initialement sur la liste noire|Paquetes bloqueados inicialmente|Pacotes inicialmente na lista negra)"
    r"\s*:\s*(?P<v>.*)$"
)
_WHITELIST = re.compile(
    r"^(?:Initial whitelist(?:ed packages)?(?:\s*\((?:not )?strict\))?|Paquetes permitidos inicialmente)"
    r"\s*:\s*(?P<v>.*)$"
)
_UPGRADE = re.compile(
    r"^(?:Packages that will be upgraded|Pakete, von denen ein Upgrade durchgeführt wird"
    r"|Paquetes que se actualizarán)\s*:\s*(?P<v>.*)$"
)
# The report unattended-upgrades mails: "Packages that were upgraded:" and the names on the next, indented line
# (0.x logged "Packages that are upgraded: a b" and mailed the same header; fr and pt_BR translate that one).
_MAIL_LIST = re.compile(
    r"^(?P<h>Packages (?:that were upgraded|that are upgraded|that attempted to upgrade"
    r"|with upgradable origin but (?P<k1>kept back))|Pakete, von denen ein Upgrade durchgeführt wurde"
    r"|Pakete, bei denen versucht wurde, ein Upgrade durchzuführen|Paquets mis à (?:niveau|jour)"
    r"|Paquetes que se (?:actualizaron|intentaron actualizar)|Pacotes atualizados"
    r"|(?P<k2>Paquets susceptibles d'une mise à niveau mais maintenus dans leur état actuel"
    r"|Paquetes con una actualización disponible en la fuente pero que no se actualizarán"
    r"|Pacotes atualizáveis na origem mas mantidos na versão atual))\s*:\s*(?P<v>.*)$"
)
_REMOVED = re.compile(
    r"^(?:Packages that were successfully auto-removed|Packages that are auto removed|Removing unused kernel "
    r"packages|Pakete, die automatisch entfernt wurden|Paquetes eliminados de forma automática"
    r"|Pacotes autorremovidos)\s*:\s*(?P<v>.*)$"
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
_CONFFILE = re.compile(
    r"^(?:Package (?P<p>\S+) has conffile prompt|Das Paket »(?P<de>[^«\s]+)« hat eine Conffile-Abfrage"
    r"|Le paquet [«']\s*(?P<fr>[^»'\s]+)\s*[»'] provoque un conflit de fichiers de configuration"
    r"|El paquete «(?P<es>[^»\s]+)» solicita confirmación|O pacote '(?P<pt>[^'\s]+)' possui um diálogo conffile)"
)
_DRY_RUN = re.compile(r"^Option --dry-run given|can't be calculated in dry-run mode", _A)
_INSTALLED = re.compile(
    r"^(?:All upgrades installed|alle Upgrades installiert|Toutes les mises à (?:niveau|jour) ont été installées"
    r"|Se han instalado todas las actualizaciones|Todas as atualizações instaladas)",
    re.I,
)
_FAILED = re.compile(
    r"^(?:Installing the upgrades failed|Installation der Upgrades fehlgeschlagen"
    r"|Échec de l'installation des mises à (?:niveau|jour)|Fallo al instalar actualizaciones"
    r"|A instalação das atualizações falhou)"
)
_NOTHING = re.compile(
    r"^(?:No packages found that can be upgraded unattended|Aucun paquet à mettre à (?:niveau|jour) automatiquement"
    r"|No se encontraron paquetes que puedan actualizarse de forma desatendida)"
)
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
        self.key: list[str] = []
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
            key_lines=tuple(self.key),
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
    for raw in _unquote(split_lines(text)):
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
            if _START.match(msg) or _BLACKLIST.match(msg):
                current.key.append(line)
            continue
        if (w := _WHITELIST.match(msg)) is not None:
            current.whitelist = _words(w.group("v"))
        elif (u := _UPGRADE.match(msg)) is not None:
            current.packages.extend(_words(u.group("v")))
            current.key.append(line)
        elif (m := _MAIL_LIST.match(msg)) is not None:
            kind = "kept" if m.group("k1") or m.group("k2") else "upgraded"
            if m.group("v").strip():
                names = _words(m.group("v"))
                if kind == "upgraded":
                    current.packages.extend(names)
                    current.key.append(line)  # 0.x's "Packages that are upgraded: a b" (fr, pt_BR translate it)
                else:
                    current.kept.extend(KeptBack(n, "kept back", line) for n in names)
            else:
                pending = kind
        elif (r := _REMOVED.match(msg)) is not None:
            current.removed.extend(_words(r.group("v")))
        elif (c := _CONFFILE.match(msg)) is not None:
            current.conffile.append(next(v for v in c.group("p", "de", "fr", "es", "pt") if v))
        elif (d := _DEBUG_BLACKLISTED.match(msg)) is not None:
            current.kept.append(KeptBack(d.group("a") or d.group("b"), "blacklisted", line))
        elif _DRY_RUN.search(msg):
            current.dry_run = True
        elif _INSTALLED.match(msg):
            current.result = "installed"
            current.key.append(line)
        elif _FAILED.match(msg):
            current.result = "failed"
            current.key.append(line)
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


def _unquote(lines: list[str]) -> list[str]:
    """Lines as the program wrote them, when a ticket or an e-mail quoted them: a ``>`` quote marker that every
    non-empty line carries is taken off (with the one space after it), then the indentation they all share, so the
    prefixes match again and a mailed list's names stay indented below their header."""
    filled = [line for line in lines if line.strip()]
    if filled and all(line.lstrip().startswith(">") for line in filled):
        lines = [_drop_marker(line) for line in lines]
        filled = [line for line in lines if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in filled), default=0)
    return [line[indent:] for line in lines] if indent else lines


def _drop_marker(line: str) -> str:
    rest = line.lstrip().lstrip(">")
    return rest[1:] if rest.startswith(" ") else rest


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
