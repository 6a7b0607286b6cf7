"""How ``quota.*`` and ``aks.*`` results are shown: a table for people, JSON for tools, Prometheus for alerts.

The Prometheus output is a node_exporter textfile beside the scheduled audit's (``gpufleet.prom``): same prefix, same
HELP/escaping rules (:mod:`remediation.report.prometheus`), no timestamps on samples. Metrics (gauges)::

    gpufleet_azure_quota_usage_vcpus{subscription,location,quota,kind}   vCPUs in use (kind: gpu-family | regional)
    gpufleet_azure_quota_limit_vcpus{subscription,location,quota,kind}   the limit
    gpufleet_azure_quota_used_ratio{subscription,location,quota,kind}    usage / limit (left out when the limit is 0)
    gpufleet_azure_quota_threshold_ratio{subscription,location}          the threshold the report used (0.8)
    gpufleet_azure_quota_timestamp_seconds{subscription,location}        when the usages were read

A label is never empty: ``subscription`` and ``location`` are left out when a ``--from-file`` run did not name them
(``quota.show --from-file F --location eastus --subscription S`` writes both).

``monitoring/prometheus/gpufleet-azure-quota.rules.yml`` alerts on ``gpufleet_azure_quota_used_ratio >= 0.8``: one
rule for every family of every region and subscription written there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from remediation.azure.aks import PoolsReport
from remediation.azure.checks import quota_findings
from remediation.azure.quota import (
    REGIONAL_VCPUS,
    SPOT_QUOTA_LABEL,
    QuotaNeed,
    QuotaPlan,
    QuotaRequestResult,
    QuotaUsage,
    UsageReport,
)
from remediation.core.findings import Finding
from remediation.report.prometheus import escape_help, escape_label_value

__all__ = [
    "QUOTA_METRICS",
    "plan_json",
    "pools_json",
    "print_plan",
    "print_pools",
    "print_quota",
    "print_request",
    "quota_json",
    "quota_prometheus",
    "request_json",
]

QUOTA_METRICS: dict[str, str] = {
    "gpufleet_azure_quota_usage_vcpus": "vCPUs in use in an Azure compute quota (a VM family or the regional total).",
    "gpufleet_azure_quota_limit_vcpus": "The limit of an Azure compute quota, in vCPUs.",
    "gpufleet_azure_quota_used_ratio": "Share of an Azure compute quota in use (usage / limit).",
    "gpufleet_azure_quota_threshold_ratio": "The alert threshold invoke quota.show applied (share of the limit).",
    "gpufleet_azure_quota_timestamp_seconds": "When invoke quota.show read the usages, Unix time.",
}


def _pct(u: QuotaUsage) -> str:
    pct = u.pct
    if pct is None:
        return "-"
    return "over 0" if math.isinf(pct) else f"{pct:.0f} %"


def _findings(report: UsageReport) -> list[Finding]:
    return quota_findings(report.rows, report.threshold_pct, report.location)


def print_quota(console: Console, report: UsageReport) -> None:
    where = report.location or "(from file)"
    table = Table(title=f"GPU quota in {where}" + (f", subscription {report.subscription}" if report.subscription
                                                   else ""))
    for col in ("quota", "name", "used", "limit", "% used", ""):
        table.add_column(col, justify="right" if col in ("used", "limit", "% used") else "left")
    for u in report.rows:
        flag = f"[red]>= {report.threshold_pct:g} %[/red]" if u.at_or_over(report.threshold_pct) else ""
        table.add_row(escape(u.name), escape(u.localized), str(u.current), str(u.limit), _pct(u), flag)
    console.print(table)
    for f in _findings(report):
        console.print(f"[yellow]{f.id}[/yellow] {escape(f.summary)}: {escape(f.remedy)}", markup=True, highlight=False)
    if not report.flagged:
        console.print(f"no quota at or above {report.threshold_pct:g} %")


def quota_json(report: UsageReport) -> str:
    return json.dumps({
        "subscription": report.subscription,
        "location": report.location,
        "source": report.source,
        "thresholdPct": report.threshold_pct,
        "usages": [{**u.to_dict(), "kind": "regional" if u.is_regional else "gpu-family",
                    "flagged": u.at_or_over(report.threshold_pct)} for u in report.rows],
        "findings": [f.to_dict() for f in _findings(report)],
    }, indent=2)


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    """``{k="v",...}`` without the pairs whose value is empty (a label is never ``location=""``)."""
    kept = [(k, v) for k, v in pairs if v]
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in kept) + "}" if kept else ""


def quota_prometheus(report: UsageReport) -> str:
    """The textfile (see the module docstring); every line ends in a newline, no sample has a timestamp."""
    base = [("subscription", report.subscription), ("location", report.location)]
    samples: dict[str, list[str]] = {name: [] for name in QUOTA_METRICS}
    for u in report.rows:
        labels = _labels([*base, ("quota", u.name), ("kind", "regional" if u.is_regional else "gpu-family")])
        samples["gpufleet_azure_quota_usage_vcpus"].append(f"gpufleet_azure_quota_usage_vcpus{labels} {u.current}")
        samples["gpufleet_azure_quota_limit_vcpus"].append(f"gpufleet_azure_quota_limit_vcpus{labels} {u.limit}")
        if u.limit > 0:
            samples["gpufleet_azure_quota_used_ratio"].append(
                f"gpufleet_azure_quota_used_ratio{labels} {u.current / u.limit:.6g}"
            )
    samples["gpufleet_azure_quota_threshold_ratio"].append(
        f"gpufleet_azure_quota_threshold_ratio{_labels(base)} {report.threshold_pct / 100:.6g}"
    )
    samples["gpufleet_azure_quota_timestamp_seconds"].append(
        f"gpufleet_azure_quota_timestamp_seconds{_labels(base)} {report.collected_at:.3f}"
    )
    lines: list[str] = []
    for name, help_text in QUOTA_METRICS.items():
        if not samples[name]:
            continue
        lines += [f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} gauge", *samples[name]]
    return "\n".join(lines) + "\n"


def _plan_quota(u: QuotaUsage) -> str:
    """A plan's quota as the table names it: the Spot quota by what it is, then its usage name."""
    return SPOT_QUOTA_LABEL if u.is_low_priority else u.name


