"""``invoke quota.show | quota.plan | quota.request``: regional GPU quota (runbook S3), through the ``az`` login."""

from __future__ import annotations

import sys
from typing import Any

from invoke import Collection, Exit, task

from commands import NumbersTask, ask, edge, format_help, formats, renamed, require_confirmation, settings

_LOCATION = "Azure region, e.g. eastus"
_SUBSCRIPTION = "subscription id or name (default: the one `az account set` selected)"
_FROM_FILE = "read usages from a file instead of ARM: the REST answer or `az vm list-usage -o json` (offline)"


def _settings(c: Any) -> Any:
    from remediation.azure.api import AzureSettings

    return settings(c, AzureSettings, "azure")


@task(
    help={
        "location": _LOCATION,
        "family": "only this quota family (e.g. standardNCADSA100v4Family; case-insensitive)",
        "threshold": "flag quotas at or above this percent of their limit (default azure.threshold_pct, 80)",
        "format": format_help("table", "json", "prom", prom="node_exporter textfile, joins the audit's gpufleet.prom"),
        "out": "write the report here (atomically) instead of stdout",
        "from_file": _FROM_FILE,
        "subscription": _SUBSCRIPTION,
    },
)
@edge
@formats("table", "json", "prom")
def show(  # type: ignore[no-untyped-def]
    c, location=None, family=None, threshold=None, format="table", out=None, from_file=None, subscription=None
):
    """GPU quota of a region: usage, limit, % per GPU family and the regional vCPU total; flags >= 80 %.

    Exit codes: 0 nothing at or above the threshold; 1 a quota is; 2 bad input or no `az login`; 3 ARM error.
    """
    from remediation.azure.api import check_format, quota_show, report
    from remediation.report.console import console

    fmt = check_format(format, ("table", "json", "prom"))
    result = quota_show(_settings(c), location=location, family=family, threshold=threshold, from_file=from_file,
                        subscription=subscription)
    if fmt == "table":
        if out:
            from rich.console import Console

            with open(out, "w") as fh:
                report.print_quota(Console(file=fh, width=160, highlight=False), result)
        else:
            report.print_quota(console, result)
    else:
        text = report.quota_json(result) + "\n" if fmt == "json" else report.quota_prometheus(result)
        if out:
            report.write_atomic(out, text)
        else:
            sys.stdout.write(text)
    raise Exit(code=result.exit_code)


@task(
    help={
        "location": _LOCATION,
        "vm_size": "the GPU VM size the nodes would be, e.g. Standard_NC24ads_A100_v4",
        "nodes": "how many more nodes (VMs)",
        "gpus": "or: how many more GPUs (rounded up to whole VMs)",
        "threshold": "percent to stay under when suggesting a limit with headroom (default 80)",
        "format": format_help("table", "json"),
        "from_file": _FROM_FILE,
        "subscription": _SUBSCRIPTION,
        "spot": "Spot VMs (an AKS pool with scaleSetPriority: Spot): weigh them against the regional low-priority"
        " vCPU quota (lowPriorityCores) alone, not their family nor cores",
    },
)
@edge
@formats("table", "json")
def plan(  # type: ignore[no-untyped-def]
    c, location=None, vm_size=None, nodes=None, gpus=None, threshold=None, format="table", from_file=None,
    subscription=None, spot=False,
):
    """What N more GPU nodes need: vCPUs of which family, against usage and limit; the limit to request, or fits.

    --spot: Spot VMs draw on the regional low-priority vCPU quota (lowPriorityCores) instead of family + cores.

    A family the usages have no row for is reported unknown (not 0/0): `invoke quota.show --location L` lists them.

    Exit codes: 0 fits; 1 a quota request is needed; 2 bad input, no `az login`, or a quota unknown (no usage row);
    3 ARM error.
    """
    from remediation.azure.api import check_format, quota_plan, report
    from remediation.report.console import console

    fmt = check_format(format, ("table", "json"))
    result = quota_plan(_settings(c), location=location, vm_size=vm_size, nodes=nodes, gpus=gpus,
                        threshold=threshold, from_file=from_file, subscription=subscription, spot=spot)
    if fmt == "json":
        print(report.plan_json(result))
    else:
        report.print_plan(console, result)
    raise Exit(code=result.exit_code)


@task(
    klass=NumbersTask,
    numbers=("vcpus",),
    help={
        "location": _LOCATION,
        "family": "the quota family, e.g. standardNCADSA100v4Family (cores: the regional vCPU total)",
        "vcpus": "the family's new TOTAL vCPU limit, a whole number (not an increment)",
        "limit": "renamed --vcpus (--limit is the fleet's host pattern on every other task): refused, exit 2",
        "check": "show what would be requested, then stop: nothing is sent but reads (--dry-run is an alias)",
        "dry_run": "alias of --check",
        "yes": "request without asking",
        "format": format_help("table", "json"),
        "subscription": _SUBSCRIPTION,
    },
)
@edge
@renamed(limit="vcpus")
@formats("table", "json")
def request(  # type: ignore[no-untyped-def]
    c, location=None, family=None, vcpus=None, check=False, dry_run=False, yes=False, format="table",
    subscription=None, limit=None,
):
    """Ask Azure for a higher GPU quota (Microsoft.Quota), wait for the answer; nothing sent when it is enough.

    Exit codes: 0 granted, already sufficient, or --check; 1 the request Failed/Invalid; 2 bad input (a limit below
    usage included) or no `az login`; 3 ARM error; 5 Azure wants a support request (ContactSupport, never retried).
    """
    from remediation.azure.api import check_format, quota_request, report
    from remediation.report.console import console

    fmt = check_format(format, ("table", "json"))
    check = bool(check or dry_run)
    require_confirmation("quota.request asks Azure for more quota", check=check, yes=yes, preview="to see the request")

    def confirm(pending: Any) -> bool:
        if yes:
            return True
        report.print_request(console, pending)
        return ask(f"request a new {pending.family} limit of {pending.requested} in {pending.location}")

    result = quota_request(_settings(c), location=location, family=family, limit=vcpus, check=check,
                           confirm=confirm, subscription=subscription)
    if fmt == "json":
        print(report.request_json(result))
    else:
        report.print_request(console, result)
    raise Exit(code=result.exit_code)


ns: Any = Collection("quota", show, plan, request)
