"""``/var/log/apt/history.log`` text → :class:`AptHistory` (a tuple of :class:`AptTransaction`).

A transaction starts at ``Start-Date:`` (no blank line is needed between stanzas; a fragment that begins at
``Commandline:`` also opens one). Dates are normalised to ``YYYY-MM-DD HH:MM:SS`` whether apt wrote two spaces
after the date or a web page collapsed them to one. Package lists are split on the entries' parentheses, so commas
inside ``(old, new)`` and epochs (``1:15.0.6-3``) are kept in their version. Table residue (`` | |``) and trailing
spaces are ignored.

``actor`` comes from the ``Commandline:`` (``unattended-upgrade | apt | apt-get | packagekit | aptdaemon | dpkg |
unknown``). ``unattended-upgrade --dry-run`` writes an entry that looks real although nothing was installed:
such transactions carry ``dry_run=True`` and the helpers leave them out unless asked.

``/var/log/dpkg.log`` excerpts are read by the same parser, into the same transactions (``source="dpkg.log"``), in the
format dpkg(1) documents under FILES: ``YYYY-MM-DD HH:MM:SS startup type command`` (each ``startup`` line is one
dpkg invocation and opens a transaction), ``YYYY-MM-DD HH:MM:SS status state pkg installed-version``,
``YYYY-MM-DD HH:MM:SS action pkg installed-version available-version`` (action: install, upgrade, remove, purge,
configure, trigproc; ``<none>`` for a missing version) and ``YYYY-MM-DD HH:MM:SS conffile filename decision``.
``install`` becomes Install, ``upgrade`` Upgrade (Reinstall when both versions are the same), ``remove``/``purge``
Remove/Purge; configure, trigproc, status and conffile lines change no version and add no action (``status`` lines
give each package's last state, :attr:`AptTransaction.states`). dpkg.log names no actor: its transactions have
``actor="unknown"`` and no commandline, and the rules that need an actor (what unattended-upgrade installed) do not
count them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from remediation.core.parsers._text import split_lines

__all__ = [
    "ACTIONS",
    "ACTORS",
    "AptAction",
    "AptHistory",
    "AptTransaction",
    "is_kernel_package",
    "is_nvidia_package",
    "parse",
]

ACTIONS: tuple[str, ...] = ("Install", "Upgrade", "Remove", "Purge", "Downgrade", "Reinstall")
ACTORS: tuple[str, ...] = ("unattended-upgrade", "apt", "apt-get", "packagekit", "aptdaemon", "dpkg", "unknown")

_KERNEL_PREFIX = re.compile(
    r"^linux-(?:image|modules|headers|modules-extra|objects|signatures)(?:-unsigned)?-", re.ASCII
)
_KERNEL_META = re.compile(
    r"^linux-(?:generic|virtual|azure|aws|gcp|gke|oracle|kvm|lowlatency|oem|cloud-amd64|amd64|image|headers)"
    r"(?:-[A-Za-z0-9.+~-]+)?$",
    re.ASCII,
)
_NOT_KERNEL = re.compile(r"^linux-(?:tools|cloud-tools|libc-dev|firmware|base|source|doc|sound-base)", re.ASCII)
_NVIDIA = re.compile(r"nvidia|^cuda-drivers|^libcuda1|^libnvcuvid|^libnvoptix|^libxnvctrl", re.ASCII | re.I)
_KERNEL_VERSION = re.compile(r"^linux-(?:image|modules|headers)(?:-unsigned)?-([0-9]+\.[0-9]+[0-9A-Za-z.+~_-]*)$")


def is_nvidia_package(package: str) -> bool:
    """NVIDIA driver packages: nvidia-*, libnvidia-*, linux-modules-nvidia-*, cuda-drivers, libcuda1, ..."""
    return _NVIDIA.search(package) is not None


def is_kernel_package(package: str) -> bool:
    """linux-image-*/linux-modules-*/linux-headers-* and kernel meta packages; NVIDIA module packages excluded."""
    if is_nvidia_package(package) or _NOT_KERNEL.match(package) or "-tools" in package:
        return False
    return _KERNEL_PREFIX.match(package) is not None or _KERNEL_META.match(package) is not None


@dataclass(frozen=True)
class AptAction:
    action: str  # one of ACTIONS
    package: str
    arch: str | None
    version: str | None  # the version after the action (for Remove/Purge: the version removed)
    old_version: str | None  # Upgrade/Downgrade: the version before
    automatic: bool  # "automatic": installed as a dependency

    @property
    def is_kernel(self) -> bool:
        return is_kernel_package(self.package)

    @property
    def is_nvidia(self) -> bool:
        return is_nvidia_package(self.package)

    @property
    def kernel_release(self) -> str | None:
        """The release a versioned kernel package is for: ``linux-image-6.5.0-44-generic`` → ``6.5.0-44-generic``."""
        m = _KERNEL_VERSION.match(self.package)
        return m.group(1) if m else None


@dataclass(frozen=True)
class AptTransaction:
    start: str | None  # "YYYY-MM-DD HH:MM:SS"
    end: str | None
    commandline: str | None
    actor: str  # one of ACTORS
    requested_by: str | None  # "username (1000)"
    actions: tuple[AptAction, ...]
    dry_run: bool = False
    error: str | None = None
    text: tuple[str, ...] = ()  # the stanza's lines
    source: str = "history.log"  # "history.log" | "dpkg.log"
    states: tuple[tuple[str, str], ...] = ()  # dpkg.log: (package, last "status" state), in order of first mention

    def kernel_installs(self) -> tuple[AptAction, ...]:
        """Kernel packages installed, upgraded, reinstalled or downgraded in this transaction."""
        return tuple(a for a in self.actions if a.is_kernel and a.action not in ("Remove", "Purge"))

    def nvidia_changes(self) -> tuple[AptAction, ...]:
        """Every action on an NVIDIA package in this transaction."""
        return tuple(a for a in self.actions if a.is_nvidia)


@dataclass(frozen=True)
class AptHistory:
    transactions: tuple[AptTransaction, ...]

    def kernel_installs(self, include_dry_runs: bool = False) -> tuple[tuple[AptTransaction, AptAction], ...]:
        """``(transaction, action)`` for every kernel package installed; dry runs left out unless asked."""
        return tuple(
            (t, a) for t in self.transactions if include_dry_runs or not t.dry_run for a in t.kernel_installs()
        )

    def nvidia_changes(self, include_dry_runs: bool = False) -> tuple[tuple[AptTransaction, AptAction], ...]:
        """``(transaction, action)`` for every NVIDIA package change; dry runs left out unless asked."""
        return tuple((t, a) for t in self.transactions if include_dry_runs or not t.dry_run for a in t.nvidia_changes())


_KEY = re.compile(
    r"^\s*(?P<key>Start-Date|End-Date|Commandline|Requested-By|Install|Upgrade|Remove|Purge|Downgrade|Reinstall"
    r"|Error)\s*:\s?(?P<value>.*)$",
    re.ASCII,
)
_DATE = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})\s+([0-9]{2}:[0-9]{2}:[0-9]{2})", re.ASCII)
_ENTRY = re.compile(r"(?<![^\s,():])(?P<pkg>[^\s,():]+)(?::(?P<arch>[^\s,():]+))?\s*\((?P<inner>[^()]*)\)", re.ASCII)
# dpkg(1), FILES, /var/log/dpkg.log: "YYYY-MM-DD HH:MM:SS" then startup / status / an action / conffile.
_DPKG_LINE = re.compile(
    r"^\s*(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2}) (?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2}) "
    r"(?P<what>startup|status|install|upgrade|remove|purge|configure|trigproc|conffile) (?P<rest>\S.*)$",
    re.ASCII,
)
_DPKG_ACTIONS = {"install": "Install", "upgrade": "Upgrade", "remove": "Remove", "purge": "Purge"}
_DRY_RUN = re.compile(r"(?:^|\s)(?:--dry-run|--simulate|--just-print|--no-act|--recon)(?:[\s=]|$)", re.ASCII)
_ACTOR_BY_NAME: dict[str, str] = {
    "unattended-upgrade": "unattended-upgrade",
    "unattended-upgrades": "unattended-upgrade",
    "apt": "apt",
    "apt-get": "apt-get",
    "packagekit": "packagekit",
    "packagekitd": "packagekit",
    "aptdaemon": "aptdaemon",
    "dpkg": "dpkg",
}


def _actor(commandline: str | None) -> str:
    if not commandline:
        return "unknown"
    tokens = commandline.split()
    names = [t.rsplit("/", 1)[-1].lower() for t in tokens]
    if any(n in ("unattended-upgrade", "unattended-upgrades") for n in names):
        return "unattended-upgrade"
    for name in names:
        if name.startswith("python"):
            continue
        return _ACTOR_BY_NAME.get(name, "unknown")
    return "unknown"


def _date(value: str | None) -> str | None:
    if value is None:
        return None
    m = _DATE.search(value)
    return f"{m.group(1)} {m.group(2)}" if m else (value.strip() or None)


def _actions(action: str, value: str) -> list[AptAction]:
    out: list[AptAction] = []
    for m in _ENTRY.finditer(value):
        parts = [p.strip() for p in m.group("inner").split(",")]
        automatic = "automatic" in parts
        versions = [p for p in parts if p and p != "automatic"]
        old: str | None = None
        new: str | None = None
        if action in ("Upgrade", "Downgrade") and len(versions) >= 2:
            old, new = versions[0], versions[1]
        elif versions:
            new = versions[0]
        out.append(AptAction(action, m.group("pkg"), m.group("arch"), new, old, automatic))
    return out


class _Stanza:
    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.order: list[str] = []
        self.lines: list[str] = []

    def build(self) -> AptTransaction:
        actions: list[AptAction] = []
        for key in self.order:
            if key in ACTIONS:
                actions.extend(_actions(key, self.fields[key]))
        commandline = self.fields.get("Commandline")
        commandline = commandline.strip() if commandline else None
        requested = self.fields.get("Requested-By")
        error = self.fields.get("Error")
        return AptTransaction(
            start=_date(self.fields.get("Start-Date")),
            end=_date(self.fields.get("End-Date")),
            commandline=commandline or None,
            actor=_actor(commandline),
            requested_by=requested.strip() if requested and requested.strip() else None,
            actions=tuple(actions),
            dry_run=bool(commandline and _DRY_RUN.search(commandline)),
            error=error.strip() if error and error.strip() else None,
            text=tuple(self.lines),
        )


class _DpkgRun:
    """One dpkg invocation as dpkg.log shows it (from a ``startup`` line, or from the fragment's first line)."""

    def __init__(self) -> None:
        self.start: str | None = None
        self.end: str | None = None
        self.startup: str | None = None
        self.actions: list[AptAction] = []
        self.states: dict[str, str] = {}
        self.lines: list[str] = []

    def add(self, m: re.Match[str], line: str) -> None:
        when = f"{m.group('date')} {m.group('time')}"
        self.start = self.start or when
        self.end = when
        self.lines.append(line.strip())
        what, fields = m.group("what"), m.group("rest").split()
        if what == "startup":
            self.startup = self.startup or " ".join(fields)
        elif what == "status" and len(fields) >= 2:
            self.states[_dpkg_name(fields[1])[0]] = fields[0]
        elif what in _DPKG_ACTIONS and len(fields) >= 3:
            package, arch = _dpkg_name(fields[0])
            installed, available = (None if v == "<none>" else v for v in fields[1:3])
            action = _DPKG_ACTIONS[what]
            if action == "Upgrade" and installed is not None and installed == available:
                action = "Reinstall"
            if action in ("Remove", "Purge"):
                self.actions.append(AptAction(action, package, arch, installed, None, False))
            elif action == "Upgrade":
                self.actions.append(AptAction(action, package, arch, available, installed, False))
            else:
                self.actions.append(AptAction(action, package, arch, available, None, False))

    def build(self) -> AptTransaction:
        return AptTransaction(
            start=self.start,
            end=self.end,
            commandline=None,
            actor="unknown",
            requested_by=None,
            actions=tuple(self.actions),
            text=tuple(self.lines),
            source="dpkg.log",
            states=tuple(self.states.items()),
        )


def _dpkg_name(field: str) -> tuple[str, str | None]:
    package, _, arch = field.partition(":")
    return package, arch or None


def parse(text: str) -> AptHistory:
    """Parse apt history (and dpkg.log) text. Never raises; lines that are neither are ignored."""
    stanzas: list[_Stanza | _DpkgRun] = []
    current: _Stanza | None = None
    dpkg: _DpkgRun | None = None
    last_key: str | None = None
    for line in split_lines(text):
        d = _DPKG_LINE.match(line)
        if d is not None:
            if dpkg is None or (d.group("what") == "startup" and (dpkg.actions or dpkg.startup)):
                dpkg = _DpkgRun()
                stanzas.append(dpkg)
            dpkg.add(d, line)
            current, last_key = None, None
            continue
        m = _KEY.match(line)
        if m is None:
            # a wrapped package list continues the previous field
            continued = current is not None and last_key in ACTIONS and line.strip()
            if (
                continued
                and current is not None
                and last_key is not None
                and (_ENTRY.search(line) or "(" in line or not current.fields[last_key].rstrip().endswith(")"))
            ):
                current.fields[last_key] += " " + line.strip()
                current.lines.append(line.strip())
            elif not line.strip():
                last_key = None
            continue
        key, value = m.group("key"), m.group("value").strip()
        opens = key == "Start-Date" or current is None or (key == "Commandline" and "Commandline" in current.fields)
        if opens:
            current = _Stanza()
            stanzas.append(current)
            dpkg = None
        assert current is not None
        if key in current.fields and key in ACTIONS:
            current.fields[key] += ", " + value
        elif key not in current.fields:
            current.fields[key] = value
            current.order.append(key)
        current.lines.append(line.strip())
        last_key = key
        if key == "End-Date":
            current = None
            last_key = None
    transactions = tuple(s.build() for s in stanzas)
    return AptHistory(
        tuple(
            t
            for t in transactions
            if ((t.actions or t.states) if t.source == "dpkg.log" else (t.start or t.commandline or t.actions))
        )
    )
