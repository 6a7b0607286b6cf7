"""Findings about Kubernetes GPU workloads: pods stuck Pending (S3) and inference latency spikes (S5).

The S3 findings come from :mod:`remediation.k8s.pending` (``invoke k8s.diagnose-pending`` and the ``invoke
diagnose`` kinds ``failed-scheduling`` / ``k8s-events``); the S5 findings from :mod:`remediation.k8s.latency`
(``invoke k8s.diagnose-latency``; GPU heat there reuses the host audit's GPU-THM-* rules on the node's facts).
Remedies name the template values of ``templates/k8s/`` that apply them.
"""

from __future__ import annotations

from remediation.core.catalog.entry import CatalogEntry, Runbook
from remediation.core.findings import Scenario, Severity

__all__ = ["ENTRIES"]

# --- S3: AKS GPU pods stuck in Pending ---------------------------------------------------------------------------

_S3_SYMPTOMS = (
    "`kubectl get pods -n ml-team` shows a GPU pod (e.g. training-job-7b-xyz) Pending for 20 minutes, 0/1 ready, "
    "0 restarts. A Pending pod has no container, so it has no logs: `kubectl logs` shows nothing."
)
_S3_DIAGNOSIS = (
    "- `kubectl describe pod <pod> -n <namespace>` and read the Events (FailedScheduling), e.g. `0/12 nodes are "
    "available: 3 "
    "node(s) had untolerated taint {sku: gpu}, 9 node(s) didn't match Pod's node affinity/selector.`\n"
    "- `invoke k8s.diagnose-pending --pod <pod> --namespace <namespace>` (or `--events <events-file>`, "
    "`--snapshot <snapshot-dir>`): replays the "
    "scheduler's filters on the nodes, names the taint even when the message hides it (1.35+), says constraint, "
    "capacity or node state, and prints the patch\n"
    "- Quota: `az vm list-usage --location eastus -o table | grep -i 'Standard NC\\|Standard ND'` "
    "(`invoke quota.show --location <location>`)\n"
    "- Pool limits: `az aks nodepool show --cluster-name myAKS --resource-group myRG --name gpunp --query "
    "'{min:minCount, max:maxCount, current:count}'` (`invoke aks.pools --cluster <cluster> --resource-group "
    "<resource-group>`)"
)
_S3_ROOT_CAUSE = (
    "The pod spec lacks the toleration the GPU pool's taint needs: AKS GPU node pools carry `sku=gpu:NoSchedule`, "
    "so the scheduler sees the GPU nodes as ineligible. Other common causes: the GPU quota is used up (the cluster "
    "autoscaler cannot provision nodes), or the node pool is at maxCount (the autoscaler wants to scale but may not)."
)
_S3_RESOLUTION = (
    "- Add the toleration to the pod spec: `tolerations: [{key: sku, operator: Equal, value: gpu, effect: "
    "NoSchedule}]` with `resources.limits: {nvidia.com/gpu: 1}` (the `kubectl patch` printed by "
    "`invoke k8s.diagnose-pending`)\n"
    "- Quota: `az quota create --resource-name StandardNDSv2Family --scope /subscriptions/SUB/providers/"
    "Microsoft.Compute/locations/eastus --limit-object value=48 limit-object-type=LimitValue` "
    "(`invoke quota.plan`, `invoke quota.request`)\n"
    "- Pool at maxCount: raise it (`az aks nodepool update -g <resource-group> --cluster-name <cluster> -n <pool> "
    "--update-cluster-autoscaler --min-count <min-count> --max-count <new-max-count>`; az wants both counts)"
)
_S3_PREVENTION = (
    "- Render every GPU pod spec from a template with the toleration preconfigured "
    "(`invoke k8s.render training-job|inference`)\n"
    "- Alert at 80 % of GPU quota; alert on GPU pods Pending longer than N minutes (`invoke k8s.alerts`)\n"
    "- Configure the cluster autoscaler with headroom in maxCount"
)