def print_plan(console: Console, p: QuotaPlan) -> None:
    console.print(
        f"{p.nodes} more {p.size.name}{' Spot VMs' if p.spot else ''} ({p.gpus} x {p.size.gpu_model}"
        + (f", {p.size.gpu_share} of a GPU each" if p.size.gpu_share != 1 else "")
        + f") = {p.vcpus} vCPUs of {p.family.usage.name if p.spot else p.size.family}"
        + f" in {p.location or '(from file)'}"
        + (f" (the regional low-priority (Spot) vCPUs; not {p.size.family} nor {REGIONAL_VCPUS})" if p.spot else ""),
        highlight=False, markup=False,
    )
    table = Table()
    for col in ("quota", "used", "limit", "+ needed", "new total", "verdict"):
        table.add_column(col)
    for n in p.needs:
        if not n.known:
            table.add_row(escape(_plan_quota(n.usage)), "unknown", "unknown", str(n.needed), "unknown",
                          "[yellow]unknown[/yellow]")
            continue
        verdict = "fits" if n.fits else f"[red]request limit {n.new_total}[/red]"
        table.add_row(escape(_plan_quota(n.usage)), str(n.usage.current), str(n.usage.limit), str(n.needed),
                      str(n.new_total), verdict)
    console.print(table)
    for n in p.unknown:
        console.print(f"unknown: {n.unknown}", highlight=False, markup=False)
    if p.fits:
        console.print("fits: no quota request needed")
        return
    for n in p.needs:
        if n.known and not n.fits:
            console.print(
                f"request: invoke quota.request --location {p.location or '<location>'} --family {n.usage.name}"
                f" --vcpus {n.new_total}   (to stay under {p.threshold_pct:g} %: --vcpus"
                f" {n.headroom_limit(p.threshold_pct)})",
                highlight=False, markup=False,
            )


def plan_json(p: QuotaPlan) -> str:
    def need(n: QuotaNeed) -> dict[str, Any]:
        if not n.known:  # no usage row: unknown, never 0/0
            return {"quota": n.usage.name, "currentValue": None, "limit": None, "needed": n.needed, "newTotal": None,
                    "fits": None, "limitUnderThreshold": None, "unknown": n.unknown}
        out: dict[str, Any] = {
            "quota": n.usage.name, "currentValue": n.usage.current, "limit": n.usage.limit, "needed": n.needed,
            "newTotal": n.new_total, "fits": n.fits, "limitUnderThreshold": n.headroom_limit(p.threshold_pct)}
        if n.usage.is_low_priority:
            out["description"] = SPOT_QUOTA_LABEL
        return out

    return json.dumps({
        "location": p.location, "vmSize": p.size.name, "vcpusPerVm": p.size.vcpus, "gpusPerVm": p.size.gpu_count,
        "family": p.size.family, "spot": p.spot, "nodes": p.nodes, "gpus": p.gpus, "vcpus": p.vcpus,
        "fits": None if p.unknown and all(n.fits for n in p.needs if n.known) else p.fits,
        "quotas": [need(n) for n in p.needs],
    }, indent=2)


