"""The capacity chain of a Pending GPU pod: is its pool at ``maxCount``, is the VM family's vCPU quota used up?

The facts are the Azure area's (:mod:`remediation.azure`): AKS node pools (``AgentPools_List``, or ``az aks nodepool
list -o json``) parsed by :func:`remediation.azure.aks.pool_from_dict`, compute usages (``Usage_List``, or ``az vm
list-usage -o json``) by :func:`remediation.azure.quota.usages_from_json`, and the VM size table of
:mod:`remediation.core.skus` (vCPUs, quota family). This module only reads them from files (``--pools``, ``--usages``)
and says which limit to raise, naming the Azure commands (``invoke aks.pools``, ``invoke quota.plan``) that look at
them live; for a Spot pool the limit is the regional low-priority vCPU quota (``lowPriorityCores``), not the family's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remediation.azure.aks import NodePool, pool_from_dict
from remediation.azure.quota import LOW_PRIORITY_VCPUS, REGIONAL_VCPUS, QuotaUsage, find, usages_from_json
from remediation.core import skus
from remediation.k8s.errors import SnapshotError

__all__ = [
    "CapacityAdvice",
    "NodePool",
    "QuotaUsage",
    "advise",
    "nodepool_update",
    "placeholder",
    "pools_from_dict",
    "quota_words",
    "usages_from_dict",
    "vm_family",
    "vm_vcpus",
]


def vm_family(vm_size: str) -> str | None:
    """The quota family of an Azure GPU VM size (``Standard_NC24ads_A100_v4`` -> ``standardNCADSA100v4Family``)."""
    size = skus.size(vm_size)
    return size.family if size is not None and size.family else None


def vm_vcpus(vm_size: str) -> int | None:
    """vCPUs of an Azure GPU VM size, from the SKU table."""
    size = skus.size(vm_size)
    return size.vcpus if size is not None else None


def pools_from_dict(doc: Any, source: str = "pools") -> tuple[NodePool, ...]:
    """Node pools from ARM's list (``{"value": [...]}``) or a bare list (``az aks nodepool list -o json``)."""
    items = doc.get("value") if isinstance(doc, Mapping) else doc
    if not isinstance(items, list):
        raise SnapshotError(f'{source}: expected the AKS agentPools list as ARM returns it: {{"value": [...]}}')
    return tuple(pool_from_dict(item) for item in items if isinstance(item, Mapping))


def usages_from_dict(doc: Any, source: str = "usages") -> tuple[QuotaUsage, ...]:
    """Compute usages from ARM's list or ``az vm list-usage -o json``."""
    try:
        return tuple(usages_from_json(doc))
    except ValueError as exc:
        raise SnapshotError(f"{source}: {exc}") from None


@dataclass(frozen=True)
class CapacityAdvice:
    """Which limit keeps the pool from growing, and the command that looks at it (or raises it)."""

    pool: str | None
    vm_size: str | None
    nodes_needed: int
    at_max: bool | None  # None: pool not known
    family: str | None
    quota_current: int | None
    quota_limit: int | None
    vcpus_needed: int | None
    raise_: tuple[str, ...]  # "max_count", "quota" (both can be needed); () = neither is the limit
    lines: tuple[str, ...]
    commands: tuple[str, ...]
    # The quotas that have no room, each with its line: the family, "cores" (the regional vCPU total) or
    # "lowPriorityCores" (Spot); empty when no quota binds. K8S-PEND-008 and the report name exactly these.
    binding: tuple[tuple[str, str], ...] = ()
    # ``az aks nodepool update`` that lets the pool grow (None: the pool is not at its limit or not known)
    pool_command: str | None = None

    def quota_names(self) -> str:
        """The binding quotas in words: ``the regional vCPU total (cores)``, ``family F's vCPU quota``."""
        return " and ".join(quota_words(name) for name, _line in self.binding)


def quota_words(name: str) -> str:
    """A quota's name as on-call reads it."""
    if name == REGIONAL_VCPUS:
        return f"the regional vCPU total ({REGIONAL_VCPUS})"
    if name == LOW_PRIORITY_VCPUS:
        return f"the regional low-priority (Spot) vCPU quota ({LOW_PRIORITY_VCPUS})"
    return f"the {name} family vCPU quota"


