"""Pure parsers of why a pod is not scheduled: the scheduler's ``FailedScheduling`` message in every era, the
cluster autoscaler's events, and event tables as ``kubectl describe pod`` / ``kubectl get events`` print them.

The grammar (kube-scheduler ``framework.Diagnosis`` / ``FitError.Error``, and the predicates before it)::

    message    = [head] [prefilter "."] histogram ["." postfilter {"," postfilter}] ["."]
    postfilter = "preemption:" [head] histogram      (DefaultPreemption)
               | "no new claims to deallocate"       (DynamicResources, 1.34+ with DRA) | any other plugin's text
    head       = "0/" N " nodes are available:"          (1.10+; "0 /3" as users retype it)
               | "No nodes are available that match all of the [following] predicates:"[":"]   (<= 1.9)
               | "fit failure summary on nodes :"
    histogram  = item {"," item}                     items sorted by text, so "18 ..." comes before "3 ..."
    item       = COUNT reason-text                   (1.10+)  |  reason-text "(" COUNT ")"   (<= 1.9)

kube-scheduler's ``FitError.Error()`` (pkg/scheduler/framework/types.go) writes ``"0/%v nodes are available:"``, then
``" %v."`` of the PreFilter message, of the histogram (``"N reason"`` sorted and joined by ``", "``) and of the
PostFilter plugins' messages joined by ``", "``. So the histogram ends at the first ``". "`` followed by a word
after its first item: ``"... 2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: ..."`` lists
``nvidia.com/gpu``, and the DRA clause is kept as :attr:`SchedulingMessage.postfilter`.

Counts are per (node, reason): a node failing several filters is counted once per reason, so counts may sum to more
than N. The text is matched case-insensitively, after joining folded lines (YAML folding, ``''`` for an apostrophe,
Markdown link wrappers around dotted names) and tolerating ``..``, a missing final period and ``. ,``.

Reason labels are the canonical labels of the FailedScheduling corpus
(tests/fixtures/corpus/failedscheduling-dev.md: ``insufficient_gpu``,
``untolerated_taint``, ``node_affinity_mismatch``, ...); a reason no rule knows is kept as ``other`` with its text.
The cluster autoscaler's ``NotTriggerScaleUp`` ("pod didn't trigger scale-up[ (it wouldn't fit if a new node is
added)]: 3 max node group size reached, ...") uses the same histogram, counted per node group, with the extra labels
``max_group_size``, ``scale_up_backoff`` and ``cluster_resource_limit``; ``FailedToScaleUpGroup`` ("Scale-up failed
for group G: Target size T requested outside Max: X, Min: Y") is parsed into its numbers.

Every function here is pure and total: any text gives a value, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AMBIGUOUS",
    "CAPACITY",
    "CONSTRAINT",
    "NODE_STATE",
    "EventsText",
    "Reason",
    "ScaleUpFailure",
    "SchedulingMessage",
    "classify",
    "health_label",
    "parse_events",
    "parse_message",
    "reason_class",
    "text_verdict",
]

CAPACITY, CONSTRAINT, NODE_STATE = "capacity", "constraint", "node_state"
#: A message alone cannot tell a missing toleration from GPU capacity: the taint is not named (1.35+ "untolerated
#: taint(s)", <= 1.17 "taints that the pod didn't tolerate") and other nodes lack GPUs. The nodes decide
#: (k8s.diagnose-pending --pod / --snapshot).
AMBIGUOUS = "ambiguous"

#: Node-health taints: a node carrying one is broken or going away. Fix the node; never tolerate these.
HEALTH_TAINTS: dict[str, str] = {
    "node.kubernetes.io/not-ready": "node_not_ready",
    "node.kubernetes.io/unreachable": "node_unreachable",
    "node.kubernetes.io/memory-pressure": "node_memory_pressure",
    "node.kubernetes.io/disk-pressure": "node_disk_pressure",
    "node.kubernetes.io/pid-pressure": "node_pid_pressure",
    "node.kubernetes.io/network-unavailable": "node_network_unavailable",
    "node.kubernetes.io/unschedulable": "node_unschedulable",
    "node.kubernetes.io/out-of-service": "node_not_ready",
    "node.cloudprovider.kubernetes.io/uninitialized": "node_not_ready",
    "node.cloudprovider.kubernetes.io/shutdown": "node_not_ready",
    "tobedeletedbyclusterautoscaler": "node_being_deleted",
    "deletioncandidateofclusterautoscaler": "node_being_deleted",
    "remediator.aks.microsoft.com/unschedulable": "node_unschedulable",
}

_NODE_STATE_LABELS = frozenset(
    {
        "node_unschedulable",
        "node_not_ready",
        "node_unreachable",
        "node_memory_pressure",
        "node_disk_pressure",
        "node_pid_pressure",
        "node_network_unavailable",
        "node_being_deleted",
        "node_unknown_condition",
    }
)
_CAPACITY_LABELS = frozenset(
    {
        "insufficient_gpu",
        "insufficient_extended",
        "insufficient_cpu",
        "insufficient_memory",
        "insufficient_ephemeral_storage",
        "too_many_pods",
        "max_volume_count",
        "max_group_size",
        "scale_up_backoff",
        "cluster_resource_limit",
        "preempt_no_victims",
    }
)
#: Taints on nodes a workload pod is not meant for: not the reason it stays Pending.
_EXPECTED_TAINTS = ("node-role.kubernetes.io/master", "node-role.kubernetes.io/control-plane", "CriticalAddonsOnly")


def health_label(taint_key: str | None) -> str | None:
    """The node-state label of a node-health taint key, or ``None`` for any other key."""
    if not taint_key:
        return None
    return HEALTH_TAINTS.get(taint_key.lower())


def reason_class(label: str) -> str:
    """``capacity | constraint | node_state`` for a reason label."""
    if label in _NODE_STATE_LABELS:
        return NODE_STATE
    if label in _CAPACITY_LABELS:
        return CAPACITY
    return CONSTRAINT


@dataclass(frozen=True)
class Reason:
    """One histogram entry: ``count`` nodes (or node groups) failed for this reason."""

    count: int
    reason: str  # canonical label
    raw: str  # the entry as written, whitespace joined
    taint_key: str | None = None
    taint_value: str | None = None
    resource: str | None = None

    @property
    def kind(self) -> str:
        return reason_class(self.reason)

    @property
    def gpu_pool_taint(self) -> bool:
        """An untolerated taint of the kind GPU pools carry (``sku=gpu``, ``nvidia.com/gpu``, a key or value of gpu)."""
        if self.reason != "untolerated_taint" or not self.taint_key:
            return False
        key, value = self.taint_key.lower(), (self.taint_value or "").lower()
        return "gpu" in key or value == "gpu" or (key == "sku" and "gpu" in value)

    @property
    def expected_exclusion(self) -> bool:
        """A taint of nodes no workload is meant for (control plane, system pool)."""
        return self.reason == "untolerated_taint" and (self.taint_key or "") in _EXPECTED_TAINTS

    def to_dict(self) -> dict[str, Any]:
        """``{"count", "reason", "raw", "taint_key", "taint_value", "resource"}`` (the diagnose JSON contract)."""
        return {
            "count": self.count,
            "reason": self.reason,
            "raw": self.raw,
            "taint_key": self.taint_key,
            "taint_value": self.taint_value,
            "resource": self.resource,
        }


@dataclass(frozen=True)
class ScaleUpFailure:
    """``Scale-up failed for group G: Target size T requested outside Max: X, Min: Y``."""

    group: str
    target: int | None
    max: int | None
    min: int | None
    raw: str


@dataclass(frozen=True)
class SchedulingMessage:
    """One scheduler or autoscaler message."""

    source: str  # "scheduler" | "autoscaler"
    total_nodes: int | None
    reasons: tuple[Reason, ...]
    preemption: tuple[Reason, ...]  # the preemption histogram (scheduler, 1.24+)
    era: str | None  # legacy_predicates | predicate_names | taints_nokey | taint_v118 | taint_v124 | taint_v135
    text: str
    event_reason: str = ""  # FailedScheduling, NotTriggerScaleUp, ... when the text said so
    wouldnt_fit: bool = False  # autoscaler: "it wouldn't fit if a new node is added"
    scale_up_failure: ScaleUpFailure | None = None
    age_s: float | None = None  # from an event table's Age column
    component: str = ""  # default-scheduler, cluster-autoscaler, karpenter, ...
    postfilter: str = ""  # PostFilter clauses other than preemption, e.g. "no new claims to deallocate" (DRA)

    @property
    def preemption_kind(self) -> str | None:
        """``no_victims`` | ``not_helpful`` | None: which preemption answer covers more nodes (ties: no_victims)."""
        victims = sum(r.count for r in self.preemption if r.reason == "preempt_no_victims")
        helpless = sum(r.count for r in self.preemption if r.reason == "preempt_not_helpful")
        if victims == 0 and helpless == 0:
            return None
        return "no_victims" if victims >= helpless else "not_helpful"

    def count(self, label: str) -> int:
        return sum(r.count for r in self.reasons if r.reason == label)


@dataclass(frozen=True)
class EventsText:
    """Every message found in a piece of text, in text order."""

    messages: tuple[SchedulingMessage, ...]

    def scheduler(self) -> SchedulingMessage | None:
        """The most recent scheduler message with reasons (smallest Age when every one has one, else the last)."""
        found = [m for m in self.messages if m.source == "scheduler" and (m.reasons or m.total_nodes is not None)]
        if not found:
            return None
        if all(m.age_s is not None for m in found):
            best = min(m.age_s for m in found if m.age_s is not None)
            return [m for m in found if m.age_s == best][-1]
        return found[-1]

    def autoscaler(self) -> tuple[SchedulingMessage, ...]:
        return tuple(m for m in self.messages if m.source == "autoscaler")

    def facts_reasons(self) -> tuple[Reason, ...]:
        """The reasons the diagnose JSON lists: the latest scheduler message's, then the autoscaler's own labels
        (max node group size, backoff, limits); only the autoscaler's when there is no scheduler message."""
        primary = self.scheduler()
        auto = [r for m in self.autoscaler() for r in m.reasons]
        if primary is None:
            return tuple(auto)
        extra = [r for r in auto if r.reason in ("max_group_size", "scale_up_backoff", "cluster_resource_limit")]
        return (*primary.reasons, *extra)