def _s3(**overrides: str) -> Runbook:
    sections = {
        "symptoms": _S3_SYMPTOMS,
        "diagnosis": _S3_DIAGNOSIS,
        "root_cause": _S3_ROOT_CAUSE,
        "resolution": _S3_RESOLUTION,
        "prevention": _S3_PREVENTION,
    }
    sections.update(overrides)
    return Runbook(**sections)


# --- S5: inference latency spike ---------------------------------------------------------------------------------

_S5_SYMPTOMS = 'P99 latency jumps from 200 ms to 3 s with no deployment and no configuration change: "the AI is slow".'
_S5_DIAGNOSIS = (
    "- `nvidia-smi --query-gpu=utilization.gpu,utilization.memory,temperature.gpu --format=csv -l 2`\n"
    "- `kubectl get pods -n inference -w`; `kubectl describe pod model-serve-abc -n inference | grep -A 5 "
    "'Last State'` (did the container restart, and why)\n"
    "- `kubectl logs model-serve-abc -n inference | grep -i 'model loaded\\|loading model'` (e.g. `Model loaded in "
    "164.2 seconds`: almost 3 minutes of latency hole at every restart)\n"
    "- `invoke k8s.diagnose-latency --snapshot <snapshot-dir>` (restarts and their cause, model load time, the "
    "node's GPU "
    "temperature and throttling from the audit, CPU-throttled neighbours)"
)
_S5_ROOT_CAUSE = (
    "Usually a combination: (1) container cold start: the pod was evicted (OOM, node drain, spot reclaim) and the "
    "model reloads from Blob Storage (14+ GB over the network); (2) GPU thermal throttling: sustained 100 % "
    "utilisation, temperature above 83 °C, automatic clock reduction; (3) noisy neighbour: another pod on the same "
    "node takes the CPU, memory or network the pre/post-processing needs."
)
_S5_RESOLUTION = (
    "- Cold starts: an init container that copies the model weights to local NVMe before the serving container "
    "starts; a readiness probe that only marks the pod ready once the model is loaded (template `inference`: "
    "`model.cache.enabled`, `readiness.path`, `startup.maxLoadSeconds`)\n"
    "- Thermal throttling: monitor DCGM_FI_DEV_GPU_TEMP and alert above 78 °C; lower the batch size to reduce "
    "sustained utilisation\n"
    "- Noisy neighbour: nodeSelector or dedicated taints so inference pods run on exclusive nodes (template "
    "`inference`: `dedicated.enabled`)"
)
_S5_PREVENTION = (
    "- Readiness probe that checks the model is loaded (not just that the container is up)\n"
    "- Model cache on local NVMe (no Blob download at every start)\n"
    "- GPU temperature monitoring with proactive alerts (`invoke k8s.alerts`)\n"
    "- Inference pods on dedicated nodes, not shared"
)


def _s5(**overrides: str) -> Runbook:
    sections = {
        "symptoms": _S5_SYMPTOMS,
        "diagnosis": _S5_DIAGNOSIS,
        "root_cause": _S5_ROOT_CAUSE,
        "resolution": _S5_RESOLUTION,
        "prevention": _S5_PREVENTION,
    }
    sections.update(overrides)
    return Runbook(**sections)


_S3, _S5 = Scenario.S3, Scenario.S5
_C, _W = Severity.CRITICAL, Severity.WARNING

