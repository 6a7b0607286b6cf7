"""This audit against the previous one: which findings are new, resolved, persisting, or unknown.

:func:`save` keeps every run as ``audit-<fleet>-<YYYYmmddTHHMMSSffffff>Z.json`` (schema
``gpufleet.audit/1``, see :mod:`remediation.report.json_report`); :func:`load_previous` reads the newest one of a
fleet and :func:`compare` sets it against the current :class:`~remediation.host.audit.AuditResult`.

Identity of a finding across runs: ``(host, finding ID, discriminator)``. The discriminator names the *unit* a
finding is about, taken from its summary: the GPU index (``GPU 2 (0000…)`` -> ``gpu=2``), else a GPU's PCI bus
id (``GPU 0004:00:00.0 fell off the bus`` -> ``pci=0004:00:00.0``), and the Xid code with the PCI id it was
reported on (``Xid 63 on 0000:00:00`` -> ``xid=63,pci=0000:00:00``). It never includes a measurement or a
version (temperature, error counts, driver version, kernel release), so "GPU 1 at 86 °C" one night and "GPU 1
at 88 °C" the next is one finding persisting, and a second hot GPU is a new finding. Findings without a unit
(driver, kernel, apt) are one per host and ID.

Never resolved without looking: findings of the previous run on a host that this run could not probe (or that
is no longer in the selection) are *unknown*, not resolved. Findings on a host that the previous run could not
probe (or did not have) are reported as new, and :attr:`Comparison.hosts_not_probed_before` says which hosts
that applies to.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remediation.core.durable import write_atomic
from remediation.core.errors import RemediationError
from remediation.core.findings import Finding

if TYPE_CHECKING:
    from rich.console import Console

    from remediation.host.audit import AuditResult

__all__ = [
    "Comparison",
    "HistoryError",
    "Key",
    "compare",
    "discriminator",
    "finding_key",
    "load_previous",
    "render_comparison",
    "save",
]

SCHEMA_PREFIX = "gpufleet.audit/"
SCHEMA_MAJOR = 1

_FILE = re.compile(r"^audit-(?P<fleet>.+)-(?P<stamp>\d{8}T\d{6}\d{0,6}Z)\.json$")
_GPU_INDEX = re.compile(r"\bGPU (\d{1,3})(?![\d:.])\b")
_GPU_PCI = re.compile(r"\bGPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")
_XID = re.compile(r"\bXid (\d+)(?: on ([0-9A-Fa-f]{2,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?))?")

Key = tuple[str, str, str]  # (host, finding id, discriminator)


class HistoryError(RemediationError):
    """A saved audit could not be read (the file is named)."""


def discriminator(f: Finding) -> str:
    """The unit a finding is about, from its summary (see the module docstring); ``""`` when there is none."""
    parts: list[str] = []
    if m := _GPU_INDEX.search(f.summary):
        parts.append(f"gpu={m.group(1)}")
    elif m := _GPU_PCI.search(f.summary):
        parts.append(f"pci={m.group(1).lower()}")
    if m := _XID.search(f.summary):
        parts.append(f"xid={m.group(1)}")
        if m.group(2) and not any(p.startswith("pci=") for p in parts):
            parts.append(f"pci={m.group(2).lower()}")
    return ",".join(parts)


def finding_key(host: str, f: Finding) -> Key:
    return (host, f.id, discriminator(f))


def _stamp_of(path: Path, fleet: str) -> str | None:
    m = _FILE.match(path.name)
    if m is None or m.group("fleet") != fleet:
        return None
    return m.group("stamp")


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HistoryError(f"saved audit {path}: unreadable ({exc})") from exc
    if not isinstance(doc, dict):
        raise HistoryError(f"saved audit {path}: not a JSON object")
    schema = doc.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise HistoryError(f"saved audit {path}: not a gpufleet audit (schema {schema!r})")
    major = schema[len(SCHEMA_PREFIX) :].split(".", 1)[0]
    if major != str(SCHEMA_MAJOR):
        raise HistoryError(
            f"saved audit {path}: schema {schema!r}, this controller reads {SCHEMA_PREFIX}{SCHEMA_MAJOR}"
        )
    if not isinstance(doc.get("hosts"), list):
        raise HistoryError(f"saved audit {path}: 'hosts' must be a list")
    return doc


def _started(doc: Mapping[str, Any]) -> _dt.datetime | None:
    value = doc.get("started_at")
    if not isinstance(value, str):
        return None
    try:
        stamp = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.UTC)


def _warn_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def load_previous(
    directory: Path,
    fleet: str,
    *,
    before: _dt.datetime | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """The newest readable saved audit of ``fleet`` in ``directory`` (optionally: started before ``before``), or None.

    Only files named exactly ``audit-<fleet>-<stamp>.json`` count (fleet ``gpu`` does not pick up
    ``audit-gpu-a100-…``). A file that is unreadable, not a ``gpufleet.audit/1`` document of this fleet, or has a
    finding that cannot be read is skipped with one warning line naming it (``warn``, default: stderr), so one
    corrupt file never stops the audit nor the saving of the next run.
    """
    if not directory.is_dir():
        return None
    candidates = sorted(
        ((stamp, path) for path in directory.iterdir() if (stamp := _stamp_of(path, fleet)) is not None),
        reverse=True,
    )
    for _stamp, path in candidates:
        try:
            doc = _read(path)
            if doc.get("fleet") not in (None, fleet):
                raise HistoryError(f"saved audit {path}: fleet {doc.get('fleet')!r}, expected {fleet!r}")
            _previous_findings(doc)  # every finding must be readable for compare()
        except HistoryError as exc:
            why = str(exc) if str(path) in str(exc) else f"saved audit {path}: {exc}"
            (warn or _warn_stderr)(f"warning: {why}; skipped (move the file aside to silence this)")
            continue
        if before is not None:
            started = _started(doc)
            if started is not None and started >= before:
                continue
        return doc
    return None


def save(result: AuditResult, directory: Path) -> Path:
    """Keep this run for the next one's comparison: a unique temporary file, fsynced, renamed into place, then the
    directory fsynced, so a crash or a concurrent audit never leaves half a history file."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = result.started_at.strftime("%Y%m%dT%H%M%S%fZ")
    path = directory / f"audit-{result.fleet}-{stamp}.json"
    return write_atomic(path, json.dumps(result.to_dict(), indent=1, default=str))