# --- normalisation ---------------------------------------------------------------------------------------------

_MD_LINK = re.compile(r"\[([^\[\]\n]*)\]\((?:[a-z]+://)?[^)\s]*\)")
_WS = re.compile(r"\s+")


def _clean(text: str) -> str:
    text = _MD_LINK.sub(r"\1", text)
    text = text.replace("''", "'").replace("\u2019", "'").replace("\u2018", "'")
    return _WS.sub(" ", text).strip()


# --- reason rules ----------------------------------------------------------------------------------------------

_TAINT_BRACES = re.compile(r"\{(?P<body>[^{}]*)\}")  # body stripped by the caller (linear)
_RULES: tuple[tuple[re.Pattern[str], str, str | None], ...] = tuple(
    (re.compile(pattern, re.I), label, era)
    for pattern, label, era in (
        (r"untolerated taint\(s\)", "untolerated_taint", "taint_v135"),
        (r"had untolerated taint", "untolerated_taint", "taint_v124"),
        (r"had taint\s*\{[^{}]*\}\s*,?\s*that the pod didn'?t tolerate", "untolerated_taint", "taint_v118"),
        (
            r"had taints? that the pod didn'?t tolerate|taints? that the pod didn'?t tolerate",
            "untolerated_taint",
            "taints_nokey",
        ),
        (r"^podtoleratesnodetaints$|^taint ?toleration$", "untolerated_taint", "predicate_names"),
        (r"^insufficient\b", "insufficient", None),
        (r"^too many pods$|^podfitsresources$", "too_many_pods", None),
        (r"max volume count|^max\w*volumecount\w*$", "max_volume_count", None),
        (
            r"node affinity/selector|didn'?t match (?:the )?node selector|didn'?t match pod'?s node affinity"
            r"|didn'?t match node affinity|^matchnodeselector$|^nodeaffinity$|didn'?t have the requested labels"
            r"|^checknodelabelpresence$|didn'?t satisfy plugin\(s\) \[nodeaffinity\]",
            "node_affinity_mismatch",
            None,
        ),
        (r"requested (?:node name|hostname)|^hostname$|^podfitshost$|^nodename$", "node_name_mismatch", None),
        (r"pod affinity/anti-affinity|^matchinterpodaffinity$", "pod_affinity_legacy", None),
        (
            r"pod anti-affinity rules|existing pods anti-affinity|existing pods' anti-affinity",
            "pod_anti_affinity_mismatch",
            None,
        ),
        (r"pod affinity rules|^interpodaffinity$", "pod_affinity_mismatch", None),
        (r"topology spread constraints|^evenpodsspread$|^podtopologyspread$", "topology_spread_mismatch", None),
        (r"free ports|^podfitshostports$|^nodeports$", "host_port_conflict", None),
        (r"volume node affinity conflict", "volume_node_affinity_conflict", None),
        (r"unbound immediate persistentvolumeclaims?|^checkvolumebinding$", "unbound_immediate_pvc", None),
        (
            r"available persistent volumes to bind|enough free storage|bound to non-existent pv",
            "volume_binding_conflict",
            None,
        ),
        (r"no available volume zone|^novolumezoneconflict$", "volume_zone_conflict", None),
        (r"no available disk|^nodiskconflict$|readwriteoncepod", "volume_conflict", None),
        (r"were unschedulable|^checknodeunschedulable\w*$|^nodeunschedulable$", "node_unschedulable", None),
        # node conditions: the texts of 1.10+ and the old predicate failure names (predicates/error.go:
        # NodeNotReady, NodeUnderMemoryPressure, NodeUnderDiskPressure, NodeUnderPIDPressure, NodeOutOfDisk, ...)
        (r"were not ready|^checknodecondition\w*$|^nodenotready$", "node_not_ready", None),
        (r"memory pressure|^checknodememorypressure\w*$|^nodeunder ?memory ?pressure$", "node_memory_pressure", None),
        (
            r"disk pressure|out of disk|^checknodediskpressure\w*$|^nodeunder ?disk ?pressure$|^nodeout ?of ?disk$",
            "node_disk_pressure",
            None,
        ),
        (r"pid pressure|^checknodepidpressure\w*$|^nodeunder ?pid ?pressure$", "node_pid_pressure", None),
        (
            r"(?:unavailable|un ?available) network|network unavailable|^nodenetworkunavailable$",
            "node_network_unavailable",
            None,
        ),
        (r"unknown condition|^nodeunknowncondition$", "node_unknown_condition", None),
        (r"being deleted|tobedeletedbyclusterautoscaler", "node_being_deleted", None),
        (r"no preemption victims", "preempt_no_victims", None),
        (r"preemption is not helpful", "preempt_not_helpful", None),
        (r"max node group size reached", "max_group_size", None),
        (r"backoff after failed scale-?up", "scale_up_backoff", None),
        (
            r"max (?:cluster|total) \w+|limit reached|exceeds? (?:the )?(?:cluster|node group) limit",
            "cluster_resource_limit",
            None,
        ),
    )
)
_GPU_RESOURCE = re.compile(r"(?:^|/)gpu$|^nvidia\.com/mig-|^gpu\.intel\.com/", re.I)
_STANDARD_RESOURCES = {
    "cpu": "insufficient_cpu",
    "memory": "insufficient_memory",
    "ephemeral-storage": "insufficient_ephemeral_storage",
    "pods": "too_many_pods",
}


