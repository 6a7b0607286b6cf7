"""Regional GPU quota: what is used (show), what N more nodes need (plan), asking for more (request).

Usages come from Microsoft.Compute's usage list (``GET .../providers/Microsoft.Compute/locations/{location}/usages``,
api-version 2024-11-01; what ``az vm list-usage`` calls), or offline from a file holding either that REST answer
(``{"value": [{"currentValue": 17, "limit": 24, "name": {"value": ..., "localizedValue": ...}}]}``) or
``az vm list-usage -o json`` (a bare list, numbers as strings, ``localName``). Family names compare
case-insensitively. A request is Microsoft.Quota 2023-02-01's ``Quota_CreateOrUpdate``:
``PUT /subscriptions/{id}/providers/Microsoft.Compute/locations/{location}/providers/Microsoft.Quota/quotas/{family}``
with ``{"properties": {"limit": {"limitObjectType": "LimitValue", "value": N}, "name": {"value": family}}}``,
N being the new *total*; it is polled to ``Succeeded | Failed | Invalid``.

Spot VMs (an AKS pool's ``scaleSetPriority: Spot``) do not draw on their VM family's quota nor on ``cores``: they draw
on the region's low-priority vCPU quota, the usage row ``lowPriorityCores`` ("Total Regional Low-priority vCPUs"),
shared by every family. ``quota.request --family lowPriorityCores`` raises it through the same Microsoft.Quota call
(``resourceName`` is the usage's name; the 2023-02-01 spec types it as a free string), and ``quota.plan --spot`` weighs
N more Spot VMs against that row alone (a region without it: a limit of 0, Azure offers no Spot vCPUs there).

A VM family the usages have no row for is *unknown*, not 0/0: the file may be cut short or from another region, and
``quota.plan`` says so (:func:`missing_row`) instead of asking for a limit or calling it full.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remediation.azure.client import ArmClient, LroOutcome
from remediation.azure.errors import AzureInputError, ContactSupportError, QuotaRequestFailed
from remediation.azure.regions import normalize_location
from remediation.core import skus
from remediation.core.exitcodes import ExitCode

__all__ = [
    "COMPUTE_API",
    "LOW_PRIORITY_VCPUS",
    "QUOTA_API",
    "REGIONAL_VCPUS",
    "SPOT_QUOTA_LABEL",
    "QuotaPlan",
    "QuotaRequestResult",
    "QuotaUsage",
    "UsageReport",
    "check_family",
    "check_limit",
    "check_size",
    "fetch_usages",
    "low_priority_usage",
    "missing_row",
    "plan",
    "plan_counts",
    "quota_request_body",
    "request_quota",
    "usage_report",
    "usages_from_json",
    "usages_from_text",
]

COMPUTE_API = "2024-11-01"
QUOTA_API = "2023-02-01"
REGIONAL_VCPUS = "cores"  # Microsoft.Compute's name for "Total Regional vCPUs"
# Microsoft.Compute's name for "Total Regional Low-priority vCPUs": the quota Spot VMs of every family draw on
LOW_PRIORITY_VCPUS = "lowPriorityCores"
LOW_PRIORITY_LOCALIZED = "Total Regional Low-priority vCPUs"
# How quota.plan --spot names it (table and JSON): what it is, then the usage name to request it by
SPOT_QUOTA_LABEL = f"regional low-priority (Spot) vCPUs, {LOW_PRIORITY_VCPUS}"
SUPPORT_HINT = (
    "open a support request: Azure portal > Help + support > Create a support request > Service and subscription"
    " limits (quotas) > Compute-VM (cores-vCPUs) subscription limit increases"
)


@dataclass(frozen=True)
class QuotaUsage:
    """One usage line: a quota family (or ``cores``) with its current value and limit, in vCPUs."""

    name: str
    localized: str
    current: int
    limit: int

    @property
    def pct(self) -> float | None:
        """Percent of the limit in use; None when the limit is 0 (nothing can be used, nothing is)."""
        if self.limit <= 0:
            return None if self.current <= 0 else math.inf
        return 100.0 * self.current / self.limit

    @property
    def free(self) -> int:
        return max(0, self.limit - self.current)

    @property
    def is_gpu(self) -> bool:
        return skus.is_gpu_family(self.name)

    @property
    def is_regional(self) -> bool:
        return self.name.lower() == REGIONAL_VCPUS

    @property
    def is_low_priority(self) -> bool:
        """The regional low-priority (Spot) vCPU quota, ``lowPriorityCores``."""
        return self.name.lower() == LOW_PRIORITY_VCPUS.lower()

    def at_or_over(self, threshold_pct: float) -> bool:
        pct = self.pct
        return pct is not None and pct >= threshold_pct

    def to_dict(self) -> dict[str, Any]:
        pct = self.pct
        return {
            "name": self.name,
            "localizedValue": self.localized,
            "currentValue": self.current,
            "limit": self.limit,
            "percentUsed": None if pct is None else (round(pct, 1) if math.isfinite(pct) else "inf"),
        }


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{where} must be a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ValueError(f"{where} must be a whole number, got {value!r}")


def usages_from_json(data: Any) -> list[QuotaUsage]:
    """Usages from the REST answer (``{"value": [...]}``) or ``az vm list-usage -o json`` (a list, strings).

    Raises ``ValueError`` naming the first malformed entry.
    """
    items = data.get("value") if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise ValueError('not a usage list: expected {"value": [...]} (REST) or a JSON list (az vm list-usage -o json)')
    out: list[QuotaUsage] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValueError(f"usage [{i}] is not an object: {item!r}")
        name = item.get("name")
        if isinstance(name, Mapping):
            value, localized = name.get("value"), name.get("localizedValue")
        else:
            value, localized = name, None
        if not value:
            raise ValueError(f"usage [{i}] has no name.value")
        localized = localized or item.get("localName") or value
        out.append(
            QuotaUsage(
                name=str(value),
                localized=str(localized),
                current=_int(item.get("currentValue"), f"usage [{i}] ({value}) currentValue"),
                limit=_int(item.get("limit"), f"usage [{i}] ({value}) limit"),
            )
        )
    return out


def usages_from_text(text: str, source: str) -> list[QuotaUsage]:
    """:func:`usages_from_json` over a file's text; :class:`AzureInputError` naming the file otherwise."""
    try:
        return usages_from_json(json.loads(text))
    except ValueError as exc:
        raise AzureInputError(
            f"{source}: {exc}; --from-file takes the REST answer of the usages call or `az vm list-usage -o json`"
        ) from None


