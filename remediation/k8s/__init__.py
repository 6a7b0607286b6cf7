"""Kubernetes GPU workloads (runbook S3 and S5): manifests, Pending-pod diagnosis, latency-spike diagnosis.

- :mod:`~remediation.k8s.render`: the workload templates of ``templates/k8s/`` (training Job, inference
  Deployment + Service, the audit CronJob), values checked against each template's schema, every value serialised,
  output checked against the Kubernetes OpenAPI schema of a configured version.
- :mod:`~remediation.k8s.scheduling`: the scheduler's ``FailedScheduling`` message in every era, the cluster
  autoscaler's events, ``kubectl describe`` event tables (pure parsers).
- :mod:`~remediation.k8s.evaluator`: the scheduler's filters replayed on a snapshot (pod, nodes, pods).
- :mod:`~remediation.k8s.pending`: the verdict (``constraint | capacity | node_state``) and the fix.
- :mod:`~remediation.k8s.capacity`: the AKS pool and quota facts the capacity verdict reads (small adapter).
- :mod:`~remediation.k8s.modelload` and :mod:`~remediation.k8s.latency`: model-server cold starts, restarts,
  GPU heat, noisy neighbours.
- :mod:`~remediation.k8s.alerts`: Prometheus rules (DCGM exporter, kube-state-metrics) built as data.
- :mod:`~remediation.k8s.kinds`: the ``invoke diagnose`` kinds ``failed-scheduling``, ``k8s-events``,
  ``model-load``.
"""