def print_request(console: Console, r: QuotaRequestResult) -> None:
    head = f"{r.family} in {r.location}: {r.current} vCPUs used, limit {r.limit_before}"
    if r.outcome == "sufficient":
        console.print(f"{head}: already sufficient for {r.requested}; nothing requested", highlight=False, markup=False)
    elif r.outcome in ("check", "declined"):
        console.print(f"{head}: would request a new total of {r.requested} ({r.message})", highlight=False,
                      markup=False)
        console.print("PUT body: " + json.dumps(r.body), highlight=False, markup=False)
    else:
        after = f"; limit now {r.limit_after}" if r.limit_after is not None else ""
        console.print(f"{head}: request for {r.requested} {r.outcome}{after} ({r.message}; quota request"
                      f" {r.request_id or '?'}, {r.polls} poll(s))", highlight=False, markup=False)


def request_json(r: QuotaRequestResult) -> str:
    return json.dumps({
        "subscription": r.subscription, "location": r.location, "family": r.family, "currentValue": r.current,
        "limitBefore": r.limit_before, "requested": r.requested, "outcome": r.outcome, "message": r.message,
        "limitAfter": r.limit_after, "quotaRequestId": r.request_id, "body": r.body,
    }, indent=2)


def print_pools(console: Console, r: PoolsReport) -> None:
    table = Table(title=f"AKS {r.resource_group}/{r.cluster} ({r.location})")
    for col in ("pool", "vmSize", "count", "min", "max", "autoscale", "taints", "power", ""):
        table.add_column(col)
    for p in r.pools:
        flags = []
        if p.at_max:
            flags.append("[red]at maxCount[/red]")
        if p.is_gpu:
            flags.append("GPU" + ("" if p.gpu_tainted else " [yellow]no sku=gpu taint[/yellow]"))
        table.add_row(escape(p.name), escape(p.vm_size), str(p.count),
                      str(p.min_count if p.min_count is not None else "-"),
                      str(p.max_count if p.max_count is not None else "-"), "on" if p.autoscaling else "off",
                      escape(", ".join(p.taints) or "-"), escape(p.power_state), " ".join(flags))
    console.print(table)
    for h in r.headroom:
        if not h.known:
            console.print(f"quota {h.usage.name}: unknown; growing {', '.join(h.pools)} to maxCount needs {h.needed}"
                          f" more: {h.unknown}", highlight=False, markup=False)
            continue
        verdict = "fits" if h.fits else "[red]short[/red]"
        console.print(f"quota {escape(h.usage.name)}: {h.usage.current}/{h.usage.limit} used; growing"
                      f" {escape(', '.join(h.pools))} to maxCount needs {h.needed} more -> {h.new_total}: {verdict}",
                      highlight=False)
    for f in r.findings:
        console.print(f"{f.id} [{f.severity.value}] {f.summary}", highlight=False, markup=False)
        for line in f.evidence[1:]:
            console.print(f"    {line}", highlight=False, markup=False)
        if f.remedy.startswith("az ") and not any(f.remedy in line for line in f.evidence):
            console.print(f"    fix: {f.remedy}", highlight=False, markup=False)


def pools_json(r: PoolsReport) -> str:
    return json.dumps({
        "subscription": r.subscription, "resourceGroup": r.resource_group, "cluster": r.cluster,
        "location": r.location, "pools": [p.to_dict() for p in r.pools],
        "headroom": [{"quota": h.usage.name, "currentValue": h.usage.current, "limit": h.usage.limit,
                      "needed": h.needed, "newTotal": h.new_total, "fits": h.fits, "pools": list(h.pools)}
                     if h.known else
                     {"quota": h.usage.name, "currentValue": None, "limit": None, "needed": h.needed,
                      "newTotal": None, "fits": None, "pools": list(h.pools), "unknown": h.unknown}
                     for h in r.headroom],
        "findings": [f.to_dict() for f in r.findings],
    }, indent=2)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (node_exporter never reads half a file)."""
    import os
    from pathlib import Path

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, target)
