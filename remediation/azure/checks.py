"""The Azure findings, each decided once here and used by ``quota.show``, ``aks.pools`` and the demo (pure).

| ID | decided by |
|---|---|
| AZ-QUOTA-001 | :func:`quota_findings`: a GPU quota family at or above the threshold (default 80 %) |
| AZ-QUOTA-002 | :func:`quota_findings`: the regional vCPU total at or above the threshold |
| AZ-QUOTA-003 | :func:`pool_findings`: growing the GPU pools to maxCount needs more quota than is left |

A Spot pool's growth is weighed against the regional low-priority vCPUs (``lowPriorityCores``), see :mod:`.aks`.
| AZ-AKS-001 | :func:`pool_findings`: an autoscaling pool at maxCount (the autoscaler cannot add nodes) |
| AZ-AKS-002 | :func:`pool_findings`: a GPU pool without the ``sku=gpu:NoSchedule`` taint |
| AZ-AKS-003 | :func:`pool_findings`: a GPU pool with that taint: GPU pods need the matching toleration |

Each finding's remedy is the catalog's command filled with what the run knows (the region, the family, the cluster,
its resource group, the pool, the limit); what it cannot know is written ``<like-this>``, never a bare ``LOCATION``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from remediation.core.findings import Finding, make_finding

if TYPE_CHECKING:
    from remediation.azure.aks import Headroom, NodePool
    from remediation.azure.quota import QuotaUsage

__all__ = ["pool_findings", "quota_findings"]

GPU_TAINT = "sku=gpu:NoSchedule"
TOLERATION = 'tolerations: [{key: "sku", operator: "Equal", value: "gpu", effect: "NoSchedule"}]'


def _pct(u: QuotaUsage) -> str:
    pct = u.pct
    return "over a 0 limit" if pct is not None and pct == float("inf") else f"{pct or 0:.0f} %"


def _location(location: str) -> str:
    return location or "<location>"


def _under_threshold(u: QuotaUsage, threshold_pct: float) -> int:
    """The smallest limit that puts today's usage under ``threshold_pct`` (above the current limit)."""
    return max(u.limit + 1, math.floor(u.current * 100.0 / threshold_pct) + 1)


def quota_findings(rows: Iterable[QuotaUsage], threshold_pct: float, location: str) -> list[Finding]:
    """AZ-QUOTA-001 per GPU family, AZ-QUOTA-002 for the regional total, at or above ``threshold_pct``.

    The remedy names the region and the family, and a limit that brings today's usage under the threshold.
    """
    out: list[Finding] = []
    where = location or "the usages"
    for u in rows:
        if not u.at_or_over(threshold_pct):
            continue
        evidence = (f"{u.localized} ({u.name}) in {where}: {u.current} of {u.limit} vCPUs used"
                    f" ({_pct(u)}; threshold {threshold_pct:.0f} %)",)
        request = (f"invoke quota.request --location {_location(location)} --family {u.name}"
                   f" --vcpus {_under_threshold(u, threshold_pct)}")
        if u.is_regional:
            finding = make_finding("AZ-QUOTA-002", f"regional vCPU quota {_pct(u)} used in {where}", evidence)
            out.append(replace(finding, remedy=f"{request} (under {threshold_pct:g} % at today's usage)"))
        else:
            finding = make_finding("AZ-QUOTA-001", f"GPU quota {u.name} {_pct(u)} used in {where}", evidence)
            out.append(replace(finding, remedy=(
                f"invoke quota.plan --location {_location(location)} --vm-size <vm-size> --nodes <n> for the nodes"
                f" to come, then {request} (under {threshold_pct:g} % at today's usage) or the limit the plan gives"
            )))
    return out


def pool_findings(
    cluster: str,
    pools: Sequence[NodePool],
    headroom: Iterable[Headroom],
    location: str = "",
    resource_group: str = "",
) -> list[Finding]:
    """AZ-AKS-001/002/003 per pool, AZ-QUOTA-003 per quota whose headroom does not cover the pools' maxCount.

    A headroom whose usage is unknown (no usage row) is no finding: :mod:`.report` prints why it is unknown.
    """
    out: list[Finding] = []
    for p in pools:
        where = f"{cluster}/{p.name}"
        if p.at_max:
            finding = make_finding(
                "AZ-AKS-001", f"node pool {where} is at maxCount ({p.count}/{p.max_count}): the autoscaler cannot"
                " add nodes",
                (f"{where}: count {p.count}, minCount {p.min_count}, maxCount {p.max_count}, autoscaling on,"
                 f" vmSize {p.vm_size}",),
            )
            out.append(replace(finding, remedy=(
                f"az aks nodepool update --resource-group {resource_group or '<resource-group>'} --cluster-name"
                f" {cluster or '<cluster>'} --name {p.name} --update-cluster-autoscaler --min-count"
                f" {p.min_count if p.min_count is not None else '<min-count>'} --max-count <new-max-count>"
                f" (above {p.max_count}; keep quota for it: invoke aks.pools shows the headroom)"
            )))
        if not p.is_gpu:
            continue
        if p.gpu_tainted:
            out.append(make_finding(
                "AZ-AKS-003", f"GPU pool {where} is tainted sku=gpu:NoSchedule: GPU pods need the toleration",
                (f"{where}: nodeTaints {list(p.taints)}", f"pod spec needs: {TOLERATION}"),
            ))
        else:
            finding = make_finding(
                "AZ-AKS-002", f"GPU pool {where} has no sku=gpu:NoSchedule taint: any pod may land on its GPU nodes",
                (f"{where}: vmSize {p.vm_size}, nodeTaints {list(p.taints) or 'none'}",),
            )
            out.append(replace(finding, remedy=(
                f"az aks nodepool update --resource-group {resource_group or '<resource-group>'} --cluster-name"
                f" {cluster or '<cluster>'} --name {p.name} --node-taints {GPU_TAINT}; GPU pods carry the toleration"
            )))
    for h in headroom:
        if h.fits or not h.known:
            continue
        if h.usage.is_regional:
            what = "the regional vCPU total (cores)"
        elif h.usage.is_low_priority:
            what = f"the regional low-priority (Spot) vCPU quota ({h.usage.name})"
        else:
            what = h.usage.name
        request = (f"invoke quota.request --location {_location(location)} --family {h.usage.name}"
                   f" --vcpus {h.new_total}")
        finding = make_finding(
            "AZ-QUOTA-003",
            f"scaling {', '.join(h.pools)} to maxCount needs {h.needed} vCPUs of {what}; only {h.usage.free} left",
            (f"{h.usage.localized} ({h.usage.name}): {h.usage.current} used of {h.usage.limit}; growth to maxCount"
             f" needs {h.needed} more (new total {h.new_total})",
             f"request: {request}"),
        )
        out.append(replace(finding, remedy=request))
    return out
