"""AKS node pools (runbook S3): which pool cannot grow, which GPU pool lacks the taint, and whether quota lets it grow.

Read-only: ``ManagedClusters_Get`` (the cluster's region) and ``AgentPools_List`` of Microsoft.ContainerService
2024-09-01, then the region's compute usages (:mod:`.quota`) for the headroom of every autoscaling GPU pool: the vCPUs
its growth from ``count`` to ``maxCount`` needs, per quota family and in the regional total, several pools of one
family added up. A Spot pool (``scaleSetPriority: Spot``, AgentPool property of the 2024-09-01 spec, default
``Regular``) draws on the regional low-priority vCPU quota (``lowPriorityCores``) instead, whatever its family: its
growth counts there and not in its family or in ``cores``. The findings themselves are decided in :mod:`.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remediation.azure.client import ArmClient
from remediation.azure.errors import AzureInputError
from remediation.azure.quota import (
    LOW_PRIORITY_VCPUS,
    REGIONAL_VCPUS,
    QuotaUsage,
    fetch_usages,
    find,
    low_priority_usage,
    missing_row,
)
from remediation.core import skus
from remediation.core.exitcodes import ExitCode
from remediation.core.findings import Finding

__all__ = ["AKS_API", "GPU_TAINT", "Headroom", "NodePool", "PoolsReport", "pool_from_dict", "pools_report"]

AKS_API = "2024-09-01"
GPU_TAINT = "sku=gpu:NoSchedule"


@dataclass(frozen=True)
class NodePool:
    name: str
    vm_size: str
    count: int
    min_count: int | None
    max_count: int | None
    autoscaling: bool
    taints: tuple[str, ...]
    power_state: str
    mode: str
    provisioning_state: str
    priority: str = "Regular"  # scaleSetPriority: Regular | Spot

    @property
    def spot(self) -> bool:
        """A Spot pool: its VMs draw on the regional low-priority vCPU quota, not their family's."""
        return self.priority.lower() == "spot"

    @property
    def quota_name(self) -> str | None:
        """The quota the pool's growth draws on: ``lowPriorityCores`` for Spot, else its size's family."""
        if self.spot:
            return LOW_PRIORITY_VCPUS
        size = self.size
        return size.family if size is not None else None

    @property
    def size(self) -> skus.VmSize | None:
        return skus.size(self.vm_size)

    @property
    def is_gpu(self) -> bool:
        """A GPU pool: a size of the GPU table, or an N-series size newer than it."""
        if self.size is not None:
            return True
        return self.vm_size.lower().startswith(("standard_nc", "standard_nd", "standard_nv", "standard_ng"))

    @property
    def at_max(self) -> bool:
        return self.autoscaling and self.max_count is not None and self.count >= self.max_count

    @property
    def gpu_tainted(self) -> bool:
        return GPU_TAINT in self.taints

    @property
    def growth_nodes(self) -> int:
        """Nodes the autoscaler may still add (0 without autoscaling or at maxCount)."""
        if not self.autoscaling or self.max_count is None:
            return 0
        return max(0, self.max_count - self.count)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "vmSize": self.vm_size, "count": self.count, "minCount": self.min_count,
            "maxCount": self.max_count, "enableAutoScaling": self.autoscaling, "nodeTaints": list(self.taints),
            "powerState": self.power_state, "mode": self.mode, "provisioningState": self.provisioning_state,
            "scaleSetPriority": self.priority, "gpu": self.is_gpu, "atMaxCount": self.at_max,
        }


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def pool_from_dict(item: Mapping[str, Any]) -> NodePool:
    """One ``AgentPool`` of ``AgentPools_List`` (properties flattened under ``properties``)."""
    props = item.get("properties") if isinstance(item.get("properties"), Mapping) else item
    assert isinstance(props, Mapping)
    power = props.get("powerState") if isinstance(props.get("powerState"), Mapping) else {}
    return NodePool(
        name=str(item.get("name") or props.get("name") or "?"),
        vm_size=str(props.get("vmSize") or ""),
        count=_opt_int(props.get("count")) or 0,
        min_count=_opt_int(props.get("minCount")),
        max_count=_opt_int(props.get("maxCount")),
        autoscaling=bool(props.get("enableAutoScaling")),
        taints=tuple(str(t) for t in (props.get("nodeTaints") or [])),
        power_state=str((power or {}).get("code") or "Running"),
        mode=str(props.get("mode") or "User"),
        provisioning_state=str(props.get("provisioningState") or ""),
        priority=str(props.get("scaleSetPriority") or "Regular"),
    )


