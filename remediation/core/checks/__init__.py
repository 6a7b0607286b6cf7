"""Checks: the one rule per finding ID, evaluated on a host's facts (the audit) or on pasted text (``diagnose``).

Every rule is registered in :mod:`remediation.core.checks.registry` by the module that defines it; the modules are
imported here in the order their findings are listed (driver, kernel and packages, hardware, DKMS, thermal,
usage). :func:`run_checks` evaluates the registry on one host's :class:`~remediation.core.facts.HostFacts` (through
:func:`remediation.core.checks.evidence.from_facts`); :func:`run_fleet_checks` adds the cross-host rules (driver drift
against the fleet majority). :func:`evaluate` is what ``invoke diagnose`` runs on the evidence parsed from text.

Guarantee: a host whose NVML failed never comes out healthy: if no rule produced a critical finding for it, the
GPU-DRV-004 rule adds a critical one.
"""

from __future__ import annotations

from collections.abc import Mapping

# Importing a rule module registers its rules: the order of these lines is the order findings are listed in.
from remediation.core.checks import driver  # noqa: F401  # isort: skip
from remediation.core.checks import kernel  # noqa: F401  # isort: skip
from remediation.core.checks import hardware  # noqa: F401  # isort: skip
from remediation.core.checks import dkms  # noqa: F401  # isort: skip
from remediation.core.checks import thermal  # noqa: F401  # isort: skip
from remediation.core.checks import usage  # noqa: F401  # isort: skip
from remediation.core.checks.evidence import Evidence, from_facts
from remediation.core.checks.policy import Policy
from remediation.core.checks.registry import RULES, Rule, evaluate, evaluate_fleet
from remediation.core.facts import HostFacts
from remediation.core.findings import Finding

__all__ = ["RULES", "Evidence", "Policy", "Rule", "evaluate", "run_checks", "run_fleet_checks"]


def run_checks(facts: HostFacts, policy: Policy) -> tuple[Finding, ...]:
    """Every per-host rule on one host's facts, in registry order (duplicates dropped)."""
    return evaluate(from_facts(facts, policy))


def run_fleet_checks(all_facts: Mapping[str, HostFacts], policy: Policy) -> dict[str, tuple[Finding, ...]]:
    """Per-host rules for every host plus the cross-host ones; every host is a key, healthy ones map to ()."""
    fleet = evaluate_fleet(all_facts, policy)
    out: dict[str, tuple[Finding, ...]] = {}
    for host, facts in all_facts.items():
        out[host] = tuple(dict.fromkeys([*run_checks(facts, policy), *fleet.get(host, [])]))
    return out
