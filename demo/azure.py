"""Scene S3 against the local ARM service: GPU pods Pending because quota and pool limits stop the autoscaler.

1. what on-call runs first: ``invoke quota.show`` (a GPU family and the regional total past 80 %);
2. the same as the Prometheus textfile the 80 % alert rule reads;
3. ``invoke aks.pools``: the GPU pool at maxCount, a GPU pool without the taint, quota short of maxCount;
4. ``invoke quota.plan`` for three more A100 nodes: the new limit to ask for;
5. ``invoke quota.request --check``, then the request itself (accepted, polled to Succeeded);
6. a request Azure only grants through a support case (``ContactSupport``): exit 5, never retried.

Every command runs as on-call runs it, ``invoke`` in a shell, with an ``AZURE_CONFIG_DIR`` where a test service
principal of a test cloud (the local ARM, TLS from a throw-away CA) is logged in. Offline; about 15 seconds.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.rule import Rule

from demo import Scene, SceneContext
from lab.services.arm import ArmService, QuotaScript, make_test_ca, seed_demo, write_az_config


def _invoke(ctx: SceneContext, env: dict[str, str], args: list[str]) -> tuple[int, str]:
    ctx.console.print(f"$ invoke {shlex.join(args)}", style="bold", highlight=False, markup=False)
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, cwd=ctx.root,
                          env=env, timeout=300, check=False)
    text = proc.stdout + proc.stderr
    ctx.console.print(text.rstrip(), highlight=False, markup=False)
    ctx.console.print(f"(exit {proc.returncode})", style="dim")
    return proc.returncode, text


def run(ctx: SceneContext) -> bool:
    console = ctx.console
    with tempfile.TemporaryDirectory(prefix="gpufleet-arm-") as tmp:
        tls = make_test_ca(Path(tmp) / "tls")
        service = ArmService(tls, retry_after=1).start()
        try:
            seed_demo(service)
            config = write_az_config(Path(tmp) / "az", service, subscriptions=list(service.subscriptions.items()),
                                     default=next(iter(service.subscriptions)))
            env = {**os.environ, "AZURE_CONFIG_DIR": str(config), "REQUESTS_CA_BUNDLE": str(tls.ca)}
            console.print(f"local Azure Resource Manager at {service.endpoint}; `az login` state in a test"
                          " AZURE_CONFIG_DIR (service principal of a test cloud)", highlight=False)
            checks: list[bool] = []

            console.print(Rule("1. GPU pods Pending: is it quota?"))
            rc, out = _invoke(ctx, env, ["quota.show", "--location", "eastus"])
            checks.append(rc == 1 and "AZ-QUOTA-001" in out and "standardNDSv2Family" in out and "AZ-QUOTA-002" in out)

            console.print(Rule("2. the same, for Prometheus (the 80 % rule: monitoring/prometheus/)"))
            rc, out = _invoke(ctx, env, ["quota.show", "--location", "eastus", "--format", "prom"])
            checks.append(rc == 1 and 'gpufleet_azure_quota_used_ratio{' in out)

            console.print(Rule("3. the node pools: maxCount, taints, headroom"))
            rc, out = _invoke(ctx, env, ["aks.pools", "--cluster", "myAKS", "--resource-group", "myRG"])
            checks.append(rc == 1 and "AZ-AKS-001" in out and "AZ-AKS-002" in out and "AZ-QUOTA-003" in out)

            console.print(Rule("4. three more A100 nodes: what to ask for"))
            rc, out = _invoke(ctx, env, ["quota.plan", "--location", "eastus", "--vm-size",
                                         "Standard_NC24ads_A100_v4", "--nodes", "3"])
            checks.append(rc == 1 and "--vcpus 144" in out)

            console.print(Rule("5. the request: --check first, then for real"))
            request = ["quota.request", "--location", "eastus", "--family", "standardNCADSA100v4Family",
                       "--vcpus", "144"]
            rc, out = _invoke(ctx, env, [*request, "--check"])
            checks.append(rc == 0 and '"value": 144' in out)
            rc, out = _invoke(ctx, env, [*request, "--yes"])
            checks.append(rc == 0 and "limit now 144" in " ".join(out.split()))

            console.print(Rule("6. a quota Azure grants only through a support request"))
            service.script_quota(QuotaScript("Failed", polls=1, code="ContactSupport",
                                             message="Request failed, please contact support."))
            rc, out = _invoke(ctx, env, ["quota.request", "--location", "eastus", "--family", "standardNDSv2Family",
                                         "--vcpus", "96", "--yes"])
            puts = [r for r in service.arm_requests() if r.method == "PUT" and "standardNDSv2Family" in r.path]
            checks.append(rc == 5 and "open a support request" in out and len(puts) == 1)
            leaked = any(secret in out for secret in (service.token, service.client_secret))
            checks.append(not leaked)
        finally:
            service.stop()
    console.print(f"S3 scene: {sum(checks)}/{len(checks)} steps showed what they should")
    return all(checks)


SCENE = Scene("azure", "S3: GPU quota and AKS pools (local ARM): show, alert, pools, plan, request", run)
