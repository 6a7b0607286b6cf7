"""Prometheus alerting rules for GPU workloads, built as data and serialised (``invoke k8s.alerts``).

- DCGM exporter: GPU temperature above the runbook's 78 °C (``DCGM_FI_DEV_GPU_TEMP``, S5), Xid errors
  (``DCGM_FI_DEV_XID_ERRORS``: the gauge holds the last Xid code, non-zero means an Xid was logged), split by the
  project's Xid table (:mod:`remediation.core.catalog.xid`): ``GpuXidError`` pages (critical) on the hardware/driver
  Xids of ``XID_CRITICAL``; ``GpuXidErrorApplication`` warns on every other code, the application class (13, 31,
  43) among them. Both are finding GPU-HW-005, whose severity the same table sets.
- kube-state-metrics: pods that request GPUs (``kube_pod_container_resource_requests{resource="nvidia_com_gpu"}``;
  kube-state-metrics writes ``nvidia.com/gpu`` that way) Pending longer than N minutes (S3), and the same pods
  marked unschedulable by the scheduler.

The output is a Prometheus rule file (``promtool check rules`` reads it) or, with ``--format prometheusrule``, a
``monitoring.coreos.com/v1`` PrometheusRule for the Prometheus Operator. ``{{ $labels.x }}`` / ``{{ $value }}`` in
annotations are Prometheus's own templating, passed through as data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from remediation.core.catalog.xid import XID_APPLICATION, XID_CRITICAL
from remediation.core.errors import TemplateError

__all__ = ["FORMATS", "check_rules", "render_rules", "rule_groups"]

FORMATS = ("rules", "prometheusrule")


def _ksm_resource(resource: str) -> str:
    """kube-state-metrics' label value for a resource name (``nvidia.com/gpu`` -> ``nvidia_com_gpu``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", resource)


def _codes(codes: frozenset[int]) -> str:
    return ", ".join(str(c) for c in sorted(codes))


def _xid_expr(critical: frozenset[int], *, exclude: bool = False) -> str:
    """The Xid rule's PromQL. ``DCGM_FI_DEV_XID_ERRORS`` holds the last Xid code, so the class is a match on the
    value: a code of the project's critical table (``critical``), or (``exclude``) any other non-zero code. A
    10-minute subquery keeps an Xid that a later one replaced within the window."""
    metric = "DCGM_FI_DEV_XID_ERRORS"
    match = " or ".join(f"{metric} == {code}" for code in sorted(critical))
    selected = f"({metric} > 0 unless ({match}))" if exclude else f"({match})"
    return f"max by (Hostname, gpu, UUID) (max_over_time({selected}[10m:1m]))"


def rule_groups(
    temp_c: int = 78, pending_minutes: int = 10, gpu_resource: str = "nvidia.com/gpu"
) -> list[dict[str, Any]]:
    """The rule groups as data."""
    res = _ksm_resource(gpu_resource)
    gpu_pods = f'max by (namespace, pod) (kube_pod_container_resource_requests{{resource="{res}"}}) > 0'
    return [
        {
            "name": "gpufleet-dcgm",
            "rules": [
                {
                    "alert": "GpuTemperatureHigh",
                    "expr": f"max by (Hostname, gpu, UUID, modelName) (DCGM_FI_DEV_GPU_TEMP) > {temp_c}",
                    "for": "5m",
                    "labels": {"severity": "warning", "scenario": "S5", "finding": "GPU-THM-001"},
                    "annotations": {
                        "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }} °C",
                        "description": f"Above the runbook's {temp_c} °C alert: clocks drop near the slowdown "
                        "threshold (~83 °C) and inference latency rises. Lower sustained load (batch size), check "
                        "cooling; invoke audit --limit HOST.",
                    },
                },
                {
                    "alert": "GpuXidError",
                    "expr": _xid_expr(XID_CRITICAL),
                    "for": "0m",
                    "labels": {"severity": "critical", "scenario": "S1", "finding": "GPU-HW-005"},
                    "annotations": {
                        "summary": "Xid {{ $value }} on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}",
                        "description": "The NVIDIA driver logged a hardware/driver-class Xid (ECC, row remapping, "
                        "NVLink, fallen off the bus, GSP): drain the node's GPU work and run invoke diagnose on "
                        "its kernel log (dmesg | grep NVRM).",
                    },
                },
                {
                    "alert": "GpuXidErrorApplication",
                    "expr": _xid_expr(XID_CRITICAL, exclude=True),
                    "for": "0m",
                    "labels": {"severity": "warning", "scenario": "S1", "finding": "GPU-HW-005"},
                    "annotations": {
                        "summary": "Xid {{ $value }} on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}",
                        "description": f"An Xid outside the hardware/driver class, e.g. {_codes(XID_APPLICATION)} "
                        "(NVIDIA: usually the user application): check the workload on that GPU first (its logs "
                        "and CUDA errors); drain only when the Xid repeats across several workloads. invoke "
                        "diagnose on the kernel log (dmesg | grep NVRM) names the process.",
                    },
                },
            ],
        },
        {
            "name": "gpufleet-kube-state-metrics",
            "rules": [
                {
                    "alert": "GpuPodPending",
                    "expr": f'(max by (namespace, pod) (kube_pod_status_phase{{phase="Pending"}}) == 1) '
                    f"and on (namespace, pod) ({gpu_pods})",
                    "for": f"{pending_minutes}m",
                    "labels": {"severity": "warning", "scenario": "S3", "finding": "K8S-PEND-001"},
                    "annotations": {
                        "summary": f"GPU pod {{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}} Pending for more "
                        f"than {pending_minutes} minutes",
                        "description": "A Pending pod has no logs: run invoke k8s.diagnose-pending --pod "
                        "{{ $labels.pod }} -n {{ $labels.namespace }} (taint, capacity, pool maxCount, quota).",
                    },
                },
                {
                    "alert": "GpuPodUnschedulable",
                    "expr": f"(max by (namespace, pod) (kube_pod_status_unschedulable) == 1) "
                    f"and on (namespace, pod) ({gpu_pods})",
                    "for": f"{pending_minutes}m",
                    "labels": {"severity": "warning", "scenario": "S3", "finding": "K8S-PEND-001"},
                    "annotations": {
                        "summary": "The scheduler cannot place GPU pod {{ $labels.namespace }}/{{ $labels.pod }}",
                        "description": (
                            "invoke k8s.diagnose-pending --pod {{ $labels.pod }} --namespace {{ $labels.namespace }}"
                        ),
                    },
                },
            ],
        },
    ]