def _taint(body: str) -> tuple[str, str]:
    """``key: value`` (scheduler), ``key=value:Effect`` (kubectl style), ``key`` -> (key, value)."""
    body = body.strip()
    if "=" in body and (": " not in body or body.index("=") < body.index(": ")):
        key, _, rest = body.partition("=")
        value = (
            rest.rsplit(":", 1)[0]
            if re.search(r":\s*(?:NoSchedule|NoExecute|PreferNoSchedule)\s*$", rest, re.I)
            else rest
        )
        return key.strip(), value.strip()
    if ":" in body:
        key, _, value = body.partition(":")
        return key.strip(), value.strip()
    return body, ""


def classify(text: str, count: int) -> Reason:
    """One histogram entry's text (without its count) as a :class:`Reason`; ``raw`` is set by the caller."""
    entry = text.strip().strip(" .,;'\"")
    for pattern, label, _era in _RULES:
        if not pattern.search(entry):
            continue
        if label == "insufficient":
            resource = re.sub(r"^insufficient\s+", "", entry, flags=re.I).strip(" .,;'\"") or None
            if resource is None:
                return Reason(count, "insufficient_extended", entry)
            lowered = resource.lower()
            if lowered in _STANDARD_RESOURCES:
                return Reason(count, _STANDARD_RESOURCES[lowered], entry, resource=lowered)
            if _GPU_RESOURCE.search(resource):
                return Reason(count, "insufficient_gpu", entry, resource=resource)
            return Reason(count, "insufficient_extended", entry, resource=resource)
        if label == "too_many_pods":
            return Reason(count, label, entry, resource="pods")
        if label == "untolerated_taint":
            braces = _TAINT_BRACES.search(entry)
            if braces is None:
                return Reason(count, label, entry)
            key, value = _taint(braces.group("body").strip())
            state = health_label(key)
            return Reason(count, state or label, entry, taint_key=key, taint_value=value)
        return Reason(count, label, entry)
    return Reason(count, "other", entry)


