"""The finding catalog: every finding ID, its scenario, default severity, remedy and runbook.

Each entry's :class:`Runbook` carries the five sections of the source runbook (RUNBOOK.md: Symptoms →
Diagnosis → Root cause → Resolution → Prevention), in English, with the commands an on-call engineer runs.
``remedy`` names what fixes the finding: an Invoke task (``{host}`` is filled in by
:func:`remediation.core.findings.make_finding`), a role, or a command.

One module per area holds that area's entries (``host``: the GPU host audit and its field text; each later area,
such as Kubernetes, Azure, Azure OpenAI or training, adds its own module and one line to :data:`_AREAS`). An ID is
defined once: two modules defining the same ID is an import-time error.

Scenario choice for hardware/health findings: a GPU that is lost, shows uncorrected ECC errors, Xid events or is
missing from the bus makes GPU work *fail*, which is what scenario S1 ("GPU work fails") is about, so those
(GPU-HW-*) are filed under S1 even though the cause is hardware, not the driver. Findings that make GPU work
*slow* rather than fail (temperature, throttling, persistence mode, memory pressure: GPU-THM-*, GPU-CFG-*,
GPU-MEM-*) are filed under S5 (inference latency spike).

Also here (from :mod:`remediation.core.catalog.xid`): :data:`XID_MEANINGS` and :data:`XID_SEVERITY`, the Xid codes of
NVIDIA's Xid catalog that are seen in the field, with a short meaning and the severity a finding about them gets.
"""

from __future__ import annotations

from remediation.core.catalog import aoai, azure, host, k8s, train
from remediation.core.catalog.entry import CatalogEntry, Runbook
from remediation.core.catalog.xid import (
    XID_APPLICATION,
    XID_CRITICAL,
    XID_MEANINGS,
    XID_SEVERITY,
    xid_class,
    xid_meaning,
    xid_remedy,
    xid_severity,
)

__all__ = [
    "CATALOG",
    "XID_APPLICATION",
    "XID_CRITICAL",
    "XID_MEANINGS",
    "XID_SEVERITY",
    "CatalogEntry",
    "Runbook",
    "get",
    "xid_class",
    "xid_meaning",
    "xid_remedy",
    "xid_severity",
]

_AREAS = (host, azure, k8s, aoai, train)


def _build() -> dict[str, CatalogEntry]:
    catalog: dict[str, CatalogEntry] = {}
    for area in _AREAS:
        for entry in area.ENTRIES:
            if entry.id in catalog:
                raise RuntimeError(f"finding id {entry.id} is defined twice (again in {area.__name__})")
            catalog[entry.id] = entry
    return catalog


CATALOG: dict[str, CatalogEntry] = _build()


def get(finding_id: str) -> CatalogEntry:
    """The catalog entry for ``finding_id``; ``KeyError`` naming the ID when there is none."""
    try:
        return CATALOG[finding_id]
    except KeyError:
        raise KeyError(f"unknown finding id {finding_id!r}") from None