@dataclass(frozen=True)
class Comparison:
    """Findings by what happened to them since the previous run (each in host order, worst first)."""

    new: tuple[Finding, ...]
    resolved: tuple[Finding, ...]  # as the previous run saw them
    persisting: tuple[Finding, ...]  # as this run sees them
    unknown: tuple[Finding, ...]  # previous findings on hosts this run could not look at
    previous_started_at: str | None = None
    hosts_not_probed_now: tuple[str, ...] = ()  # had findings (or were probed) before, not probed now
    hosts_not_probed_before: tuple[str, ...] = ()  # probed now, not probed (or absent) before

    @property
    def has_previous(self) -> bool:
        return self.previous_started_at is not None

    @property
    def changed(self) -> bool:
        return bool(self.new or self.resolved)


def _previous_findings(previous: Mapping[str, Any]) -> tuple[dict[str, list[Finding]], set[str], list[str]]:
    """host -> findings of the previous run, the hosts it probed, and every host in it (document order)."""
    by_host: dict[str, list[Finding]] = {}
    probed: set[str] = set()
    order: list[str] = []
    hosts = previous.get("hosts")
    if not isinstance(hosts, list):
        raise HistoryError("previous audit: 'hosts' must be a list")
    for entry in hosts:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("host"), str):
            raise HistoryError(f"previous audit: host entry without a name: {entry!r:.200}")
        name = entry["host"]
        order.append(name)
        if entry.get("facts") is not None or entry.get("status") == "ok":
            probed.add(name)
        found = []
        for item in entry.get("findings") or []:
            try:
                f = Finding.from_dict(item)
            except (KeyError, ValueError, TypeError) as exc:
                raise HistoryError(f"previous audit: host {name}: unreadable finding {item!r:.200} ({exc})") from exc
            found.append(f if f.host == name else dataclasses.replace(f, host=name))
        by_host[name] = found
    return by_host, probed, order