def _era(text: str) -> str | None:
    for pattern, _label, era in _RULES:
        if era is not None and pattern.search(text):
            return era
    return None


# --- message grammar -------------------------------------------------------------------------------------------

_HEAD = re.compile(r"(?<!\d)(?P<avail>\d+)\s*/\s*(?P<total>\d+)\s+nodes?\s+(?:are|is)\s+available\s*:?", re.I)
_LEGACY_HEAD = re.compile(
    r"no nodes are available that match all of the (?:following )?predicates\s*:+|fit failure summary on nodes\s*:",
    re.I,
)
_AUTOSCALER_HEAD = re.compile(
    r"pod didn'?t trigger scale-?up(?P<fit>\s*\(it wouldn'?t fit if a new node is added\))?\s*:?", re.I
)
_SCALE_UP_FAILED = re.compile(
    r"scale-?up failed for group\s+(?P<group>[^:\s]+)\s*:\s*target size\s+(?P<target>\d+)\s+requested outside"
    r"\s+max\s*:?\s*(?P<max>\d+)\s*,?\s*min\s*:?\s*(?P<min>\d+)",
    re.I,
)
_PREEMPTION = re.compile(r"\bpreemption\s*:", re.I)
#: The histogram's closing " %v." separator: a period, blanks, then a word (a PostFilter message), never a count.
_FILTER_END = re.compile(r"\.\s+(?=[A-Za-z])")
_ITEM_START = re.compile(r"(?:^|(?<=[,.;:]))\s*(?P<count>\d+)\s+(?=[^\d\s/])")
_LEGACY_ITEM = re.compile(r"(?<![^,()])(?P<text>[^,()]*?[^,()\s])\s*\(\s*(?P<count>\d+)\s*\)")


