"""Findings: what a check concluded about a host or a piece of field text.

A finding has a stable ID (see :mod:`remediation.core.catalog`), the runbook scenario it belongs to, a severity,
the evidence lines it rests on and the remedy (the role, task or command that fixes it). Findings are values:
frozen, comparable, serialisable to and from JSON-ready dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Finding", "Scenario", "Severity", "make_finding"]


class Severity(StrEnum):
    """How urgent a finding is. Ordered: ``INFO < WARNING < CRITICAL`` (compare with :attr:`rank`)."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 for info, 1 for warning, 2 for critical: sort or compare severities with this."""
        return _SEVERITY_RANK[self.value]

    @classmethod
    def worst(cls, severities: Iterable[Severity]) -> Severity | None:
        """The most severe of ``severities``, or ``None`` when there are none."""
        items = list(severities)
        if not items:
            return None
        return max(items, key=lambda s: s.rank)


_SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}


class Scenario(StrEnum):
    """The runbook's five failure scenarios (see RUNBOOK.md)."""

    S1 = "S1"  # NVIDIA driver lost after a kernel update (and GPU faults that make GPU work fail)
    S2 = "S2"  # CUDA out of memory during fine-tuning
    S3 = "S3"  # AKS GPU pods stuck in Pending
    S4 = "S4"  # Azure OpenAI 429 storm
    S5 = "S5"  # inference latency spike (cold start, thermal throttling, noisy neighbour)


@dataclass(frozen=True)
class Finding:
    """One conclusion, with the evidence it rests on and the remedy."""

    id: str
    scenario: Scenario
    severity: Severity
    summary: str
    evidence: tuple[str, ...]
    remedy: str
    host: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: keys ``id, scenario, severity, summary, evidence (list), remedy, host``."""
        return {
            "id": self.id,
            "scenario": self.scenario.value,
            "severity": self.severity.value,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "remedy": self.remedy,
            "host": self.host,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict`; raises ``ValueError``/``KeyError`` on a malformed document."""
        evidence = data.get("evidence", ())
        if isinstance(evidence, str) or not isinstance(evidence, Iterable):
            raise ValueError(f"finding {data.get('id')!r}: evidence must be a list of strings, got {evidence!r}")
        host = data.get("host")
        return cls(
            id=str(data["id"]),
            scenario=Scenario(data["scenario"]),
            severity=Severity(data["severity"]),
            summary=str(data["summary"]),
            evidence=tuple(str(line) for line in evidence),
            remedy=str(data.get("remedy", "")),
            host=None if host is None else str(host),
        )


def make_finding(
    id: str,  # the field is called id everywhere (JSON contract)
    summary: str,
    evidence: Iterable[str],
    host: str | None = None,
    severity: Severity | None = None,
) -> Finding:
    """A :class:`Finding` for catalog entry ``id``: scenario, default severity and remedy come from the catalog.

    ``{host}`` in the catalog's remedy is replaced by ``host`` when one is given, by the marked placeholder
    ``<host>`` when none is (pasted text names no host): never the bare template. Raises ``KeyError`` for an ID that
    is not in the catalog.
    """
    from remediation.core import catalog  # local import: catalog imports this module

    entry = catalog.get(id)
    remedy = entry.remedy
    remedy = remedy.replace("{host}", host if host is not None else "<host>")
    return Finding(
        id=entry.id,
        scenario=entry.scenario,
        severity=entry.severity if severity is None else severity,
        summary=summary,
        evidence=tuple(evidence),
        remedy=remedy,
        host=host,
    )
