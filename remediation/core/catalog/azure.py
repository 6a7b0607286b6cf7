"""Findings about Azure GPU capacity (runbook S3: AKS GPU pods stuck Pending): regional GPU quota, AKS node pools.

Decided in :mod:`remediation.azure.checks` (one function per ID), reported by ``invoke quota.show`` and
``invoke aks.pools``. Also the platform's own maintenance on a host the closed loop was to fix (AZ-SE-001, decided in
:mod:`remediation.azure.scheduled_events`, raised by ``invoke remediate``).
"""

from __future__ import annotations

from remediation.core.catalog.entry import CatalogEntry, Runbook
from remediation.core.findings import Scenario, Severity

__all__ = ["ENTRIES"]

_S3_SYMPTOMS = (
    "GPU pods stay Pending (`kubectl get pods` shows 0/1 Pending for 20 minutes and more); a Pending pod has no "
    "container, so `kubectl logs` shows nothing. `kubectl describe pod` events: FailedScheduling, e.g. "
    '"0/12 nodes are available: 3 node(s) had untolerated taint {sku=gpu:NoSchedule}, 9 node(s) didn\'t match '
    "Pod's node affinity/selector\", or the cluster autoscaler cannot add a node."
)
_S3_DIAGNOSIS = (
    "- `kubectl describe pod <pod> -n <namespace>` (the events, never `kubectl logs`)\n"
    "- quota: `az vm list-usage --location eastus -o table | grep -i \"Standard NC\\|Standard ND\"`, or "
    "`invoke quota.show --location eastus`\n"
    "- pool limits: `az aks nodepool show --cluster-name myAKS --resource-group myRG --name gpunp "
    "--query '{min:minCount, max:maxCount, current:count}'`, or `invoke aks.pools --cluster myAKS "
    "--resource-group myRG`"
)
_S3_ROOT_CAUSE = (
    "The pod spec lacks the toleration for the GPU pool's `sku=gpu:NoSchedule` taint, so the scheduler treats GPU "
    "nodes as ineligible. Other common causes: the regional GPU family quota is used up (the cluster autoscaler "
    "cannot provision new nodes), or the node pool is at maxCount (the autoscaler wants to scale but may not)."
)
_S3_RESOLUTION = (
    "- Add the toleration to the pod spec: `tolerations: [{key: sku, operator: Equal, value: gpu, effect: "
    "NoSchedule}]` and request `nvidia.com/gpu: 1` under `resources.limits`\n"
    "- If quota is the problem: `az quota create --resource-name StandardNDSv2Family --scope "
    "/subscriptions/{sub-id}/providers/Microsoft.Compute/locations/eastus --limit-object value=48 "
    "limit-object-type=LimitValue`, or `invoke quota.plan` then `invoke quota.request --location eastus "
    "--family <family> --vcpus <vcpus>`\n"
    "- If the pool is at maxCount: raise it (`az aks nodepool update --update-cluster-autoscaler --max-count "
    "<max-count>`)"
)
_S3_PREVENTION = (
    "- Template every GPU pod spec with the toleration pre-configured\n"
    "- Alert at 80 % of GPU quota (`invoke quota.show --format prom` into the node_exporter textfile directory, "
    "with the shipped rule monitoring/prometheus/gpufleet-azure-quota.rules.yml)\n"
    "- Configure the cluster autoscaler with headroom in maxCount, and the quota for that maxCount"
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


_S3 = Scenario.S3
_W, _I = Severity.WARNING, Severity.INFO

_SE_RUNBOOK = Runbook(
    symptoms="`invoke remediate` left a faulty host alone and paged: the VM's Azure Scheduled Events (IMDS "
    "`/metadata/scheduledevents`) show a Freeze, Reboot, Redeploy, Preempt or Terminate that has started, is due "
    "within the horizon (30 minutes), has no NotBefore, or the events could not be read at all.",
    diagnosis="- on the VM: `curl -s -H Metadata:true "
    "'http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01'`\n"
    "- the packet under `<state_dir>/remediate/escalations/<fleet>/` (the events, the findings the loop was to fix)\n"
    "- Azure Resource Health of the VM in the portal, or `az resource show --ids <vm-id>` for its power state",
    root_cause="The platform is about to act on the VM (host maintenance, a live migration's freeze, a reboot or "
    "redeploy, a Spot eviction): a driver restore, a harden run or a reboot on top of it can be cut in half and the "
    "platform's action may fix or move the fault on its own, so the loop does not act and says so.",
    resolution="- let the event run; after it (a new boot id) `invoke remediate --fleet <fleet> --check` shows what is "
    "left\n"
    "- to have it sooner: drain the VM's work, then acknowledge the event (POST StartRequests, "
    "`remediation.azure.scheduled_events.acknowledge`)\n"
    "- events that cannot be read (IMDS not answering): check the VM's network to 169.254.169.254 and the proxy "
    "settings (IMDS must bypass proxies)",
    prevention="- keep a maintenance configuration on the GPU VMs so platform updates land in a window you chose\n"
    "- run the loop inside the same window (`remediate.maintenance_windows`)",
)

ENTRIES: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        "AZ-QUOTA-001",
        _S3,
        _W,
        "GPU quota family at or above the alert threshold (80 %) in a region",
        "invoke quota.plan --location <location> --vm-size <vm-size> --nodes <n>, then invoke quota.request",
        _s3(root_cause="The regional quota of a GPU VM family is nearly used up: the next nodes of that family "
            "(a scale-up, the autoscaler, a redeploy) fail with a quota error and GPU pods stay Pending."),
    ),
    CatalogEntry(
        "AZ-QUOTA-002",
        _S3,
        _W,
        "Total regional vCPU quota at or above the alert threshold (80 %)",
        "invoke quota.request --location <location> --family cores --vcpus <vcpus>",
        _s3(root_cause="Every VM in a region also counts against the regional vCPU total: with it used up, no "
            "new VM of any family starts there, whatever the family quota says."),
    ),
    CatalogEntry(
        "AZ-QUOTA-003",
        _S3,
        _W,
        "Not enough quota for the GPU node pools to reach their maxCount",
        "invoke quota.request --location <location> --family <family> --vcpus <vcpus>",
        _s3(root_cause="The cluster autoscaler may grow the GPU pools to maxCount, but the region's quota of their "
            "VM family (or the regional vCPU total) has less room than that growth needs: the scale-up fails and "
            "pods stay Pending. A Spot pool (scaleSetPriority Spot) draws on the regional low-priority vCPU quota "
            "(lowPriorityCores) instead: raise that one (--family lowPriorityCores)."),
    ),
    CatalogEntry(
        "AZ-AKS-001",
        _S3,
        _W,
        "AKS node pool at maxCount: the cluster autoscaler cannot add nodes",
        "az aks nodepool update --update-cluster-autoscaler --max-count <max-count> (keep quota for it)",
        _s3(root_cause="The pool already runs maxCount nodes: the autoscaler wants to scale up but may not, so "
            "pods that need a new node stay Pending."),
    ),
    CatalogEntry(
        "AZ-AKS-002",
        _S3,
        _W,
        "GPU node pool without the sku=gpu:NoSchedule taint",
        "az aks nodepool add/update with --node-taints sku=gpu:NoSchedule; GPU pods carry the toleration",
        _s3(root_cause="Without the taint any pod may be scheduled onto the expensive GPU nodes and hold them, so "
            "GPU pods find no room and the autoscaler's scale-up is spent on CPU work."),
    ),
    CatalogEntry(
        "AZ-AKS-003",
        _S3,
        _I,
        "GPU node pool tainted sku=gpu:NoSchedule: GPU pods need the matching toleration",
        'pod spec: tolerations: [{key: "sku", operator: "Equal", value: "gpu", effect: "NoSchedule"}]',
        _s3(),
    ),
    CatalogEntry(
        "AZ-SE-001",
        Scenario.S1,
        _W,
        "Azure Scheduled Event due on a host the loop was to fix: left to the platform and escalated",
        "wait for the event (or drain and acknowledge it), then invoke remediate --fleet <fleet> --check",
        _SE_RUNBOOK,
    ),
)
