"""The two types every catalog module builds: a finding's :class:`CatalogEntry` and its :class:`Runbook`."""

from __future__ import annotations

from dataclasses import dataclass

from remediation.core.findings import Scenario, Severity

__all__ = ["CatalogEntry", "Runbook"]


@dataclass(frozen=True)
class Runbook:
    """The runbook's five sections for one finding."""

    symptoms: str
    diagnosis: str
    root_cause: str
    resolution: str
    prevention: str

    def sections(self) -> tuple[tuple[str, str], ...]:
        """``(title, text)`` pairs in runbook order, for rendering."""
        return (
            ("Symptoms", self.symptoms),
            ("Diagnosis", self.diagnosis),
            ("Root cause", self.root_cause),
            ("Resolution", self.resolution),
            ("Prevention", self.prevention),
        )


@dataclass(frozen=True)
class CatalogEntry:
    """One finding ID and everything known about it before any host is looked at."""

    id: str
    scenario: Scenario
    severity: Severity
    title: str
    remedy: str
    runbook: Runbook