def _histogram(text: str) -> list[Reason]:
    starts = list(_ITEM_START.finditer(text))
    out: list[Reason] = []
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        body = text[match.end() : end].strip().rstrip(" .,;")
        if not body:
            continue
        raw = f"{match.group('count')} {body}"
        reason = classify(body, int(match.group("count")))
        out.append(_with_raw(reason, raw))
    return out


def _with_raw(reason: Reason, raw: str) -> Reason:
    return Reason(reason.count, reason.reason, raw, reason.taint_key, reason.taint_value, reason.resource)


def _legacy_histogram(text: str) -> list[Reason]:
    out = []
    for match in _LEGACY_ITEM.finditer(text):
        body = match.group("text").strip(" .,;:")
        if body:
            raw = f"{body} ({match.group('count')})"
            out.append(_with_raw(classify(body, int(match.group("count"))), raw))
    return out


def parse_message(text: str) -> SchedulingMessage:
    """One scheduler or autoscaler message (the text of a ``FailedScheduling`` / ``NotTriggerScaleUp`` event)."""
    clean = _clean(text if isinstance(text, str) else "")
    failed = _SCALE_UP_FAILED.search(clean)
    if failed:
        return SchedulingMessage(
            "autoscaler",
            None,
            (),
            (),
            None,
            clean,
            event_reason="FailedToScaleUpGroup",
            scale_up_failure=ScaleUpFailure(
                failed.group("group"),
                int(failed.group("target")),
                int(failed.group("max")),
                int(failed.group("min")),
                failed.group(0),
            ),
        )
    auto = _AUTOSCALER_HEAD.search(clean)
    if auto:
        body = clean[auto.end() :]
        return SchedulingMessage(
            "autoscaler",
            None,
            tuple(_histogram(body)),
            (),
            _era(body),
            clean,
            event_reason="NotTriggerScaleUp",
            wouldnt_fit=bool(auto.group("fit")),
        )
    legacy = _LEGACY_HEAD.search(clean)
    if legacy:
        body = clean[legacy.end() :]
        return SchedulingMessage(
            "scheduler",
            None,
            tuple(_legacy_histogram(body)),
            (),
            "legacy_predicates",
            clean,
            event_reason="FailedScheduling",
        )
    head = _HEAD.search(clean)
    total: int | None = None
    body = clean
    if head:
        total = int(head.group("total"))
        body = clean[head.end() :]
    preemption: list[Reason] = []
    split = _PREEMPTION.search(body)
    if split:
        tail = body[split.end() :]
        body = body[: split.start()]
        tail_head = _HEAD.search(tail)
        preemption = _histogram(tail[tail_head.end() :] if tail_head else tail)
    body, postfilter = _split_postfilter(body)
    reasons = _histogram(body)
    if any(r.reason == "untolerated_taint" and r.raw.lower().endswith("podtoleratesnodetaints") for r in reasons):
        era: str | None = "predicate_names"
    else:
        era = _era(body)
    return SchedulingMessage(
        "scheduler",
        total,
        tuple(reasons),
        tuple(preemption),
        era,
        clean,
        event_reason="FailedScheduling",
        postfilter=postfilter,
    )


