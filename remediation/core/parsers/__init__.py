"""Pure parsers of field text (nvidia-smi/NVML failures, kernel logs, apt history, DKMS output, unattended-upgrades'
log).

Every parser is ``parse(text) -> frozen dataclass`` and never raises. :func:`detect_kind` says which parser a
piece of text is for, by scoring format markers; :data:`KINDS` is the registry. The host kinds (NVML text, kernel
log, apt history, DKMS, unattended-upgrades' log) are registered here and diagnosed by :mod:`remediation.host.diagnose`;
every other area registers its own kinds from its own package, with their ``diagnose`` handler on the
:class:`KindSpec`, and names that module in :data:`PLUGIN_MODULES` (imported on first use, so importing this package
stays cheap).

Size: pasted text and log files are read whole, so every entry point that takes them (``invoke diagnose``,
``k8s.diagnose-pending`` / ``diagnose-latency``, ``aoai.diagnose``, ``train.diagnose-oom``) first calls
:func:`check_size`: over :func:`max_input_bytes` (8 MiB; the environment variable ``GPUFLEET_MAX_INPUT_BYTES``
changes it) the input is refused with one line naming it, its size, the cap and the fix (keep the relevant part,
e.g. ``tail -c 4M``), raised as the area's error (exit 2). Within the cap every parser is linear in its input.

Mixed text (nvidia-smi output pasted together with kernel lines, a transcript with ``dkms status``): for the
text as a whole the highest score wins (``invoke diagnose`` also splits a paste of several kinds into its parts,
see :mod:`remediation.host.paste`), and the NVML error messages score highest on purpose. They are the symptom
the operator is asking about, and ``diagnose`` of ``nvml`` text also reads the kernel lines embedded in it, so the
more specific kernel findings (RmInitAdapter code, Xid, API mismatch versions) still appear. Ties go to the kind
registered first.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from remediation.core.errors import ParseError, RemediationError
from remediation.core.parsers import apt_history, dkms, kernel_log, nvml_text, unattended_upgrades

__all__ = [
    "KINDS",
    "MAX_INPUT_BYTES",
    "MAX_INPUT_ENV",
    "PLUGIN_MODULES",
    "UNKNOWN",
    "Diagnoser",
    "KindSpec",
    "check_size",
    "detect_kind",
    "kinds",
    "marker_score",
    "max_input_bytes",
    "register",
    "scores",
]

UNKNOWN = "unknown"

#: The default cap on one input's size (UTF-8 bytes): far above any log a diagnosis needs, far below what hangs.
MAX_INPUT_BYTES = 8 * 1024 * 1024
#: The setting that changes the cap (a whole number of bytes).
MAX_INPUT_ENV = "GPUFLEET_MAX_INPUT_BYTES"
_MIB = 1024 * 1024


def max_input_bytes() -> int:
    """The cap in force: ``$GPUFLEET_MAX_INPUT_BYTES`` when set (a positive whole number), else 8 MiB."""
    raw = os.environ.get(MAX_INPUT_ENV, "").strip()
    if not raw:
        return MAX_INPUT_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise ParseError(f"{MAX_INPUT_ENV}={raw!r}: give the input cap as a positive number of bytes (e.g. 8388608)")
    return int(raw)


def check_size(text: str, source: str, error: type[RemediationError] = ParseError) -> None:
    """Refuse ``text`` (named ``source``) over the cap with ``error``: one line with its size, the cap, the fix."""
    cap = max_input_bytes()
    if len(text) * 4 <= cap:  # UTF-8 takes at most 4 bytes a character: no need to count
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size <= cap:
        return
    keep = f"{cap // 2 // _MIB}M" if cap >= 2 * _MIB else str(cap // 2)
    raise error(
        f"{source}: {_size(size)} is over the {_size(cap)} input cap; keep the part that matters "
        f"(e.g. tail -c {keep} FILE > part.log) or raise {MAX_INPUT_ENV}"
    )


def _size(n: int) -> str:
    return f"{n / _MIB:.1f} MiB" if n >= _MIB else f"{n / 1024:.1f} KiB"


#: A kind's diagnosis: text -> (JSON-ready facts, findings). Findings come from the catalog's rules, the same
#: functions the area's own tasks use, so one finding ID has one rule.
Diagnoser = Callable[[str], tuple[dict[str, Any], list[Any]]]


@dataclass(frozen=True)
class KindSpec:
    """A kind of field text: how to recognise it (a score, 0 = not this kind), how to parse it, how to diagnose it.

    ``diagnose`` is ``None`` only for the host kinds registered here, which :mod:`remediation.host.diagnose` handles.
    """

    name: str
    score: Callable[[str], int]
    parse: Callable[[str], object]
    description: str = ""
    diagnose: Diagnoser | None = None


def marker_score(markers: tuple[tuple[re.Pattern[str], int, int], ...]) -> Callable[[str], int]:
    """A scorer: for each ``(pattern, weight, cap)``, weight * matches, at most ``cap`` matches counted."""

    def score(text: str) -> int:
        total = 0
        for pattern, weight, cap in markers:
            count = 0
            for _ in pattern.finditer(text):
                count += 1
                if count >= cap:
                    break
            total += weight * count
        return total

    return score


_M = re.MULTILINE | re.IGNORECASE
_NVML_MARKERS = (
    (re.compile(r"couldn.?t communicate with the NVIDIA driver|NVIDIA-SMI has failed", re.I), 10, 1),
    # PyTorch's torch.cuda on a host whose driver is not loaded: the same case as nvidia-smi's "couldn't communicate"
    (re.compile(r"Found no NVIDIA driver on your system", re.I), 10, 1),
    (re.compile(r"Failed to initialize NVML|nvml error:|driver/library version mismatch", re.I), 10, 1),
    (re.compile(r"Unable to determine the device handle for GPU", re.I), 10, 1),
    (re.compile(r"No devices were found|NVML Shared Library Not Found|libnvidia-ml\.so", re.I), 10, 1),
    (re.compile(r"NVML library version|nvidia-container-cli", re.I), 3, 1),
    # a healthy answer: nvidia-smi's table header, nvidia-smi -q's report (kind nvml, "no error")
    (re.compile(r"NVIDIA-SMI [0-9]+\.[0-9][0-9.]* +Driver Version: [0-9]", re.ASCII), 6, 1),
    (re.compile(r"==NVSMI LOG==|^ *Driver Version +: [0-9]", re.M | re.ASCII), 3, 2),
)
_KERNEL_MARKERS = (
    (re.compile(r"NVRM:"), 3, 10),
    (re.compile(r"\bXid\s*\(", re.I), 2, 10),
    (re.compile(r"^(?:description:\s+NVIDIA core GPU kernel module|filename:\s+/lib/modules/\S*nvidia)", _M), 5, 2),
    (re.compile(r"modprobe: FATAL: Module nvidia", re.I), 2, 2),
    (re.compile(r"insert (?:module )?'?nvidia\S*'?: (?:Key was rejected by service|Required key not available)"), 4, 2),
    (re.compile(r"Lockdown: \S+: unsigned module loading is restricted"), 4, 2),
    (re.compile(r"^[ \t]*\[ *[0-9]+\.[0-9]+\]", re.M), 1, 5),
)
_APT_MARKERS = (
    (re.compile(r"^[ \t]*Start-Date:[ \t]*[0-9]{4}-", re.M), 10, 3),
    (re.compile(r"^[ \t]*Commandline:", re.M), 5, 3),
    (re.compile(r"^[ \t]*End-Date:", re.M), 3, 3),
    (re.compile(r"^[ \t]*Requested-By:", re.M), 3, 3),
    (re.compile(r"^[ \t]*(?:Install|Upgrade|Remove|Purge|Downgrade|Reinstall):[ \t]*\S+ \(", re.M), 3, 5),
    # /var/log/dpkg.log (dpkg(1), FILES): the same package changes one line each, with times and no actor
    (
        re.compile(r"^[ \t]*[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} (?:install|upgrade|remove|purge) \S+ \S+ \S", re.M),
        4,
        5,
    ),
    (re.compile(r"^[ \t]*[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} (?:startup|status|configure|trigproc) \S", re.M), 2, 5),
)
_DKMS_MARKERS = (
    (re.compile(r"^[$#~ ]*dkms status", _M), 6, 1),
    (re.compile(r"^[A-Za-z0-9_.+-]+(?:/|, )[^,\s]+, [^,\s]+, [^,:\s]+:\s*(?:installed|built|added)", re.M), 6, 5),
    (re.compile(r"Bad return status for module build|DKMS module '[^']+'", re.I), 10, 2),
    (re.compile(r"Building (?:initial )?module|Installing to /lib/modules/|Skipping kernel", re.I), 4, 3),
    (re.compile(r"/var/lib/dkms/|dkms\.conf|dkms autoinstall|/etc/kernel/postinst\.d/dkms", re.I), 3, 3),
)

_UU_MARKERS = (
    (re.compile(r"Starting unattended upgrades script|Allowed origins are:", re.I), 10, 2),
    (re.compile(r"Initial (?:blacklist|whitelist)(?:ed packages)?\b", re.I), 10, 2),
    (re.compile(r"Packages that will be upgraded:|No packages found that can be upgraded unattended", re.I), 10, 2),
    (re.compile(r"Unattended[- ]upgrades? result|Packages that (?:were upgraded|attempted to upgrade):", re.I), 10, 1),
    (re.compile(r"Package \S+ is (?:blacklisted|marked to be held back)|skipping blacklisted package", re.I), 6, 2),
    (re.compile(r"Packages that (?:are auto removed|were successfully auto-removed|are kept back):", re.I), 6, 1),
    (re.compile(r"Writing dpkg log to|unattended-upgrades-dpkg\.log|All upgrades installed", re.I), 4, 2),
    # the same messages in the program's translations (de, fr, es, pt_BR po files; see parsers/unattended_upgrades)
    (
        re.compile(
            r"Skript für unbeaufsichtigte Upgrades|Démarrage du script de mise à (?:niveau|jour) automatique"
            r"|Iniciando (?:guión de actualizaciones desatendidas|o script da atualização desacompanhada)"
            r"|erlaubte Ursprünge sind:|Les origines permises sont :|Fuentes permitidas:|São origens permitidas:",
            re.I,
        ),
        10,
        2,
    ),
    (
        re.compile(
            r"Pakete, von denen ein Upgrade durchgeführt wird:|Paquetes que se actualizarán:"
            r"|Paquets mis à (?:niveau|jour) :"
            r"|Pakete, die anfangs auf die schwarzen Liste|Paquets initialement sur la liste noire"
            r"|Paquetes bloqueados inicialmente:|Pacotes inicialmente na lista negra:",
            re.I,
        ),
        10,
        2,
    ),
)

KINDS: dict[str, KindSpec] = {}

#: Modules that register more kinds when imported, one per area (``remediation.<area>.<module>``).
PLUGIN_MODULES: tuple[str, ...] = ("remediation.k8s.kinds", "remediation.aoai.kind", "remediation.train.kind")
_plugins_loaded = False


def register(spec: KindSpec) -> None:
    """Add (or replace) a kind of field text in the registry."""
    KINDS[spec.name] = spec


_nvml_markers = marker_score(_NVML_MARKERS)


def _nvml_score(text: str) -> int:
    """nvidia-smi's wording, plus 10 when any program names an NVML error (call + NVML's error string/name/code)."""
    score = _nvml_markers(text)
    if ("nvml" in text.lower() or "handle" in text.lower()) and nvml_text.mentions(" ".join(text.split())):
        score += 10
    return score


register(KindSpec("nvml", _nvml_score, nvml_text.parse, "nvidia-smi / NVML failure text, NVML errors of any program"))
register(KindSpec("kernel-log", marker_score(_KERNEL_MARKERS), kernel_log.parse, "kernel log lines about NVIDIA"))
register(
    KindSpec(
        "apt-history", marker_score(_APT_MARKERS), apt_history.parse, "/var/log/apt/history.log, /var/log/dpkg.log"
    )
)
register(KindSpec("dkms", marker_score(_DKMS_MARKERS), dkms.parse, "dkms status / DKMS build output"))
register(
    KindSpec(
        "unattended-upgrades-log",
        marker_score(_UU_MARKERS),
        unattended_upgrades.parse,
        "/var/log/unattended-upgrades/unattended-upgrades.log",
    )
)


def kinds() -> dict[str, KindSpec]:
    """Every registered kind, the areas' plugin kinds included (imported here on the first call)."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for module in PLUGIN_MODULES:
            importlib.import_module(module)
    return KINDS


def scores(text: str) -> dict[str, int]:
    """Every registered kind's score for ``text`` (for explaining a detection)."""
    return {name: spec.score(text) for name, spec in kinds().items()}


def detect_kind(text: str, by_kind: dict[str, int] | None = None) -> str:
    """The registered kind ``text`` most looks like, or ``"unknown"``. Never raises.

    ``by_kind``: :func:`scores` of ``text`` when the caller has them already.
    """
    best, best_score = UNKNOWN, 0
    for name, value in (scores(text) if by_kind is None else by_kind).items():
        if value > best_score:
            best, best_score = name, value
    return best