#: What the caller passes when it does not know a value (the task's defaults): printed as a marked placeholder.
_UNKNOWN = frozenset({"", "CLUSTER", "RESOURCE_GROUP", "LOCATION"})


def placeholder(value: str | None, name: str) -> str:
    """``value``, or ``<name>`` when it is not known (empty or one of the tasks' placeholder defaults)."""
    return f"<{name}>" if value is None or value.strip() in _UNKNOWN else value


def nodepool_update(
    resource_group: str | None,
    cluster: str | None,
    pool: str | None,
    min_count: int | None,
    max_count: int | None,
    *,
    enable: bool = False,
) -> str:
    """``az aks nodepool update`` that sets the pool's autoscaler bounds: every argument it needs, with the values
    known and ``<marked>`` placeholders for the rest (az requires both --min-count and --max-count)."""
    flag = "--enable-cluster-autoscaler" if enable else "--update-cluster-autoscaler"
    low = str(min_count) if min_count is not None else "<min-count>"
    high = str(max_count) if max_count is not None else "<new-max-count>"
    return (
        f"az aks nodepool update -g {placeholder(resource_group, 'resource-group')} "
        f"--cluster-name {placeholder(cluster, 'cluster')} -n {placeholder(pool, 'pool')} {flag} "
        f"--min-count {low} --max-count {high}"
    )


def _pool_of(pools: Sequence[NodePool], name: str | None, gpu: bool) -> NodePool | None:
    if name:
        found = next((p for p in pools if p.name == name), None)
        if found is not None:
            return found
    if gpu:
        gpu_pools = [p for p in pools if p.is_gpu or any("gpu" in t.lower() for t in p.taints)]
        if len(gpu_pools) == 1:
            return gpu_pools[0]
    return None