def check_family(name: str | None) -> str | None:
    """``name`` as the size table spells it, ``cores`` for the regional total, ``lowPriorityCores`` for the Spot
    quota, None for None; else bad input."""
    if name is None:
        return None
    if name.strip().lower() == REGIONAL_VCPUS:
        return REGIONAL_VCPUS
    if name.strip().lower() == LOW_PRIORITY_VCPUS.lower():
        return LOW_PRIORITY_VCPUS
    known = skus.family_name(name)
    if known is None:
        current = sorted({s.family for s in skus.SIZES.values()}, key=str.lower)
        raise AzureInputError(
            f"unknown quota family {name!r}: GPU families are {', '.join(current)} (or cores for the regional"
            f" total, {LOW_PRIORITY_VCPUS} for Spot VMs); `invoke quota.show --location L` lists a region's families"
        )
    return known


def check_limit(value: Any) -> int:
    """``--vcpus`` (quota.request) as a whole number >= 0; bad input otherwise."""
    text = str(value).strip() if value is not None else ""
    if not text.lstrip("-").isdigit():
        raise AzureInputError(f"--vcpus {value!r} is not a whole number: give the new total limit in vCPUs, e.g. 48")
    limit = int(text)
    if limit < 0:
        raise AzureInputError(f"--vcpus {limit} is negative: give the new total limit in vCPUs, e.g. 48")
    return limit


def fetch_usages(client: ArmClient, location: str, subscription: str | None = None) -> list[QuotaUsage]:
    """The region's compute usages (every page)."""
    sub = subscription or client.session.subscription_id
    path = f"/subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}/usages"
    try:
        return usages_from_json({"value": list(client.list(path, COMPUTE_API))})
    except ValueError as exc:
        raise AzureInputError(f"the usages ARM returned for {location} are not readable: {exc}") from None