def _split_postfilter(body: str) -> tuple[str, str]:
    """(histogram, PostFilter clauses before "preemption:"): the histogram ends at the first ". word" after its
    first counted item (a PreFilter message before the histogram has no count)."""
    first = _ITEM_START.search(body)
    if first is None:
        return body, ""
    end = _FILTER_END.search(body, first.end())
    if end is None:
        return body, ""
    return body[: end.start()], body[end.end() :].strip(" .,;")


# --- event tables ----------------------------------------------------------------------------------------------

_ROW_START = re.compile(
    r"^[ \t]*(?:\|[ \t]*)?(?:(?:Normal|Warning)\b|[A-Z][A-Za-z]+\s{2,}\d)"
    r"|^[ \t]*(?:[0-9][0-9smhd]*\s+)?(?:Normal|Warning)\s+[A-Z]"
    r"|event\.go:\d+\]|^[ \t]*Events:|^[ \t]*Type\s+Reason\s+Age|^[ \t]*LAST SEEN\b"
    r"|^[ \t]*(?:-[ \t]*)?(?:message|reason|type|status|lastProbeTime|lastTransitionTime|phase|conditions|qosClass"
    r"|hostIP|podIP|startTime|note|involvedObject|source|count|firstTimestamp|lastTimestamp|metadata|kind|apiVersion)\s*:"
)
_EVENT_REASON = re.compile(
    r"\b(FailedScheduling|NotTriggerScaleUp|TriggeredScaleUp|FailedToScaleUpGroup|FailedScaleUp|ScaleDown|Scheduled"
    r"|Preempted|Evicted)\b"
)
_MESSAGE_START = re.compile(
    _HEAD.pattern + "|" + _LEGACY_HEAD.pattern + "|" + _AUTOSCALER_HEAD.pattern + "|" + _SCALE_UP_FAILED.pattern,
    re.I,
)
_HEADLESS = re.compile(
    r"\b\d+\s+(?:node\(s\)|nodes?\b|insufficient\b|too many pods|pod has unbound|podtoleratesnodetaints"
    r"|matchnodeselector)",
    re.I,
)
_AGE = re.compile(r"(?:^|\s|\|)(?P<age>(?:\d+[dhms])+)(?:\s*\(x(?P<times>\d+) over [0-9dhms]+\))?\s*(?:\||\s)")
_COMPONENT = re.compile(r"\b([a-z][a-z0-9-]{0,62}(?:scheduler|autoscaler)|karpenter)\b", re.I)  # bounded: linear


def _seconds(age: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+)([dhms])", age):
        total += int(number) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[unit]
    return total


def _records(text: str) -> list[str]:
    """Lines grouped into records: an event row or YAML key starts one; folded continuation lines join it."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not records or _ROW_START.search(line):
            records.append([line])
        else:
            records[-1].append(line)
    return [" ".join(part.strip() for part in record) for record in records]


def _quoted_end(record: str, start: int) -> int:
    """Where a message that starts right after a quote ends (its closing quote), else the record's end."""
    before = record[:start].rstrip()
    if not before or before[-1] not in "'\"" or not before[:-1].rstrip().endswith(":"):
        return len(record)
    quote = before[-1]
    i = start
    while i < len(record):
        if record[i] == quote:
            if quote == "'" and record[i : i + 2] == "''":
                i += 2
                continue
            return i
        i += 1
    return len(record)


