"""The capacity chain of a Pending GPU pod: is its pool at ``maxCount``, is the VM family's vCPU quota used up?

A small adapter, kept apart on purpose: it reads offline facts in the shapes Azure Resource Manager returns them,

- AKS agent pools (``GET .../managedClusters/C/agentPools``, ``az aks nodepool list -o json`` wraps the same objects):
  ``{"value": [{"name", "properties": {"count", "minCount", "maxCount", "enableAutoScaling", "vmSize",
  "nodeTaints", "nodeLabels", "mode"}}]}``
- compute usages (``GET .../providers/Microsoft.Compute/locations/L/usages``):
  ``{"value": [{"currentValue", "limit", "name": {"value", "localizedValue"}, "unit"}]}``

parsed once by :func:`pools_from_dict` / :func:`usages_from_dict`, and says which limit to raise, naming the Azure
area's commands (``invoke aks.pools``, ``invoke quota.plan``) that look at them live. When the Azure package is in
the tree, these two parsers and the VM size table are the only things to point at it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remediation.k8s.errors import SnapshotError

__all__ = [
    "AgentPool",
    "CapacityAdvice",
    "Usage",
    "advise",
    "pools_from_dict",
    "usages_from_dict",
    "vm_family",
    "vm_vcpus",
]

#: GPU VM sizes -> their compute quota family (usages ``name.value``), from Azure's size and quota tables.
_FAMILIES: tuple[tuple[str, str], ...] = (
    (r"^standard_nc\d+ads_a100_v4$", "standardNCADSA100v4Family"),
    (r"^standard_nd\d+asr_v4$", "standardNDASv4_A100Family"),
    (r"^standard_nd\d+amsr_a100_v4$", "standardNDAMSv4_A100Family"),
    (r"^standard_nd\d+isr_h100_v5$", "standardNDSH100v5Family"),
    (r"^standard_nc\d+ads_h100_v5$", "standardNCadsH100v5Family"),
    (r"^standard_nc\d+adis_h100_v5$", "standardNCadsH100v5Family"),
    (r"^standard_nc\d+as_t4_v3$", "standardNCASv3_T4Family"),
    (r"^standard_nd\d+rs_v2$", "standardNDSv2Family"),
    (r"^standard_nc\d+r?s_v3$", "standardNCSv3Family"),
    (r"^standard_nd\d+r?s$", "standardNDSFamily"),
    (r"^standard_nv\d+ads_a10_v5$", "StandardNVADSA10v5Family"),
)


def vm_family(vm_size: str) -> str | None:
    """The quota family of an Azure GPU VM size (``Standard_NC24ads_A100_v4`` -> ``standardNCADSA100v4Family``)."""
    name = vm_size.strip().lower()
    return next((family for pattern, family in _FAMILIES if re.match(pattern, name)), None)


def vm_vcpus(vm_size: str) -> int | None:
    """vCPUs of an Azure VM size: the number in its name (``Standard_ND96asr_v4`` -> 96)."""
    match = re.match(r"^standard_[a-z]+?(\d+)", vm_size.strip().lower())
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class AgentPool:
    name: str
    count: int
    min_count: int | None
    max_count: int | None
    autoscaling: bool
    vm_size: str
    node_taints: tuple[str, ...]
    node_labels: dict[str, str]
    mode: str

    @property
    def at_max(self) -> bool:
        return self.max_count is not None and self.count >= self.max_count


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _entries(doc: Any, what: str, source: str) -> list[Mapping[str, Any]]:
    if isinstance(doc, Mapping) and isinstance(doc.get("value"), list):
        items = doc["value"]
    elif isinstance(doc, list):
        items = doc
    else:
        raise SnapshotError(f'{source}: expected {what} as ARM returns it: {{"value": [...]}}')
    return [item for item in items if isinstance(item, Mapping)]


def pools_from_dict(doc: Any, source: str = "pools") -> tuple[AgentPool, ...]:
    """Agent pools from ARM's list (``{"value": [...]}``) or a bare list; flat ``az`` objects are read too."""
    out = []
    for item in _entries(doc, "the AKS agentPools list", source):
        props = item.get("properties") if isinstance(item.get("properties"), Mapping) else item
        assert isinstance(props, Mapping)
        taints = props.get("nodeTaints")
        labels = props.get("nodeLabels")
        out.append(
            AgentPool(
                name=str(item.get("name", "")),
                count=_int(props.get("count")) or 0,
                min_count=_int(props.get("minCount")),
                max_count=_int(props.get("maxCount")),
                autoscaling=props.get("enableAutoScaling") is True,
                vm_size=str(props.get("vmSize", "")),
                node_taints=tuple(str(t) for t in taints) if isinstance(taints, list) else (),
                node_labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
                mode=str(props.get("mode", "")),
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Usage:
    name: str
    localized: str
    current: int
    limit: int
    unit: str

    @property
    def free(self) -> int:
        return self.limit - self.current


def usages_from_dict(doc: Any, source: str = "usages") -> tuple[Usage, ...]:
    """Compute usages from ARM's list; ``az vm list-usage -o json`` entries (strings) are read too."""
    out = []
    for item in _entries(doc, "the compute usages list", source):
        name = item.get("name")
        if isinstance(name, Mapping):
            value, localized = str(name.get("value", "")), str(name.get("localizedValue", ""))
        else:
            value, localized = str(name or ""), str(item.get("localName", ""))
        current, limit = _int(item.get("currentValue")), _int(item.get("limit"))
        if not value or current is None or limit is None:
            continue
        out.append(Usage(value, localized, current, limit, str(item.get("unit", "Count"))))
    return tuple(out)


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


def _pool_of(pools: Sequence[AgentPool], name: str | None, gpu: bool) -> AgentPool | None:
    if name:
        found = next((p for p in pools if p.name == name), None)
        if found is not None:
            return found
    if gpu:
        gpu_pools = [p for p in pools if vm_family(p.vm_size) or any("gpu" in t.lower() for t in p.node_taints)]
        if len(gpu_pools) == 1:
            return gpu_pools[0]
    return None


def advise(
    pools: Sequence[AgentPool],
    usages: Sequence[Usage],
    *,
    pool: str | None,
    gpus_wanted: int,
    gpus_per_node: int | None,
    vm_size: str | None = None,
    cluster: str = "CLUSTER",
    resource_group: str = "RESOURCE_GROUP",
    location: str = "LOCATION",
) -> CapacityAdvice:
    """What to raise so the pool can add the nodes a pod needs: the pool's ``maxCount``, the family quota, both.

    ``pool``: the pool the pod belongs on (from its candidate nodes); with no such node (a pool scaled to zero) the
    only GPU pool of ``pools`` is taken. Nodes needed: ``ceil(gpus_wanted / gpus_per_node)``, at least 1.
    """
    chosen = _pool_of(pools, pool, gpus_wanted > 0)
    size = chosen.vm_size if chosen is not None and chosen.vm_size else vm_size
    nodes = max(1, math.ceil(gpus_wanted / gpus_per_node)) if gpus_per_node and gpus_wanted else 1
    lines: list[str] = []
    raise_: list[str] = []
    commands = [f"invoke aks.pools --cluster {cluster} --resource-group {resource_group}"]
    at_max: bool | None = None
    if chosen is not None:
        at_max = chosen.at_max or not chosen.autoscaling
        limits = f"count {chosen.count}, min {chosen.min_count}, max {chosen.max_count}"
        if not chosen.autoscaling:
            lines.append(f"pool {chosen.name} ({size}): autoscaling is off ({limits}): the autoscaler adds no node")
            raise_.append("max_count")
        elif chosen.at_max:
            lines.append(f"pool {chosen.name} ({size}) is at maxCount ({limits}): raise maxCount")
            raise_.append("max_count")
        else:
            lines.append(f"pool {chosen.name} ({size}) can grow ({limits})")
    elif pools:
        lines.append(f"no pool named {pool!r} in the pools file ({', '.join(p.name for p in pools)})")
    family = vm_family(size) if size else None
    vcpus = vm_vcpus(size) if size else None
    needed = vcpus * nodes if vcpus else None
    usage = next((u for u in usages if family and u.name.lower() == family.lower()), None)
    regional = next((u for u in usages if u.name.lower() == "cores"), None)
    current = limit = None
    if usage is not None and needed is not None:
        current, limit = usage.current, usage.limit
        if usage.current + needed > usage.limit:
            lines.append(
                f"family {usage.name} quota: {usage.current} of {usage.limit} vCPUs used; {nodes} more {size} "
                f"node(s) need {needed}: raise the limit to at least {usage.current + needed}"
            )
            raise_.append("quota")
        else:
            lines.append(
                f"family {usage.name} quota: {usage.current} of {usage.limit} vCPUs used, {needed} needed: fits"
            )
    elif family and usages:
        lines.append(f"no usage entry for family {family} in the usages file")
    if regional is not None and needed is not None and regional.current + needed > regional.limit:
        lines.append(
            f"total regional vCPUs: {regional.current} of {regional.limit} used, {needed} needed: raise it too"
        )
        if "quota" not in raise_:
            raise_.append("quota")
    if size:
        commands.append(f"invoke quota.plan --location {location} --vm-size {size} --nodes {nodes}")
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
    )