def find(usages: Iterable[QuotaUsage], name: str) -> QuotaUsage | None:
    key = name.lower()
    return next((u for u in usages if u.name.lower() == key), None)


def missing_row(name: str, source: str, location: str = "") -> str:
    """Why a quota is unknown: ``source`` (the file read, or the region) has no usage row for ``name``."""
    where = source or location or "the usages"
    if location and source and source != location:
        where = f"{source} ({location})"
    return (f"no usage row for {name} in {where}: run `invoke quota.show --location {location or '<location>'}` to"
            " see the families the region lists")


def low_priority_usage(usages: Iterable[QuotaUsage]) -> QuotaUsage:
    """The region's ``lowPriorityCores`` row, the quota Spot VMs of every family draw on.

    A region without the row offers no Spot vCPUs: a limit of 0, as for a family it does not list.
    """
    return find(usages, LOW_PRIORITY_VCPUS) or QuotaUsage(LOW_PRIORITY_VCPUS, LOW_PRIORITY_LOCALIZED, 0, 0)


@dataclass(frozen=True)
class UsageReport:
    """``quota.show``: the GPU families and the regional total of one region, with the threshold applied."""

    subscription: str
    location: str
    threshold_pct: float
    rows: tuple[QuotaUsage, ...]
    source: str  # "arm" or the file read
    collected_at: float

    @property
    def flagged(self) -> tuple[QuotaUsage, ...]:
        return tuple(u for u in self.rows if u.at_or_over(self.threshold_pct))

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FINDINGS if self.flagged else ExitCode.OK


def usage_report(
    usages: Sequence[QuotaUsage],
    *,
    subscription: str,
    location: str,
    threshold_pct: float,
    family: str | None = None,
    source: str = "arm",
) -> UsageReport:
    """The rows ``quota.show`` prints: GPU families (all, or ``family``) and the regional vCPU total."""
    if family is not None:
        rows = [u for u in usages if u.name.lower() == family.lower()]
        if not rows:
            raise AzureInputError(
                f"quota family {family} is not in the usages of {location or 'the file'}: the region does not offer"
                " it; `invoke quota.show --location L` lists what it offers"
            )
    else:
        rows = [u for u in usages if u.is_gpu]
    regional = find(usages, REGIONAL_VCPUS)
    if regional is not None and regional not in rows:
        rows.append(regional)
    rows.sort(key=lambda u: (u.is_regional, -(u.pct or 0.0) if u.pct is not None else 0.0, u.name.lower()))
    return UsageReport(subscription, location, threshold_pct, tuple(rows), source, time.time())


@dataclass(frozen=True)
class QuotaNeed:
    """One quota (a family or the regional total) against what the plan adds."""

    usage: QuotaUsage
    needed: int  # vCPUs the plan adds
    unknown: str = ""  # why the usage is not known (no usage row, :func:`missing_row`); "" when it is

    @property
    def known(self) -> bool:
        return not self.unknown

    @property
    def new_total(self) -> int:
        return self.usage.current + self.needed

    @property
    def fits(self) -> bool:
        """False also when the usage is unknown (:attr:`known`): nothing says it fits."""
        return self.known and self.new_total <= self.usage.limit

    def headroom_limit(self, threshold_pct: float) -> int:
        """The limit that keeps the new total under the alert threshold."""
        return max(self.new_total, math.ceil(self.new_total * 100.0 / threshold_pct))