def parse_events(text: str) -> EventsText:
    """Every scheduler/autoscaler message in ``text``: a bare message, ``kubectl describe pod`` Events (columns or
    a pasted console table), ``kubectl get events``, a pod status in YAML, or an autoscaler log line."""
    if not isinstance(text, str) or not text.strip():
        return EventsText(())
    messages: list[SchedulingMessage] = []
    for record in _records(text):
        starts = [m for m in _MESSAGE_START.finditer(record)]
        # "preemption: 0/N nodes are available" continues the message before it
        starts = [m for m in starts if not _PREEMPTION.search(record[max(0, m.start() - 14) : m.start()])]
        if starts:
            starts_at = [m.start() for m in starts]
        else:
            headless = _HEADLESS.search(record)
            if headless is None:
                continue
            starts_at = [headless.start()]
        prefix = record[: starts_at[0]]
        reason_match = _EVENT_REASON.search(prefix)
        age_match = _AGE.search(prefix + " ")
        component = _COMPONENT.search(prefix)
        for i, start in enumerate(starts_at):
            end = starts_at[i + 1] if i + 1 < len(starts_at) else _quoted_end(record, start)
            body = record[start:end].rstrip(" |")
            message = parse_message(body)
            if (
                not message.reasons
                and message.total_nodes is None
                and message.scale_up_failure is None
                and not message.wouldnt_fit
                and message.source == "scheduler"
            ):
                continue
            event_reason = message.event_reason
            if reason_match and i == 0:
                event_reason = reason_match.group(1)
            messages.append(
                SchedulingMessage(
                    message.source,
                    message.total_nodes,
                    message.reasons,
                    message.preemption,
                    message.era,
                    message.text,
                    event_reason,
                    message.wouldnt_fit,
                    message.scale_up_failure,
                    _seconds(age_match.group("age")) if age_match and i == 0 else None,
                    component.group(1) if component and i == 0 else "",
                    message.postfilter,
                )
            )
    return EventsText(tuple(messages))


# --- verdict from text alone -------------------------------------------------------------------------------------


def text_verdict(
    reasons: Iterable[Reason], preemption: str | None, wouldnt_fit: bool = False, scale_up_failed: bool = False
) -> str | None:
    """``constraint | capacity | node_state | ambiguous`` (or None) from a message alone, without the cluster's objects.

    1. An untolerated taint of the GPU-pool kind (``sku=gpu``, ``nvidia.com/gpu``) and either no capacity reason or
       a GPU one: constraint (runbook S3: the GPU nodes exist, the pod lacks the toleration; the "Insufficient
       nvidia.com/gpu" nodes next to them are the pools without GPUs). A pod short of CPU elsewhere is not asking
       for the GPU pool, so rule 2 decides it.
    1b. An untolerated taint the message does not name (1.35+ "untolerated taint(s)", <= 1.17 "taints that the pod
       didn't tolerate", the predicate name) next to a GPU capacity reason: ambiguous. The tainted nodes may be the GPU
       pool the pod lacks a toleration for (constraint) or nodes it is not meant for while the GPUs are in use
       (capacity); only the nodes tell (``k8s.diagnose-pending --pod`` / ``--snapshot``).
    2. A capacity reason: some nodes passed every constraint filter and lacked resources: capacity. (The scheduler
       reports each node's first failing filter, and the resource filter comes after taints and affinity.)
    3. Else a constraint other than the control-plane/system taints: constraint.
    4. Else node-state reasons only (not ready, unreachable, pressure, cordoned, being deleted): node_state.
    5. Else the preemption answer: no victims = capacity, not helpful = constraint; the autoscaler's
       "it wouldn't fit if a new node is added" or a failed scale-up: capacity (no node can be added for it).
    """
    items = list(reasons)
    capacity = [r for r in items if r.kind == CAPACITY and r.count > 0]
    if any(r.gpu_pool_taint for r in items) and (not capacity or any(r.reason == "insufficient_gpu" for r in capacity)):
        return CONSTRAINT
    hidden = any(r.reason == "untolerated_taint" and not r.taint_key and r.count > 0 for r in items)
    if hidden and any(r.reason == "insufficient_gpu" for r in capacity):
        return AMBIGUOUS
    if capacity:
        return CAPACITY
    if any(r.kind == CONSTRAINT and r.reason != "other" and not r.expected_exclusion for r in items):
        return CONSTRAINT
    if any(r.kind == NODE_STATE for r in items):
        return NODE_STATE
    if wouldnt_fit or scale_up_failed or preemption == "no_victims":
        return CAPACITY
    if preemption == "not_helpful" or any(r.expected_exclusion or r.reason == "other" for r in items):
        return CONSTRAINT
    return None
