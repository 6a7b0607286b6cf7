"""The Kubernetes area's ``invoke diagnose`` kinds, registered on import (named in
:data:`remediation.core.parsers.PLUGIN_MODULES`).

- ``failed-scheduling``: a scheduler ``FailedScheduling`` message (any era) or a cluster autoscaler
  ``NotTriggerScaleUp`` message on its own.
- ``k8s-events``: event tables (``kubectl describe pod`` Events, ``kubectl get events``, console tables, autoscaler
  log lines carrying events).

Both have the facts ``total_nodes`` (int or null), ``reasons`` (``[{"count", "reason", "raw", "taint_key",
"taint_value", "resource"}]``), ``preemption`` (``no_victims | not_helpful | null``) and ``verdict``
(``constraint | capacity | node_state | ambiguous | null``; ambiguous: the message hides the taint key and other
nodes lack GPUs, so a missing toleration and GPU capacity explain it equally), from
:func:`remediation.k8s.pending.diagnose_text`, the function ``invoke k8s.diagnose-pending`` runs.

- ``model-load``: a model server's log (vLLM, TGI, Triton, TorchServe, Ollama); facts ``load_seconds`` (float or
  null) and ``server``; findings from :func:`remediation.k8s.latency.load_findings`.

Scores are kept below the host kinds' for their own text: an NVML failure scores 10 per marker and kernel logs
a few points per NVRM line, while these kinds' markers only occur in scheduler, event and model-server text.
"""

from __future__ import annotations

import re
from typing import Any

from remediation.core.findings import Finding
from remediation.core.parsers import KindSpec, marker_score, register
from remediation.k8s import modelload

__all__ = ["events_score", "failed_scheduling_score"]

_I = re.IGNORECASE
_FS_MARKERS = (
    (re.compile(r"(?<!\d)\d+\s*/\s*\d+\s+nodes?\s+(?:are|is)\s+available", _I), 10, 3),
    (re.compile(r"no nodes are available that match all of the|fit failure summary on nodes", _I), 10, 2),
    (re.compile(r"pod didn'?t trigger scale-?up|scale-?up failed for group", _I), 8, 2),
    (
        re.compile(
            r"untolerated taint|that the pod didn'?t tolerate|node affinity/selector|preemption victims"
            r"|preemption is not helpful|insufficient nvidia\.com/gpu|max node group size",
            _I,
        ),
        3,
        3,
    ),
)
_EVENT_MARKERS = (
    (re.compile(r"\bFailedScheduling\b"), 12, 2),
    (re.compile(r"\b(?:NotTriggerScaleUp|TriggeredScaleUp|FailedToScaleUpGroup)\b"), 12, 2),
    (re.compile(r"^[ \t]*Events:[ \t]*$", re.M), 5, 1),
    (re.compile(r"\b(?:default-scheduler|cluster-autoscaler)\b"), 3, 2),
    (re.compile(r"^[ \t]*(?:\|[ \t]*)?(?:Normal|Warning)(?:[ \t]*\|)?[ \t]+[A-Z][A-Za-z]+", re.M), 2, 5),
)


_FS_SCORE = marker_score(_FS_MARKERS)
_EVENT_SCORE = marker_score(_EVENT_MARKERS)


def failed_scheduling_score(text: str) -> int:
    return _FS_SCORE(text)


def events_score(text: str) -> int:
    """Event tables: the event markers plus the message's own score, so a table always outscores the bare
    message kind; 0 without an event reason, so a bare message stays ``failed-scheduling``."""
    score = _EVENT_SCORE(text)
    return score + failed_scheduling_score(text) if score >= 12 else 0


def _pending(text: str) -> tuple[dict[str, Any], list[Finding]]:
    from remediation.k8s.pending import diagnose_text

    return diagnose_text(text)


def _model_load(text: str) -> tuple[dict[str, Any], list[Finding]]:
    from remediation.k8s.latency import load_findings

    parsed = modelload.parse(text)
    return parsed.facts(), load_findings(parsed)


def _parse_events(text: str) -> object:
    from remediation.k8s.scheduling import parse_events

    return parse_events(text)


register(
    KindSpec(
        "failed-scheduling",
        failed_scheduling_score,
        _parse_events,
        "kube-scheduler FailedScheduling / cluster-autoscaler message",
        diagnose=_pending,
    )
)
register(
    KindSpec(
        "k8s-events",
        events_score,
        _parse_events,
        "kubectl describe pod / get events output (Pending pods)",
        diagnose=_pending,
    )
)
register(
    KindSpec(
        "model-load",
        modelload.score,
        modelload.parse,
        "model server log (vLLM, TGI, Triton, TorchServe, Ollama): model load time",
        diagnose=_model_load,
    )
)