@dataclass(frozen=True)
class QuotaPlan:
    """``quota.plan``: N more nodes (or GPUs) of one size, as vCPUs of its family and of the regional total.

    ``spot``: Spot VMs; ``family`` is then the need on the regional low-priority quota (``lowPriorityCores``), the only
    quota they draw on, and ``regional`` is None.
    """

    location: str
    size: skus.VmSize
    nodes: int
    gpus: int
    vcpus: int
    family: QuotaNeed
    regional: QuotaNeed | None
    threshold_pct: float
    spot: bool = False

    @property
    def needs(self) -> tuple[QuotaNeed, ...]:
        """Every quota the plan draws on: the family (or, for Spot, ``lowPriorityCores``), then ``cores``."""
        return (self.family,) if self.regional is None else (self.family, self.regional)

    @property
    def fits(self) -> bool:
        return all(n.fits for n in self.needs)

    @property
    def unknown(self) -> tuple[QuotaNeed, ...]:
        """The needs whose usage the input has no row for."""
        return tuple(n for n in self.needs if not n.known)

    @property
    def exit_code(self) -> ExitCode:
        """OK fits; FINDINGS a request is needed; BAD_INPUT a quota is unknown (the usages lack its row)."""
        if self.unknown:
            return ExitCode.BAD_INPUT
        return ExitCode.OK if self.fits else ExitCode.FINDINGS


def check_size(name: str | None) -> skus.VmSize:
    if not name:
        raise AzureInputError("--vm-size is required: an Azure GPU VM size such as Standard_NC24ads_A100_v4")
    found = skus.size(name)
    if found is None:
        raise AzureInputError(
            f"unknown GPU VM size {name!r}: GPU sizes are {', '.join(sorted(skus.SIZES))}"
        )
    return found


def plan_counts(size: skus.VmSize, nodes: Any, gpus: Any) -> tuple[int, int]:
    """(nodes, gpus) from ``--nodes`` or ``--gpus`` (exactly one, a whole number >= 1)."""
    if (nodes is None) == (gpus is None):
        raise AzureInputError("give exactly one of --nodes N or --gpus N (how many more the pool needs)")
    flag, raw = ("--nodes", nodes) if nodes is not None else ("--gpus", gpus)
    text = str(raw).strip()
    if not text.isdigit() or int(text) < 1:
        raise AzureInputError(f"{flag} {raw!r} must be a whole number of at least 1")
    count = int(text)
    if flag == "--nodes":
        return count, count * size.gpu_count
    n = math.ceil(count / size.gpu_count)
    return n, n * size.gpu_count


def plan(
    usages: Sequence[QuotaUsage],
    location: str,
    size: skus.VmSize,
    nodes: int,
    gpus: int,
    threshold_pct: float,
    *,
    spot: bool = False,
    source: str = "",
) -> QuotaPlan:
    """What ``nodes`` more VMs of ``size`` need against the region's usages (pure).

    Regular VMs draw on their family and on ``cores``; Spot VMs (``spot``) only on ``lowPriorityCores``
    (:func:`low_priority_usage`: a region without the row has a limit of 0). A family without a usage row is unknown
    (:func:`missing_row`, ``source`` naming the file read), never 0/0.
    """
    vcpus = nodes * size.vcpus
    if spot:
        low = QuotaNeed(low_priority_usage(usages), vcpus)
        return QuotaPlan(location, size, nodes, gpus, vcpus, low, None, threshold_pct, spot=True)
    fam = find(usages, size.family)
    need = (QuotaNeed(fam, vcpus) if fam is not None else
            QuotaNeed(QuotaUsage(size.family, size.family, 0, 0), vcpus, missing_row(size.family, source, location)))
    regional = find(usages, REGIONAL_VCPUS)
    return QuotaPlan(
        location, size, nodes, gpus, vcpus, need,
        None if regional is None else QuotaNeed(regional, vcpus), threshold_pct,
    )


def quota_scope(subscription: str, location: str) -> str:
    return f"subscriptions/{subscription}/providers/Microsoft.Compute/locations/{location}"


def quota_request_body(family: str, limit: int) -> dict[str, Any]:
    """Microsoft.Quota 2023-02-01 ``CurrentQuotaLimitBase`` for a new total ``limit`` of ``family``."""
    return {"properties": {"limit": {"limitObjectType": "LimitValue", "value": int(limit)}, "name": {"value": family}}}


@dataclass(frozen=True)
class QuotaRequestResult:
    """What ``quota.request`` did: ``outcome`` is sufficient | check | declined | succeeded."""

    subscription: str
    location: str
    family: str
    current: int
    limit_before: int
    requested: int
    outcome: str
    message: str = ""
    limit_after: int | None = None
    request_id: str = ""
    body: Mapping[str, Any] | None = None
    polls: int = 0
    throttled: int = 0

    @property
    def exit_code(self) -> ExitCode:
        """OK: granted, already sufficient, checked or declined (failures are raised, with their own codes)."""
        return ExitCode.OK