@dataclass(frozen=True)
class Headroom:
    """Growing the GPU pools of one quota (a family or the regional total) to their maxCount."""

    usage: QuotaUsage
    needed: int  # vCPUs the pools' growth to maxCount needs
    pools: tuple[str, ...]
    unknown: str = ""  # why the usage is not known (the region's usages have no row for the family); "" when it is

    @property
    def known(self) -> bool:
        return not self.unknown

    @property
    def fits(self) -> bool:
        """False also when the usage is unknown (:attr:`known`)."""
        return self.known and self.usage.current + self.needed <= self.usage.limit

    @property
    def new_total(self) -> int:
        return self.usage.current + self.needed


@dataclass(frozen=True)
class PoolsReport:
    subscription: str
    resource_group: str
    cluster: str
    location: str
    pools: tuple[NodePool, ...]
    headroom: tuple[Headroom, ...]
    findings: tuple[Finding, ...]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FINDINGS if any(f.severity.rank >= 1 for f in self.findings) else ExitCode.OK


def headroom_for(
    pools: Sequence[NodePool], usages: Sequence[QuotaUsage], location: str = ""
) -> tuple[Headroom, ...]:
    """Per quota the GPU pools' growth to maxCount draws on, the vCPUs it needs (pure).

    A regular pool counts in its VM family and in the regional total (``cores``); a Spot pool only in the regional
    low-priority quota (``lowPriorityCores``), which every family's Spot VMs share. A family the usages have no row
    for is unknown (:attr:`Headroom.unknown`), not 0/0.
    """
    by_family: dict[str, list[tuple[NodePool, int]]] = {}
    regional_need: list[tuple[NodePool, int]] = []
    spot_need: list[tuple[NodePool, int]] = []
    for p in pools:
        size = p.size
        if not p.is_gpu or size is None or p.growth_nodes == 0:
            continue
        need = p.growth_nodes * size.vcpus
        if p.spot:
            spot_need.append((p, need))
            continue
        by_family.setdefault(size.family.lower(), []).append((p, need))
        regional_need.append((p, need))
    out: list[Headroom] = []
    for family, items in sorted(by_family.items()):
        usage = find(usages, family)
        need, names = sum(n for _, n in items), tuple(p.name for p, _ in items)
        if usage is None:
            spelled = items[0][0].size.family if items[0][0].size else family
            out.append(Headroom(QuotaUsage(spelled, spelled, 0, 0), need, names,
                                missing_row(spelled, location, location)))
        else:
            out.append(Headroom(usage, need, names))
    if spot_need:
        # A region without the row offers no Spot vCPUs: a limit of 0, as for a family it does not list.
        low = low_priority_usage(usages)
        out.append(Headroom(low, sum(n for _, n in spot_need), tuple(p.name for p, _ in spot_need)))
    regional = find(usages, REGIONAL_VCPUS)
    if regional is not None and regional_need:
        out.append(Headroom(regional, sum(n for _, n in regional_need), tuple(p.name for p, _ in regional_need)))
    return tuple(out)


def check_name(value: str | None, flag: str, example: str) -> str:
    if value is None or not str(value).strip():
        raise AzureInputError(f"{flag} is required, e.g. {flag} {example}")
    text = str(value).strip()
    if "/" in text or any(c.isspace() for c in text):
        raise AzureInputError(f"{flag} {value!r} is not a resource name (no slashes or spaces), e.g. {example}")
    return text


def pools_report(client: ArmClient, cluster: str, resource_group: str, subscription: str | None = None) -> PoolsReport:
    """The cluster's pools, their quota headroom, and the findings (:mod:`.checks`)."""
    from remediation.azure.checks import pool_findings

    sub = subscription or client.session.subscription_id
    base = (f"/subscriptions/{sub}/resourceGroups/{resource_group}/providers/Microsoft.ContainerService/"
            f"managedClusters/{cluster}")
    managed = client.get(base, AKS_API) or {}
    location = str(managed.get("location") or "")
    pools = tuple(sorted((pool_from_dict(p) for p in client.list(base + "/agentPools", AKS_API)),
                         key=lambda p: p.name))
    usages = fetch_usages(client, location, sub) if location and any(p.is_gpu for p in pools) else []
    headroom = headroom_for(pools, usages, location)
    findings = tuple(pool_findings(cluster, pools, headroom, location, resource_group))
    return PoolsReport(sub, resource_group, cluster, location, pools, headroom, findings)
