"""The entry points the ``quota.*`` and ``aks.*`` tasks call: check every input, then log in, then talk to ARM.

Bad input (an unknown location, family or size, a limit that is not a whole number >= 0, a bad threshold or format)
is refused before the login is even read, so nothing is ever sent for it; a missing login or subscription is refused
before the first request (:mod:`.session`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from remediation.azure.aks import PoolsReport, check_name, pools_report
from remediation.azure.client import ArmClient
from remediation.azure.errors import AzureInputError
from remediation.azure.quota import (
    QuotaPlan,
    QuotaRequestResult,
    UsageReport,
    check_family,
    check_limit,
    check_size,
    fetch_usages,
    location_arg,
    plan,
    plan_counts,
    request_quota,
    usage_report,
    usages_from_text,
)
from remediation.azure.session import cli_session
from remediation.azure.settings import AzureSettings

__all__ = ["check_format", "check_threshold", "client_for", "pools", "quota_plan", "quota_request", "quota_show"]


def check_format(value: str | None, allowed: tuple[str, ...]) -> str:
    fmt = (value or allowed[0]).strip().lower()
    if fmt not in allowed:
        raise AzureInputError(f"--format {value!r} is not one of {', '.join(allowed)}")
    return fmt


def check_threshold(value: Any, settings: AzureSettings) -> float:
    raw = settings.threshold_pct if value is None else value
    try:
        pct = float(raw)
    except (TypeError, ValueError):
        raise AzureInputError(f"--threshold {value!r} is not a number: give a percentage such as 80") from None
    if not 0 < pct <= 100:
        raise AzureInputError(f"--threshold {pct:g} must be above 0 and at most 100 (a percentage of the limit)")
    return pct


def client_for(settings: AzureSettings, subscription: str | None = None) -> ArmClient:
    """A client for the ``az`` login (:class:`~.errors.AzureLoginError` when there is none)."""
    return ArmClient(cli_session(subscription), settings)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise AzureInputError(f"--from-file {path}: {exc.strerror}; pass a readable JSON file") from None


def quota_show(
    settings: AzureSettings,
    *,
    location: str | None,
    family: str | None = None,
    threshold: Any = None,
    from_file: str | None = None,
    subscription: str | None = None,
    client_factory: Callable[[AzureSettings, str | None], ArmClient] = client_for,
) -> UsageReport:
    """``quota.show``: the GPU families and regional vCPUs of ``location`` (or of ``from_file``, offline)."""
    pct = check_threshold(threshold, settings)
    fam = check_family(family)
    if from_file is not None:
        loc = location_arg(location, settings.extra_locations) if location else ""
        usages = usages_from_text(_read(from_file), from_file)
        return usage_report(usages, subscription=subscription or "", location=loc, threshold_pct=pct, family=fam,
                            source=from_file)
    loc = location_arg(location, settings.extra_locations)
    client = client_factory(settings, subscription)
    usages = fetch_usages(client, loc)
    return usage_report(usages, subscription=client.session.subscription_id, location=loc, threshold_pct=pct,
                        family=fam)


def quota_plan(
    settings: AzureSettings,
    *,
    location: str | None,
    vm_size: str | None,
    nodes: Any = None,
    gpus: Any = None,
    threshold: Any = None,
    from_file: str | None = None,
    subscription: str | None = None,
    spot: bool = False,
    client_factory: Callable[[AzureSettings, str | None], ArmClient] = client_for,
) -> QuotaPlan:
    """``quota.plan``: what N more nodes (or GPUs) of ``vm_size`` need, against the region's usage.

    ``spot``: Spot VMs, weighed against the regional low-priority quota (``lowPriorityCores``) alone.
    """
    pct = check_threshold(threshold, settings)
    size = check_size(vm_size)
    n_nodes, n_gpus = plan_counts(size, nodes, gpus)
    if from_file is not None:
        loc = location_arg(location, settings.extra_locations) if location else ""
        usages = usages_from_text(_read(from_file), from_file)
    else:
        loc = location_arg(location, settings.extra_locations)
        usages = fetch_usages(client_factory(settings, subscription), loc)
    return plan(usages, loc, size, n_nodes, n_gpus, pct, spot=bool(spot), source=from_file or "")


def quota_request(
    settings: AzureSettings,
    *,
    location: str | None,
    family: str | None,
    limit: Any,
    check: bool = False,
    confirm: Callable[[QuotaRequestResult], bool] | None = None,
    subscription: str | None = None,
    client_factory: Callable[[AzureSettings, str | None], ArmClient] = client_for,
) -> QuotaRequestResult:
    """``quota.request``: raise a family's limit to a new total (see :func:`~.quota.request_quota`)."""
    loc = location_arg(location, settings.extra_locations)
    if family is None or not str(family).strip():
        raise AzureInputError("--family is required: a GPU quota family such as standardNCADSA100v4Family")
    fam = check_family(family)
    assert fam is not None
    new_total = check_limit(limit)
    client = client_factory(settings, subscription)
    return request_quota(client, loc, fam, new_total, check=check, confirm=confirm)


def pools(
    settings: AzureSettings,
    *,
    cluster: str | None,
    resource_group: str | None,
    subscription: str | None = None,
    client_factory: Callable[[AzureSettings, str | None], ArmClient] = client_for,
) -> PoolsReport:
    """``aks.pools``: the cluster's node pools, their flags and their quota headroom."""
    name = check_name(cluster, "--cluster", "myAKS")
    rg = check_name(resource_group, "--resource-group", "myRG")
    client = client_factory(settings, subscription)
    return pools_report(client, name, rg)