ENTRIES: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        "K8S-PEND-001",
        _S3,
        _C,
        "GPU pod Pending: untolerated taint on the nodes it belongs on",
        "add the toleration: the kubectl patch from `invoke k8s.diagnose-pending`; in templates/k8s values, "
        "`tolerations` (default sku=gpu:NoSchedule)",
        _s3(),
    ),
    CatalogEntry(
        "K8S-PEND-002",
        _S3,
        _C,
        "GPU pod Pending: no node matches its node selector / required node affinity",
        "select the GPU pool's label (templates/k8s values `gpuPool`, `nodeSelector`); the patch from "
        "`invoke k8s.diagnose-pending`",
        _s3(
            root_cause="The pod selects nodes by a label no node carries (a pool renamed, a typo, a pool scaled to "
            "zero whose nodes do not exist yet)."
        ),
    ),
    CatalogEntry(
        "K8S-PEND-003",
        _S3,
        _C,
        "Pod Pending: a hard scheduling constraint (pod affinity/anti-affinity, topology spread, volumes, ports)",
        "relax the constraint in the pod spec, or fix the volume's zone/node pinning (WaitForFirstConsumer)",
        _s3(
            root_cause="A required inter-pod (anti-)affinity, topology spread constraint, volume node affinity "
            "(a PV pinned to another zone or node), unbound PVC or host port excludes every node that would "
            "otherwise take the pod; more nodes or quota do not help."
        ),
    ),
    CatalogEntry(
        "K8S-PEND-004",
        _S3,
        _C,
        "GPU pod Pending: not enough free GPUs in its pool",
        "scale the GPU pool (check maxCount: `invoke aks.pools`) and the vCPU quota, family and regional total "
        "(`invoke quota.plan`); or lower the pod's nvidia.com/gpu request (templates/k8s values `gpu.count`)",
        _s3(
            root_cause="Every node the pod may use has its GPUs allocated (or the device plugin advertises none); "
            "the cluster autoscaler could not add a node: pool at maxCount or GPU quota used up."
        ),
    ),
    CatalogEntry(
        "K8S-PEND-005",
        _S3,
        _C,
        "Pod Pending: not enough CPU, memory, pods or another resource on the nodes it may use",
        "lower the requests (templates/k8s values `resources`) or scale the pool (`invoke aks.pools`, "
        "`invoke quota.plan`)",
        _s3(
            root_cause="The pod's requests exceed what the eligible nodes have left (or what one node offers at "
            "all); the cluster autoscaler could not or would not add a node."
        ),
    ),
    CatalogEntry(
        "K8S-PEND-006",
        _S3,
        _C,
        "Pod Pending: the nodes it would use are cordoned, not ready, unreachable, under pressure or being deleted",
        "fix the node (kubectl uncordon after maintenance, node health, `invoke audit` on the host); never add a "
        "toleration for node-health taints",
        _s3(
            root_cause="Node-health taints (node.kubernetes.io/not-ready, unreachable, memory-pressure, ...) or a "
            "cordon keep the pod off the only nodes that would take it; the pod spec is not the problem.",
            resolution="- `kubectl get nodes`; `kubectl describe node NODE` (conditions, taints)\n"
            "- Repair or replace the node (`invoke audit --limit <node>`, `az aks nodepool ...`); uncordon after "
            "maintenance\n- Never tolerate node.kubernetes.io/* health taints: the pod would land on a broken node",
        ),
    ),
    CatalogEntry(
        "K8S-PEND-007",
        _S3,
        _C,
        "GPU pod Pending: the node pool cannot grow (at maxCount, autoscaling off, or outside min/max)",
        "raise the pool's maxCount: `az aks nodepool update -g <resource-group> --cluster-name <cluster> -n <pool> "
        "--update-cluster-autoscaler --min-count <min-count> --max-count <new-max-count>` (the finding fills in the "
        "values it knows); check with `invoke aks.pools --cluster <cluster> --resource-group <resource-group>`",
        _s3(
            root_cause="The node pool is at maxCount: the autoscaler wants to scale but may not (or autoscaling is "
            "off, or the pool's count is outside its min/max and the autoscaler refuses the target)."
        ),
    ),
    CatalogEntry(
        "K8S-PEND-008",
        _S3,
        _C,
        "GPU pod Pending: a vCPU quota the pool draws on (its VM family, the regional total) has no room",
        "raise the quota that binds (the finding names it): `invoke quota.plan --location <location> --vm-size "
        "<vm-size> --nodes <n>`, then `invoke quota.request --location <location> --family <family> --vcpus <vcpus>` "
        "with the family, `cores` (the regional vCPU total) or, for a Spot pool, `lowPriorityCores`",
        _s3(
            root_cause="A new node must fit both the GPU family's regional vCPU quota and the region's total vCPU "
            "quota (cores); when either is used up the cluster autoscaler cannot provision new nodes (VMSS "
            "scale-out fails with OperationNotAllowed). Raising the family's quota does not help when only the "
            "regional total is full. A Spot pool draws on the regional low-priority vCPU quota (lowPriorityCores) "
            "instead of its family's."
        ),
    ),
    CatalogEntry(
        "K8S-PEND-009",
        _S3,
        _W,
        "Cluster autoscaler will not add a node for the pod (would not fit, scale-up backoff)",
        "lower the requests below a node's allocatable or add a pool with bigger nodes; after a failed scale-up, "
        "read the VMSS / autoscaler errors (quota, allocation, subnet IPs)",
        _s3(
            root_cause="The autoscaler simulated the pod on every node group's template and none would fit, or the "
            "last scale-up of the group failed and it backs off (quota OperationNotAllowed, allocation failure, "
            "subnet IP exhaustion)."
        ),
    ),
    CatalogEntry(
        "K8S-LAT-001",
        _S5,
        _C,
        "Model server restarted after OOMKilled: every restart reloads the model",
        "raise the container's memory (templates/k8s inference values `resources.memory`; requests = limits)",
        _s5(
            root_cause="The container exceeded its memory limit and was killed; the restart reloads the weights: "
            "a latency hole as long as the model load."
        ),
    ),
    CatalogEntry(
        "K8S-LAT-002",
        _S5,
        _W,
        "Inference pod evicted, drained, preempted or reclaimed (spot): a cold start on a new node",
        "cache weights on local NVMe (inference values `model.cache`), a PodDisruptionBudget and more than one "
        "replica; inference on regular (not spot) dedicated nodes (`dedicated.enabled`, `gpuPool`)",
        _s5(
            root_cause="The pod was removed from its node (eviction under node pressure, kubectl drain, a "
            "preemption, a spot VM reclaimed, a node shutdown) and its replacement reloads the model from Blob "
            "Storage over the network."
        ),
    ),
    CatalogEntry(
        "K8S-LAT-003",
        _S5,
        _W,
        "Model load takes long: each (re)start is a latency hole",
        "init container copying weights to local NVMe (inference values `model.cache.enabled`, "
        "`model.source`), startup probe sized for the load (`startup.maxLoadSeconds`)",
        _s5(),
    ),
    CatalogEntry(
        "K8S-LAT-004",
        _S5,
        _W,
        "Readiness does not wait for the model (no readiness/startup probe, or one that passes before the load)",
        "readiness probe on the server's model-ready endpoint (inference values `readiness.path`), startup probe "
        "for the load (`startup.maxLoadSeconds`)",
        _s5(
            root_cause="Without a model-aware readiness probe the Service sends requests to a pod that is still "
            "loading its weights; without a startup probe a liveness probe kills a long load and restarts it."
        ),
    ),
    CatalogEntry(
        "K8S-LAT-005",
        _S5,
        _W,
        "CPU-throttled model server or noisy neighbours on its node",
        "dedicated nodes for inference (inference values `dedicated.enabled`: taint + selector); Guaranteed QoS "
        "(`resources` requests = limits) with enough CPU for pre/post-processing",
        _s5(
            root_cause="Another pod on the same node takes the CPU (or memory/network) the model server needs for "
            "pre/post-processing, or the server's own CPU limit throttles it (CFS throttling)."
        ),
    ),
    CatalogEntry(
        "K8S-LAT-006",
        _S5,
        _W,
        "Model server container restarting (errors, liveness kills)",
        "read `kubectl logs <pod> --previous`; size the startup probe for the load so liveness does not kill it "
        "(inference values `startup.maxLoadSeconds`)",
        _s5(root_cause="The container exits or is killed by its liveness probe; each restart reloads the model."),
    ),
)