def request_quota(
    client: ArmClient,
    location: str,
    family: str,
    limit: int,
    *,
    check: bool = False,
    confirm: Callable[[QuotaRequestResult], bool] | None = None,
    subscription: str | None = None,
) -> QuotaRequestResult:
    """Raise ``family``'s limit in ``location`` to ``limit`` (the new total); see the module docstring.

    No request when the limit already is ``limit`` or more; :class:`AzureInputError` (nothing sent) for a limit below
    the current usage; :class:`ContactSupportError` when Azure answers ``ContactSupport`` (never retried);
    :class:`QuotaRequestFailed` for any other ``Failed``/``Invalid``.
    """
    sub = subscription or client.session.subscription_id
    usage = find(fetch_usages(client, location, sub), family)
    if usage is None:
        raise AzureInputError(
            f"quota family {family} is not offered in {location} (not in the region's usage list): pick a region"
            " that has it (`invoke quota.show --location L`)"
        )
    base = QuotaRequestResult(sub, location, usage.name, usage.current, usage.limit, limit, "check")
    if limit < usage.current:
        raise AzureInputError(
            f"--vcpus {limit} is below the current usage of {usage.name} in {location} ({usage.current} vCPUs in use):"
            f" a new total must be at least {usage.current}; nothing was requested"
        )
    if usage.limit >= limit:
        return _replace(base, outcome="sufficient",
                        message=f"limit {usage.limit} already covers {limit}: nothing requested")
    body = quota_request_body(usage.name, limit)
    base = _replace(base, body=body)
    if check:
        return _replace(base, outcome="check", message="--check: nothing requested")
    if confirm is not None and not confirm(base):
        return _replace(base, outcome="declined", message="not confirmed: nothing requested")
    path = f"/{quota_scope(sub, location)}/providers/Microsoft.Quota/quotas/{usage.name}"
    first = client.send("PUT", client.url(path, QUOTA_API), body)
    outcome: LroOutcome = client.wait(first, f"quota request {usage.name} -> {limit} in {location}")
    request_id = _request_id(outcome.body)
    state = outcome.state
    if not outcome.succeeded:
        message = outcome.error_message or _props(outcome.body).get("message") or state
        code = outcome.error_code or state
        if code.lower() == "contactsupport" or "contact support" in str(message).lower():
            raise ContactSupportError(
                f"quota request {usage.name} {usage.limit} -> {limit} in {location} ended {state}: {code}: {message};"
                f" Azure will not raise this limit automatically: {SUPPORT_HINT}"
                + (f" (quote quota request {request_id})" if request_id else "")
            )
        raise QuotaRequestFailed(
            f"quota request {usage.name} {usage.limit} -> {limit} in {location} ended {state}: {code}: {message}"
            + (f" (quota request {request_id})" if request_id else "")
        )
    after = client.get(path, QUOTA_API)
    limit_after = (_props(after).get("limit") or {}).get("value") if isinstance(after, Mapping) else None
    return _replace(
        base, outcome="succeeded", message=str(_props(outcome.body).get("message") or "Succeeded"),
        limit_after=int(limit_after) if isinstance(limit_after, int) else None, request_id=request_id,
        polls=outcome.polls, throttled=client.stats.throttled,
    )


def _props(body: Any) -> dict[str, Any]:
    if isinstance(body, Mapping) and isinstance(body.get("properties"), Mapping):
        return dict(body["properties"])
    return {}


def _request_id(body: Any) -> str:
    if isinstance(body, Mapping):
        return str(body.get("name") or "")
    return ""


def _replace(result: QuotaRequestResult, **changes: Any) -> QuotaRequestResult:
    from dataclasses import replace

    return replace(result, **changes)


def location_arg(location: str | None, extra: Iterable[str] = ()) -> str:
    """``--location`` checked (see :func:`~.regions.normalize_location`)."""
    return normalize_location(location, extra)
