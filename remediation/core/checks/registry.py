"""One rule per finding ID: the registry the audit and ``invoke diagnose`` both evaluate.

Each finding ID is decided by exactly one function, registered here with :func:`rule` (per host or per text,
``fn(evidence) -> findings``) or :func:`fleet_rule` (across hosts). The function is the only place that calls
``make_finding`` with its ID (a unit test walks the source and fails otherwise), so the audit, which evaluates the
registry on a host's facts, and ``invoke diagnose``, which evaluates it on pasted text, cannot disagree about an ID.

A rule registered with ``final=True`` runs after every other rule and is given their findings: GPU-DRV-004
("NVML failed, cause unknown") is the rule that keeps a host whose NVML failed from ever coming out healthy.
Findings come out in registry order (the order the rule modules are imported in :mod:`remediation.core.checks`),
duplicates dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from remediation.core.findings import Finding

if TYPE_CHECKING:
    from remediation.core.checks.evidence import Evidence
    from remediation.core.checks.policy import Policy
    from remediation.core.facts import HostFacts

__all__ = ["RULES", "Rule", "evaluate", "evaluate_fleet", "fleet_rule", "rule"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Rule:
    id: str
    fn: Callable[..., Any]  # host: (evidence[, findings]) -> list[Finding]; fleet: (facts, policy) -> {host: [...]}
    scope: str  # "host" (one host's facts or one text) | "fleet" (every host's facts)
    final: bool = False  # runs last and is given the other rules' findings

    @property
    def where(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


RULES: dict[str, Rule] = {}


def _register(finding_id: str, fn: Callable[..., Any], scope: str, final: bool) -> None:
    if finding_id in RULES and RULES[finding_id].where != f"{fn.__module__}.{fn.__qualname__}":
        raise RuntimeError(f"finding id {finding_id} has two rules: {RULES[finding_id].where} and {fn.__qualname__}")
    RULES[finding_id] = Rule(finding_id, fn, scope, final)


def rule(finding_id: str, *, final: bool = False) -> Callable[[F], F]:
    """Register the function that decides ``finding_id`` from one :class:`~remediation.core.checks.evidence.Evidence`.

    ``fn(evidence)``, or ``fn(evidence, findings_of_the_other_rules)`` with ``final=True``.
    """

    def decorate(fn: F) -> F:
        _register(finding_id, fn, "host", final)
        return fn

    return decorate


def fleet_rule(finding_id: str) -> Callable[[F], F]:
    """Register the function that decides ``finding_id`` across hosts: ``fn(all_facts, policy) -> {host: [...]}``."""

    def decorate(fn: F) -> F:
        _register(finding_id, fn, "fleet", False)
        return fn

    return decorate


def evaluate(evidence: Evidence) -> tuple[Finding, ...]:
    """Every host rule on ``evidence``, in registry order (duplicates dropped)."""
    results: dict[str, list[Finding]] = {}
    for r in RULES.values():
        if r.scope == "host" and not r.final:
            found: list[Finding] = r.fn(evidence)
            results[r.id] = found
    prior = [f for found in results.values() for f in found]
    for r in RULES.values():
        if r.scope == "host" and r.final:
            final_found: list[Finding] = r.fn(evidence, prior)
            results[r.id] = final_found
    ordered = [f for r in RULES.values() if r.id in results for f in results[r.id]]
    return tuple(dict.fromkeys(ordered))


def evaluate_fleet(all_facts: Mapping[str, HostFacts], policy: Policy) -> dict[str, list[Finding]]:
    """Every fleet rule: host -> its cross-host findings."""
    out: dict[str, list[Finding]] = {}
    for r in RULES.values():
        if r.scope == "fleet":
            by_host: dict[str, list[Finding]] = r.fn(all_facts, policy)
            for host, found in by_host.items():
                out.setdefault(host, []).extend(found)
    return out