def render_rules(
    temp_c: int = 78,
    pending_minutes: int = 10,
    gpu_resource: str = "nvidia.com/gpu",
    format: str = "rules",
    name: str = "gpufleet",
    namespace: str = "monitoring",
) -> str:
    """The rules as a Prometheus rule file, or as a PrometheusRule object; YAML."""
    if format not in FORMATS:
        raise TemplateError(f"--format {format!r} is not one of {', '.join(FORMATS)}")
    if temp_c <= 0 or pending_minutes <= 0:
        raise TemplateError("--temp-c and --pending-minutes must be positive")
    groups = rule_groups(temp_c, pending_minutes, gpu_resource)
    doc: dict[str, Any] = {"groups": groups}
    if format == "prometheusrule":
        doc = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "gpufleet"}},
            "spec": {"groups": groups},
        }
    check_rules(doc.get("spec", doc))
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)


_DURATION = re.compile(r"^(?:\d+(?:ms|[smhdwy]))+$")
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def check_rules(doc: Mapping[str, Any]) -> None:
    """The structure ``promtool check rules`` requires (groups, unique names, alert/expr/for/labels/annotations
    types, durations, label names); :class:`TemplateError` naming the first problem. PromQL itself is checked by
    promtool or a PromQL parser (the tests do both where they can)."""
    groups = doc.get("groups")
    if not isinstance(groups, list) or not groups:
        raise TemplateError("rules: groups must be a non-empty list")
    names = set()
    for group in groups:
        if not isinstance(group, Mapping) or not isinstance(group.get("name"), str) or not group["name"]:
            raise TemplateError("rules: every group needs a name")
        if group["name"] in names:
            raise TemplateError(f"rules: group {group['name']} defined twice")
        names.add(group["name"])
        rules = group.get("rules")
        if not isinstance(rules, list) or not rules:
            raise TemplateError(f"rules: group {group['name']} has no rules")
        for rule in rules:
            if not isinstance(rule, Mapping):
                raise TemplateError(f"rules: group {group['name']}: a rule is not a mapping")
            alert = rule.get("alert")
            if not isinstance(alert, str) or not _NAME.match(alert):
                raise TemplateError(f"rules: group {group['name']}: alert name {alert!r} is not a metric name")
            if not isinstance(rule.get("expr"), str) or not rule["expr"].strip():
                raise TemplateError(f"rules: {alert}: expr must be a non-empty string")
            if "for" in rule and not _DURATION.match(str(rule["for"])):
                raise TemplateError(f"rules: {alert}: for {rule['for']!r} is not a duration")
            for key in ("labels", "annotations"):
                value = rule.get(key, {})
                if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and _NAME.match(k) and isinstance(v, str) for k, v in value.items()
                ):
                    raise TemplateError(f"rules: {alert}: {key} must map label names to strings")
            unknown = set(rule) - {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            if unknown:
                raise TemplateError(f"rules: {alert}: unknown key(s) {', '.join(sorted(unknown))}")