def advise(
    pools: Sequence[NodePool],
    usages: Sequence[QuotaUsage],
    *,
    pool: str | None,
    gpus_wanted: int,
    gpus_per_node: int | None,
    vm_size: str | None = None,
    cluster: str = "",
    resource_group: str = "",
    location: str = "",
) -> CapacityAdvice:
    """What to raise so the pool can add the nodes a pod needs: the pool's ``maxCount``, the family quota, both.

    A Spot pool (``scaleSetPriority: Spot``) is weighed against the regional low-priority quota (``lowPriorityCores``)
    alone, and the remedy names ``invoke quota.plan ... --spot`` and ``invoke quota.request --family
    lowPriorityCores``.

    ``pool``: the pool the pod belongs on (from its candidate nodes); with no such node (a pool scaled to zero) the
    only GPU pool of ``pools`` is taken. Nodes needed: ``ceil(gpus_wanted / gpus_per_node)``, at least 1.

    A regular pool's growth must fit both its family's quota and the regional vCPU total (``cores``); ``binding``
    names the one(s) without room, so a full regional total is never told "raise the family quota".
    ``cluster``, ``resource_group``, ``location`` unknown (empty): the commands carry ``<cluster>``-style
    placeholders.
    """
    where = placeholder(location, "location")
    chosen = _pool_of(pools, pool, gpus_wanted > 0)
    size = chosen.vm_size if chosen is not None and chosen.vm_size else vm_size
    nodes = max(1, math.ceil(gpus_wanted / gpus_per_node)) if gpus_per_node and gpus_wanted else 1
    lines: list[str] = []
    raise_: list[str] = []
    commands = [
        f"invoke aks.pools --cluster {placeholder(cluster, 'cluster')} "
        f"--resource-group {placeholder(resource_group, 'resource-group')}"
    ]
    binding: list[tuple[str, str]] = []
    pool_command: str | None = None
    at_max: bool | None = None
    if chosen is not None:
        at_max = chosen.at_max or not chosen.autoscaling
        limits = f"count {chosen.count}, min {chosen.min_count}, max {chosen.max_count}"
        grown = max(chosen.count, chosen.max_count or 0) + nodes
        if not chosen.autoscaling:
            lines.append(f"pool {chosen.name} ({size}): autoscaling is off ({limits}): the autoscaler adds no node")
            raise_.append("max_count")
            pool_command = nodepool_update(resource_group, cluster, chosen.name, chosen.min_count, grown, enable=True)
        elif chosen.max_count is not None and chosen.count >= chosen.max_count:
            lines.append(f"pool {chosen.name} ({size}) is at maxCount ({limits}): raise maxCount")
            raise_.append("max_count")
            pool_command = nodepool_update(resource_group, cluster, chosen.name, chosen.min_count, grown)
        else:
            lines.append(f"pool {chosen.name} ({size}) can grow ({limits})")
    elif pools:
        lines.append(f"no pool named {pool!r} in the pools file ({', '.join(p.name for p in pools)})")
    spot = chosen is not None and chosen.spot
    # A Spot pool's VMs draw on the regional low-priority quota (lowPriorityCores), not on their family nor on cores.
    family = LOW_PRIORITY_VCPUS if spot else (vm_family(size) if size else None)
    vcpus = vm_vcpus(size) if size else None
    needed = vcpus * nodes if vcpus else None
    usage = find(usages, family) if family else None
    regional = None if spot else find(usages, REGIONAL_VCPUS)
    current = limit = None
    if usage is not None and needed is not None:
        what = f"Spot pool: low-priority quota {usage.name}" if spot else f"family {usage.name} quota"
        current, limit = usage.current, usage.limit
        if usage.current + needed > usage.limit:
            line = (
                f"{what}: {usage.current} of {usage.limit} vCPUs used; {nodes} more {size} "
                f"node(s) need {needed}: raise the limit to at least {usage.current + needed}"
            )
            lines.append(line)
            binding.append((usage.name, line))
        else:
            lines.append(f"{what}: {usage.current} of {usage.limit} vCPUs used, {needed} needed: fits")
    elif family and usages:
        lines.append(f"no usage entry for {'the Spot quota' if spot else 'family'} {family} in the usages file")
    if regional is not None and needed is not None:
        if regional.current + needed > regional.limit:
            line = (
                f"regional vCPU total ({REGIONAL_VCPUS}): {regional.current} of {regional.limit} vCPUs used, "
                f"{needed} needed: raise it to at least {regional.current + needed}"
                + (" too" if binding else "" if usage is None else " (the family has room: this total is the limit)")
            )
            lines.append(line)
            binding.append((REGIONAL_VCPUS, line))
        else:
            lines.append(
                f"regional vCPU total ({REGIONAL_VCPUS}): {regional.current} of {regional.limit} vCPUs used, "
                f"{needed} needed: fits"
            )
    if size:  # --spot: quota.plan weighs the nodes against lowPriorityCores alone, not family + cores
        commands.append(f"invoke quota.plan --location {where} --vm-size {size} --nodes {nodes}"
                        + (" --spot" if spot else ""))
    elif spot:
        commands.append(f"invoke quota.show --location {where} --family {LOW_PRIORITY_VCPUS}")
    if binding:
        raise_.append("quota")
        for name, _line in binding:  # the request for exactly the quota(s) without room, after the plan
            row = usage if usage is not None and usage.name == name else regional
            if row is not None and needed is not None:
                request = row.current + needed
                commands.append(f"invoke quota.request --location {where} --family {name} --vcpus {request}")
    if not raise_ and chosen is not None and usage is not None:
        lines.append(
            "neither maxCount nor the quota is the limit: look at the cluster autoscaler's events "
            "(scale-up backoff: VMSS allocation failure, subnet IP exhaustion)"
        )
    return CapacityAdvice(
        pool=chosen.name if chosen is not None else pool,
        vm_size=size,
        nodes_needed=nodes,
        at_max=at_max,
        family=family,
        quota_current=current,
        quota_limit=limit,
        vcpus_needed=needed,
        raise_=tuple(raise_),
        lines=tuple(lines),
        commands=tuple(commands),
        binding=tuple(binding),
        pool_command=pool_command,
    )