def _ordered(findings: Iterable[tuple[Key, Finding]], order: list[str]) -> tuple[Finding, ...]:
    rank = {h: i for i, h in enumerate(order)}
    items = sorted(findings, key=lambda kf: (rank.get(kf[0][0], len(rank)), -kf[1].severity.rank, kf[0][1], kf[0][2]))
    return tuple(f for _key, f in items)


def compare(previous: Mapping[str, Any] | None, current: AuditResult) -> Comparison:
    """Set ``current`` against ``previous`` (a saved ``gpufleet.audit/1`` document, or None for a first run)."""
    now: dict[Key, Finding] = {}
    for h in current.hosts:
        for f in h.findings:
            now.setdefault(finding_key(h.host, f), f)
    probed_now = {h.host for h in current.hosts if h.probed}
    current_order = [h.host for h in current.hosts]
    if previous is None:
        return Comparison(
            new=_ordered(now.items(), current_order),
            resolved=(),
            persisting=(),
            unknown=(),
            hosts_not_probed_before=tuple(h for h in current_order if h in probed_now),
        )
    prev_by_host, probed_before, prev_order = _previous_findings(previous)
    listed = set(current_order)  # a set: a list's `in` made this step quadratic in the fleet's size (issue 25)
    order = current_order + [h for h in prev_order if h not in listed]
    before: dict[Key, Finding] = {}
    for host, found in prev_by_host.items():
        for f in found:
            before.setdefault(finding_key(host, f), f)

    new = [(k, f) for k, f in now.items() if k not in before]
    persisting = [(k, f) for k, f in now.items() if k in before]
    resolved = [(k, f) for k, f in before.items() if k not in now and k[0] in probed_now]
    unknown = [(k, f) for k, f in before.items() if k not in now and k[0] not in probed_now]
    started = previous.get("started_at")
    gone = tuple(h for h in order if h not in probed_now and (h in probed_before or prev_by_host.get(h)))
    return Comparison(
        new=_ordered(new, order),
        resolved=_ordered(resolved, order),
        persisting=_ordered(persisting, order),
        unknown=_ordered(unknown, order),
        previous_started_at=str(started) if started is not None else "?",
        hosts_not_probed_now=gone,
        hosts_not_probed_before=tuple(h for h in current_order if h in probed_now and h not in probed_before),
    )


def render_comparison(c: Comparison, console: Console) -> None:
    """Print the comparison: one summary line, then the new, resolved and unknown findings (persisting: counted)."""
    from rich.text import Text

    from remediation.report.table import SEVERITY_STYLE

    if not c.has_previous:
        console.print(Text(f"no previous run to compare with: {len(c.new)} finding(s), all reported as new"))
        return
    head = Text(f"since the previous run ({c.previous_started_at}): ")
    head.append(f"{len(c.new)} new", style="bold red" if c.new else "")
    head.append(", ")
    head.append(f"{len(c.resolved)} resolved", style="green" if c.resolved else "")
    head.append(f", {len(c.persisting)} persisting, ")
    head.append(f"{len(c.unknown)} unknown", style="magenta" if c.unknown else "")
    console.print(head)

    def block(title: str, findings: tuple[Finding, ...], marker: str) -> None:
        if not findings:
            return
        console.print(Text(title, style="bold"))
        for f in findings:
            line = Text(f"  {marker} {f.host or '?'} ")
            line.append(f.id, style=SEVERITY_STYLE[f.severity])
            line.append(f" [{f.severity.value}] {f.summary}")
            console.print(line)

    block("new", c.new, "+")
    block("resolved", c.resolved, "-")
    block("unknown (host not probed this run; not counted as resolved)", c.unknown, "?")
    if c.hosts_not_probed_before:
        hosts = ", ".join(c.hosts_not_probed_before)
        console.print(Text(f"not probed in the previous run, so their findings count as new: {hosts}", style="dim"))
