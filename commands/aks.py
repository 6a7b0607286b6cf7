"""``invoke aks.pools``: AKS node pools against runbook S3 (maxCount, GPU taint, quota headroom), read-only."""

from __future__ import annotations

from typing import Any

from invoke import Collection, Exit, task

from commands import edge, format_help, formats, settings


@task(
    help={
        "cluster": "the AKS cluster name",
        "resource_group": "its resource group",
        "format": format_help("table", "json"),
        "subscription": "subscription id or name (default: the one `az account set` selected)",
    },
)
@edge
@formats("table", "json")
def pools(c, cluster=None, resource_group=None, format="table", subscription=None):  # type: ignore[no-untyped-def]
    """Node pools: count/min/max, autoscaling, size, taints, power; flags maxCount, GPU taints, quota headroom.

    Exit codes: 0 nothing to fix; 1 a pool at maxCount, a GPU pool without the taint, or quota short of maxCount;
    2 bad input or no `az login`; 3 ARM error.
    """
    from remediation.azure.api import AzureSettings, check_format, report
    from remediation.azure.api import pools as run
    from remediation.report.console import console

    fmt = check_format(format, ("table", "json"))
    result = run(settings(c, AzureSettings, "azure"), cluster=cluster, resource_group=resource_group,
                 subscription=subscription)
    if fmt == "json":
        print(report.pools_json(result))
    else:
        report.print_pools(console, result)
    raise Exit(code=result.exit_code)


ns: Any = Collection("aks", pools)
