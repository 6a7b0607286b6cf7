"""``invoke k8s.*``: GPU workload manifests, Pending-pod and latency-spike diagnosis, alert rules (S3, S5)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from invoke import Collection, Exit, task

from commands import edge, format_help, formats, project_dir, read_input, settings
from remediation.core.exitcodes import ExitCode


def _k8s(c: Any) -> Any:
    from remediation.k8s.api import K8sSettings

    return settings(c, K8sSettings, "k8s")


def _write(text: str, out: str | None, what: str) -> None:
    if out:
        Path(out).write_text(text)
        print(f"wrote {what} to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _format(format: str) -> None:
    from remediation.core.errors import UsageError

    if format not in ("text", "json"):
        raise UsageError(f"--format {format!r} must be text or json")


@task(
    positional=["template"],
    iterable=["set"],
    help={
        "template": "training-job | inference | audit-cronjob (the package's templates/k8s/NAME.yaml.j2)",
        "values": "YAML values file (examples: templates/k8s/examples/NAME.yaml in the checkout or the package)",
        "set": "override one value: key.path=value (repeatable), e.g. --set gpu.count=2",
        "kube_version": "Kubernetes version whose OpenAPI schema the output must pass (default k8s.kubernetes_version)",
        "out": "write the manifests to this file instead of stdout",
    },
)
@edge
def render(c, template, values=None, set=None, kube_version=None, out=None):  # type: ignore[no-untyped-def]
    """Render a GPU workload manifest; values and output schema-checked. Exit 2 on bad values."""
    from remediation.k8s.api import apply_sets, load_values, templates_dir
    from remediation.k8s.api import render as run

    cfg = _k8s(c)
    data = load_values(values) if values else {}
    data = apply_sets(data, list(set or ()))
    directory = templates_dir(cfg.templates_dir, project_dir(c))
    result = run(template, data, directory, str(kube_version or cfg.kubernetes_version), source=values or "--set")
    _write(result.yaml, out, f"{template} manifests")


@task(
    name="diagnose-pending",
    help={
        "events": "FailedScheduling text or `kubectl describe pod` output (file, - for stdin)",
        "snapshot": "directory with pod.json, nodes.json[, pods.json, events.json, pools.json, usages.json]",
        "pod": "ask the cluster live about this pod (kubeconfig, read-only)",
        "namespace": "the pod's namespace (default: default)",
        "kubeconfig": "kubeconfig file (default: k8s.kubeconfig, $KUBECONFIG, ~/.kube/config)",
        "context": "kubeconfig context (default: the current one)",
        "pools": "AKS agent pools as ARM lists them (az aks nodepool list -o json / REST), for the capacity chain",
        "usages": "compute usages as ARM lists them (REST usages list), for the capacity chain",
        "cluster": "AKS cluster name for the commands printed",
        "resource_group": "its resource group, for the commands printed",
        "location": "Azure region, for the commands printed (default: the nodes' region label)",
        "format": format_help("text", "json"),
    },
)
@edge
@formats("text", "json")
def diagnose_pending(  # type: ignore[no-untyped-def]
    c,
    events=None,
    snapshot=None,
    pod=None,
    namespace="default",
    kubeconfig=None,
    context=None,
    pools=None,
    usages=None,
    cluster="CLUSTER",
    resource_group="RESOURCE_GROUP",
    location="",
    format="text",
):
    """Why a GPU pod is Pending: constraint, capacity or node state, with the patch. Exit 1 when blocked.

    Exit codes: 0 nothing blocks the pod; 1 a finding (the pod is blocked, the fix is printed); 2 bad input;
    3 the Kubernetes API could not be asked.
    """
    from remediation.core.errors import UsageError
    from remediation.k8s.api import diagnose_pending as run
    from remediation.k8s.api import (
        load_json,
        load_snapshot,
        pending_json,
        pools_from_dict,
        print_pending,
        usages_from_dict,
    )
    from remediation.report.console import console

    _format(format)
    if not (events or snapshot or pod):
        raise UsageError("give --events FILE, --snapshot DIR or --pod NAME [-n NAMESPACE]")
    if snapshot and pod:
        raise UsageError("--snapshot and --pod both name the cluster state: give one")
    cfg = _k8s(c)
    text = read_input(events)[0] if events else ""
    state = None
    if snapshot:
        state = load_snapshot(snapshot)
    elif pod:
        from remediation.k8s.api import fetch_snapshot

        state = fetch_snapshot(pod, namespace, kubeconfig or cfg.kubeconfig, context or cfg.context, cfg.api_timeout)
    pools_path = Path(pools) if pools else (Path(snapshot) / "pools.json" if snapshot else None)
    usages_path = Path(usages) if usages else (Path(snapshot) / "usages.json" if snapshot else None)
    pool_list = (
        pools_from_dict(load_json(pools_path), str(pools_path)) if pools_path and (pools or pools_path.exists()) else ()
    )
    usage_list = (
        usages_from_dict(load_json(usages_path), str(usages_path))
        if usages_path and (usages or usages_path.exists())
        else ()
    )
    result = run(
        text,
        state,
        pool_list,
        usage_list,
        gpu_resource=cfg.gpu_resource,
        cluster=cluster,
        resource_group=resource_group,
        location=location,
        source=events or "--events",
    )
    if format == "json":
        print(pending_json(result))
    else:
        print_pending(result, console)
    raise Exit(code=ExitCode.FINDINGS if result.findings else ExitCode.OK)


@task(
    name="diagnose-latency",
    help={
        "snapshot": "directory with pod.json[, pods.json, events.json, nodes.json, logs/, facts.json, metrics.prom]",
        "facts": "the audit's JSON (invoke audit --format json) with the pod's node (default: SNAPSHOT/facts.json)",
        "logs": "model server log (default: every file in SNAPSHOT/logs/)",
        "metrics": "cAdvisor metrics text (default: SNAPSHOT/metrics.prom)",
        "format": format_help("text", "json"),
    },
)
@edge
@formats("text", "json")
def diagnose_latency(c, snapshot, facts=None, logs=None, metrics=None, format="text"):  # type: ignore[no-untyped-def]
    """Why an inference pod got slow: restarts, cold loads, GPU heat, neighbours. Exit 1 on findings."""
    from remediation.k8s.api import diagnose_latency as run
    from remediation.k8s.api import latency_json, load_json, load_snapshot, print_latency, read_text
    from remediation.report.console import console

    _format(format)
    cfg = _k8s(c)
    root = Path(snapshot)
    state = load_snapshot(root)
    if logs:
        log_text = read_text(Path(logs))
    else:
        log_dir = root / "logs"
        files = sorted(p for p in log_dir.iterdir() if p.is_file()) if log_dir.is_dir() else []
        log_text = "\n".join(read_text(p) for p in files)
    facts_path = Path(facts) if facts else root / "facts.json"
    facts_doc = load_json(facts_path) if facts or facts_path.exists() else None
    metrics_path = Path(metrics) if metrics else root / "metrics.prom"
    metrics_text = read_text(metrics_path) if metrics or metrics_path.exists() else ""
    result = run(
        state,
        log_text,
        facts_doc,
        metrics_text,
        slow_load_s=cfg.slow_load_s,
        cpu_throttle_ratio=cfg.cpu_throttle_ratio,
        temp_alert_c=cfg.gpu_temp_alert_c,
        logs_source=logs or str(root / "logs"),
        metrics_source=str(metrics_path),
    )
    if format == "json":
        print(latency_json(result))
    else:
        print_latency(result, console)
    raise Exit(code=ExitCode.FINDINGS if result.findings else ExitCode.OK)


@task(
    help={
        "format": format_help(
            "rules", "prometheusrule", rules="a Prometheus rule file", prometheusrule="a Prometheus Operator object"
        ),
        "out": "write the rules to this file instead of stdout",
        "temp_c": "GPU temperature alert threshold in °C (default k8s.gpu_temp_alert_c: 78)",
        "pending_minutes": "alert on GPU pods Pending longer than this (default k8s.pending_alert_minutes)",
        "namespace": "namespace of the PrometheusRule object",
    },
)
@edge
@formats("rules", "prometheusrule")
def alerts(c, format="rules", out=None, temp_c=None, pending_minutes=None, namespace="monitoring"):  # type: ignore[no-untyped-def]
    """Prometheus alert rules: GPU temperature and Xid (DCGM), GPU pods Pending (kube-state-metrics)."""
    from remediation.core.errors import UsageError
    from remediation.k8s.api import render_rules

    cfg = _k8s(c)
    try:
        temp = int(temp_c) if temp_c is not None else cfg.gpu_temp_alert_c
        minutes = int(pending_minutes) if pending_minutes is not None else cfg.pending_alert_minutes
    except ValueError:
        raise UsageError(f"--temp-c {temp_c!r} / --pending-minutes {pending_minutes!r}: both take integers") from None
    text = render_rules(temp, minutes, cfg.gpu_resource, format=format, namespace=namespace)
    _write(text, out, "alert rules")


ns: Any = Collection("k8s", render, diagnose_pending, diagnose_latency, alerts)
