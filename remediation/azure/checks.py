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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from remediation.core.findings import Finding, make_finding

if TYPE_CHECKING:
    from remediation.azure.aks import Headroom, NodePool
    from remediation.azure.quota import QuotaUsage

__all__ = ["pool_findings", "quota_findings"]

TOLERATION = 'tolerations: [{key: "sku", operator: "Equal", value: "gpu", effect: "NoSchedule"}]'


def _pct(u: QuotaUsage) -> str:
    pct = u.pct
    return "over a 0 limit" if pct is not None and pct == float("inf") else f"{pct or 0:.0f} %"


def quota_findings(rows: Iterable[QuotaUsage], threshold_pct: float, location: str) -> list[Finding]:
    """AZ-QUOTA-001 per GPU family, AZ-QUOTA-002 for the regional total, at or above ``threshold_pct``."""
    out: list[Finding] = []
    for u in rows:
        if not u.at_or_over(threshold_pct):
            continue
        evidence = (f"{u.localized} ({u.name}) in {location or 'the usages'}: {u.current} of {u.limit} vCPUs used"
                    f" ({_pct(u)}; threshold {threshold_pct:.0f} %)",)
        if u.is_regional:
            out.append(make_finding("AZ-QUOTA-002", f"regional vCPU quota {_pct(u)} used in {location}", evidence))
        else:
            out.append(make_finding("AZ-QUOTA-001", f"GPU quota {u.name} {_pct(u)} used in {location}", evidence))
    return out


def pool_findings(
    cluster: str, pools: Sequence[NodePool], headroom: Iterable[Headroom], location: str = ""
) -> list[Finding]:
    """AZ-AKS-001/002/003 per pool, AZ-QUOTA-003 per quota whose headroom does not cover the pools' maxCount."""
    out: list[Finding] = []
    for p in pools:
        where = f"{cluster}/{p.name}"
        if p.at_max:
            out.append(make_finding(
                "AZ-AKS-001", f"node pool {where} is at maxCount ({p.count}/{p.max_count}): the autoscaler cannot"
                " add nodes",
                (f"{where}: count {p.count}, minCount {p.min_count}, maxCount {p.max_count}, autoscaling on,"
                 f" vmSize {p.vm_size}",),
            ))
        if not p.is_gpu:
            continue
        if p.gpu_tainted:
            out.append(make_finding(
                "AZ-AKS-003", f"GPU pool {where} is tainted sku=gpu:NoSchedule: GPU pods need the toleration",
                (f"{where}: nodeTaints {list(p.taints)}", f"pod spec needs: {TOLERATION}"),
            ))
        else:
            out.append(make_finding(
                "AZ-AKS-002", f"GPU pool {where} has no sku=gpu:NoSchedule taint: any pod may land on its GPU nodes",
                (f"{where}: vmSize {p.vm_size}, nodeTaints {list(p.taints) or 'none'}",),
            ))
    for h in headroom:
        if h.fits:
            continue
        if h.usage.is_regional:
            what = "the regional vCPU total (cores)"
        elif h.usage.is_low_priority:
            what = f"the regional low-priority (Spot) vCPU quota ({h.usage.name})"
        else:
            what = h.usage.name
        out.append(make_finding(
            "AZ-QUOTA-003",
            f"scaling {', '.join(h.pools)} to maxCount needs {h.needed} vCPUs of {what}; only {h.usage.free} left",
            (f"{h.usage.localized} ({h.usage.name}): {h.usage.current} used of {h.usage.limit}; growth to maxCount"
             f" needs {h.needed} more (new total {h.new_total})",
             f"request: invoke quota.request --location {location or 'LOCATION'} --family {h.usage.name}"
             f" --limit {h.new_total}"),
        ))
    return out
