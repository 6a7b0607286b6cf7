"""Scene k8s: runbook S3 and S5 on Kubernetes, offline, against the local API stand-in and recorded snapshots.

1. the runbook's training pod Pending for 20 minutes; the event is in the 1.35 wording that names no taint;
   ``k8s.diagnose-pending`` asks the cluster (the API stand-in, through the real client and a kubeconfig), replays
   the scheduler's filters, names ``sku=gpu:NoSchedule``, prints the patch, and the patched pod schedules;
2. the same pod with its toleration, every GPU taken: capacity, the pool at maxCount and the family quota full;
3. the template that prevents it: the training Job rendered from its example values, checked against the
   Kubernetes schema, and scheduled onto the tainted GPU node by the same evaluator;
4. runbook S5: the inference pod's latency spike (OOMKilled restart, eviction, 164 s load, hot GPU, neighbours);
5. the alert rules (GPU temperature, Xid, GPU pods Pending).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.rule import Rule

from demo import Scene, SceneContext
from lab.services import k8s_scenarios as scenarios
from lab.services.k8s_api import FakeKubeApi, kubeconfig
from remediation.k8s.alerts import render_rules
from remediation.k8s.capacity import pools_from_dict, usages_from_dict
from remediation.k8s.evaluator import evaluate
from remediation.k8s.latency import diagnose_latency
from remediation.k8s.live import fetch_snapshot
from remediation.k8s.objects import node_from_dict, pod_from_dict
from remediation.k8s.patch import apply_patch
from remediation.k8s.pending import diagnose_pending
from remediation.k8s.render import load_values, render
from remediation.k8s.report import print_latency, print_pending
from remediation.k8s.snapshot import load_snapshot


def run(ctx: SceneContext) -> bool:
    console, root = ctx.console, ctx.root
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpufleet-k8s-demo-") as tmp:
        workdir = Path(tmp)
        console.print(Rule("1. S3: a training pod Pending for 20 minutes (no logs: a Pending pod has no container)"))
        cluster = scenarios.runbook_cluster()
        with FakeKubeApi(cluster["pods"], cluster["nodes"], cluster["events"]) as api:
            config = kubeconfig(api, workdir / "kubeconfig")
            console.print(
                f"$ invoke k8s.diagnose-pending --pod training-job-7b-xyz --namespace ml-team  (API at {api.url})"
            )
            state = fetch_snapshot("training-job-7b-xyz", "ml-team", str(config))
        first = diagnose_pending("", state)
        print_pending(first, console)
        ok &= first.verdict == "constraint" and any(f.id == "K8S-PEND-001" for f in first.findings)
        ok &= first.fix is not None and "sku" in first.fix.yaml and first.scheduled_on is not None
        if first.fix is not None and state.pod is not None:
            patched = pod_from_dict(apply_patch(state.pod.raw, first.fix.pod_ops))
            placed = [r.node.name for r in evaluate(patched, state.nodes, state.pods) if r.fits]
            console.print(f"the pod with the printed patch fits on: {', '.join(placed) or 'nothing'}", markup=False)
            ok &= bool(placed)

        console.print(Rule("2. S3 again: the toleration is there, the GPUs are not"))
        capacity = scenarios.capacity_cluster()
        snapshot_dir = scenarios.write_snapshot(capacity, workdir / "capacity")
        console.print(f"$ invoke k8s.diagnose-pending --snapshot {snapshot_dir.name}/ (pools.json, usages.json)")
        second = diagnose_pending(
            "",
            load_snapshot(snapshot_dir),
            pools_from_dict(capacity["pools"]),
            usages_from_dict(capacity["usages"]),
            cluster="myAKS",
            resource_group="myRG",
        )
        print_pending(second, console)
        ok &= second.verdict == "capacity" and second.capacity is not None
        ok &= second.capacity is not None and set(second.capacity.raise_) == {"max_count", "quota"}

        console.print(Rule("3. prevention: the training Job from the template (toleration preconfigured)"))
        values = root / "templates" / "k8s" / "examples" / "training-job.yaml"
        console.print("$ invoke k8s.render training-job --values templates/k8s/examples/training-job.yaml")
        rendered = render("training-job", load_values(values), root / "templates" / "k8s", "1.30", str(values))
        console.print(rendered.yaml, markup=False, highlight=False)
        job = rendered.documents[0]
        template = job["spec"]["template"]
        as_pod = pod_from_dict(
            {"kind": "Pod", "metadata": {**template["metadata"], "name": "from-template", "namespace": "ml-team"},
             "spec": template["spec"]}
        )
        gpu_nodes = [node_from_dict(n) for n in cluster["nodes"]]
        fits = [r.node.name for r in evaluate(as_pod, gpu_nodes) if r.fits]
        console.print(f"Kubernetes 1.30 schema: passed; the evaluator places it on {', '.join(fits)}", markup=False)
        ok &= bool(fits) and all("gpunp" in name for name in fits)

        console.print(Rule("4. S5: P99 from 200 ms to 3 s on the inference service"))
        latency = scenarios.latency_snapshot()
        latency_dir = scenarios.write_snapshot(latency, workdir / "latency")
        console.print(f"$ invoke k8s.diagnose-latency --snapshot {latency_dir.name}/")
        slow = diagnose_latency(load_snapshot(latency_dir), latency["logs"], latency["facts"], latency["metrics"])
        print_latency(slow, console)
        ids = {f.id for f in slow.findings}
        ok &= {"K8S-LAT-001", "K8S-LAT-002", "K8S-LAT-003", "K8S-LAT-004", "K8S-LAT-005"} <= ids
        ok &= any(i.startswith("GPU-THM") for i in ids)

        console.print(Rule("5. the alerts that catch both before users do"))
        console.print("$ invoke k8s.alerts")
        rules = render_rules()
        console.print(rules, markup=False, highlight=False)
        ok &= "DCGM_FI_DEV_GPU_TEMP" in rules and "kube_pod_status_phase" in rules
    return ok


SCENE = Scene("k8s", "S3/S5 on Kubernetes: Pending GPU pods, the fix, templates, latency spikes", run)
