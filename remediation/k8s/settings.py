"""``k8s:`` settings (invoke.yaml): every default of the ``k8s.*`` tasks, each also a flag where it matters."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["K8sSettings"]


@dataclass(frozen=True)
class K8sSettings:
    """``k8s:``: templates, the Kubernetes version manifests are checked against, thresholds."""

    templates_dir: str = ""  # empty: the package's templates; a relative path is under the project (or working) dir
    kubernetes_version: str = "1.30"  # OpenAPI schema the rendered manifests are validated against
    kubeconfig: str = ""  # default: $KUBECONFIG, then ~/.kube/config
    context: str = ""  # kubeconfig context; default: the current one
    api_timeout: float = 10.0  # seconds per Kubernetes API request
    gpu_resource: str = "nvidia.com/gpu"
    pending_alert_minutes: int = 10  # alert rule: a GPU pod Pending longer than this
    gpu_temp_alert_c: int = 78  # alert rule and latency diagnosis (the runbook's 78 degrees C)
    slow_load_s: float = 60.0  # a model load at least this long is a cold-start latency hole
    cpu_throttle_ratio: float = 0.25  # share of CFS periods throttled that counts as CPU-throttled
