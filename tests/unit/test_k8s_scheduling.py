"""FailedScheduling / autoscaler / event-table parsers on the real corpus, the grammar, and any text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.core.parsers import detect_kind
from remediation.host.diagnose import diagnose
from remediation.k8s.scheduling import parse_events, parse_message, text_verdict
from tests.corpus import blocks

FS_CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus" / "failedscheduling-dev.md"


def _entries() -> dict[str, str]:
    text = FS_CORPUS.read_text(encoding="utf-8")
    return {m.group(1): m.group(2) for m in re.finditer(r"^### (\w+).*?\n```\n(.*?)\n```", text, re.M | re.S)}


# id -> (N, {label: count}, {preemption label: count}, verdict), from the corpus's "Expected" lines
EXPECTED = {
    "A02": (1, {"insufficient_gpu": 1}, {"preempt_no_victims": 1}, "capacity"),
    "A04": (1, {"insufficient_gpu": 1}, {}, "capacity"),
    "A06": (3, {"insufficient_gpu": 3}, {}, "capacity"),
    "A08": (3, {"insufficient_extended": 3}, {}, "capacity"),
    "A10": (4, {"pod_affinity_mismatch": 1, "insufficient_gpu": 3},
            {"preempt_not_helpful": 1, "preempt_no_victims": 3}, "capacity"),
    "A12": (12, {"pod_anti_affinity_mismatch": 1, "node_unreachable": 1, "volume_node_affinity_conflict": 2,
                 "node_affinity_mismatch": 8}, {"preempt_no_victims": 1, "preempt_not_helpful": 11}, "constraint"),
    "A14": (10, {"volume_node_affinity_conflict": 3, "node_affinity_mismatch": 7}, {"preempt_not_helpful": 10},
            "constraint"),
    "A16": (9, {"pod_affinity_legacy": 1, "volume_node_affinity_conflict": 8}, {}, "constraint"),
    "A18": (4, {"volume_node_affinity_conflict": 4}, {}, "constraint"),
    "A20": (3, {"unbound_immediate_pvc": 3}, {"preempt_not_helpful": 3}, "constraint"),
    "A22": (1, {"node_not_ready": 1}, {}, "node_state"),
    "A24": (3, {"pod_anti_affinity_mismatch": 1, "node_unreachable": 1, "node_affinity_mismatch": 2},
            {"preempt_not_helpful": 3}, "constraint"),
    "A26": (1, {"untolerated_taint": 1}, {}, "constraint"),
    "A28": (4, {"max_volume_count": 1, "node_affinity_mismatch": 3}, {}, "capacity"),
    "A30": (6, {"untolerated_taint": 4, "topology_spread_mismatch": 2},
            {"topology_spread_mismatch": 2, "preempt_not_helpful": 4}, "constraint"),
    "A32": (6, {"insufficient_memory": 1, "untolerated_taint": 1, "insufficient_cpu": 4},
            {"preempt_not_helpful": 1, "preempt_no_victims": 5}, "capacity"),
    "A34": (1, {"host_port_conflict": 1}, {"preempt_no_victims": 1}, "constraint"),
    "A36": (5, {"node_unschedulable": 2, "too_many_pods": 3}, {}, "capacity"),
    "A38": (8, {"insufficient_cpu": 8, "insufficient_memory": 8}, {}, "capacity"),
    "A40": (18, {"insufficient_ephemeral_storage": 18, "node_affinity_mismatch": 3}, {}, "capacity"),
    "A42": (25, {"too_many_pods": 1, "untolerated_taint": 1, "insufficient_cpu": 23}, {}, "capacity"),
    "A44": (None, {"insufficient_cpu": 9, "insufficient_memory": 15, "node_affinity_mismatch": 18}, {}, "capacity"),
    "C2": (12, {"untolerated_taint": 3, "node_affinity_mismatch": 9}, {"preempt_not_helpful": 12}, "constraint"),
    "C4": (12, {"untolerated_taint": 3, "node_affinity_mismatch": 9}, {"preempt_not_helpful": 12}, "constraint"),
}
ERAS = {"A22": "taint_v118", "A26": "taints_nokey", "A30": "taint_v124", "A42": "predicate_names",
        "A44": "legacy_predicates", "C2": "taint_v124", "C4": "taint_v135"}


def _counts(reasons: object) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in reasons:  # type: ignore[attr-defined]
        out[r.reason] = out.get(r.reason, 0) + r.count
    return out


@pytest.mark.parametrize("entry", sorted(EXPECTED))
def test_scheduler_corpus(entry: str) -> None:
    total, labels, preemption, verdict = EXPECTED[entry]
    message = parse_events(_entries()[entry]).scheduler()
    assert message is not None
    assert message.total_nodes == total
    assert _counts(message.reasons) == labels
    assert _counts(message.preemption) == preemption
    if entry in ERAS:
        assert message.era == ERAS[entry]
    result = diagnose(_entries()[entry])
    assert result.kind == "failed-scheduling"
    assert result.facts["verdict"] == verdict
    assert set(result.facts) == {"total_nodes", "reasons", "preemption", "verdict"}
    for reason in result.facts["reasons"]:
        assert set(reason) == {"count", "reason", "raw", "taint_key", "taint_value", "resource"}


def test_taint_keys_and_values_by_era() -> None:
    entries = _entries()
    a30 = parse_message(entries["A30"]).reasons
    assert [(r.taint_key, r.taint_value) for r in a30 if r.reason == "untolerated_taint"] == [
        ("unschedulable", "true"), ("node-role.kubernetes.io/master", "")]
    a12 = [r for r in parse_message(entries["A12"]).reasons if r.reason == "node_unreachable"]
    assert a12[0].taint_key == "node.kubernetes.io/unreachable"
    c4 = parse_message(entries["C4"]).reasons[0]
    assert (c4.reason, c4.taint_key, c4.taint_value) == ("untolerated_taint", None, None)
    assert parse_message(entries["A02"]).reasons[0].resource == "nvidia.com/gpu"
    assert {r.resource for r in parse_message(entries["A08"]).reasons} == {"GPU Memory in one device",
                                                                            "aliyun.com/gpu-mem"}


def test_preemption_kind() -> None:
    entries = _entries()
    assert parse_message(entries["A02"]).preemption_kind == "no_victims"
    assert parse_message(entries["A14"]).preemption_kind == "not_helpful"
    assert parse_message(entries["A04"]).preemption_kind is None


def test_autoscaler_corpus() -> None:
    entries = _entries()
    b1 = parse_events(entries["B1"]).autoscaler()[0]
    assert _counts(b1.reasons) == {"node_affinity_mismatch": 12, "max_group_size": 3}
    assert _counts(parse_events(entries["B3"]).autoscaler()[0].reasons) == {"scale_up_backoff": 1}
    b5 = parse_events(entries["B5"]).autoscaler()[0].scale_up_failure
    assert b5 is not None and (b5.group, b5.target, b5.max, b5.min) == ("agentpool", 5, 10, 6)
    assert parse_events(entries["B7"]).autoscaler()[0].wouldnt_fit
    assert {f.id for f in diagnose(entries["B1"]).findings} >= {"K8S-PEND-007"}
    assert {f.id for f in diagnose(entries["B3"]).findings} == {"K8S-PEND-009"}
    assert diagnose(entries["B7"]).facts["verdict"] == "capacity"


def test_describe_event_tables_from_the_field() -> None:
    b = blocks()
    k32 = diagnose(b["7.2"][0])
    assert k32.kind == "k8s-events" and k32.facts["total_nodes"] == 1
    assert k32.facts["reasons"][0]["reason"] == "insufficient_gpu"
    assert k32.facts["reasons"][0]["resource"] == "amd.com/gpu"
    assert k32.facts["preemption"] == "no_victims"
    # a console table: the most recent row (smallest Age) wins
    k74 = diagnose(b["7.4"][0])
    assert k74.kind == "k8s-events" and k74.facts["total_nodes"] == 10
    k76 = diagnose(b["7.6"][0])
    assert {r["reason"] for r in k76.facts["reasons"]} == {"insufficient_gpu", "max_group_size"}
    assert {"K8S-PEND-004", "K8S-PEND-007", "K8S-PEND-009"} <= {f.id for f in k76.findings}
    k78 = diagnose(b["7.8"][0])  # Markdown link wrappers around dotted names
    keys = {r["taint_key"] for r in k78.facts["reasons"]}
    assert "node.statcan.gc.ca/purpose" in keys and "remediator.aks.microsoft.com/unschedulable" in keys
    assert any(r["resource"] == "nvidia.com/gpu" for r in k78.facts["reasons"])
    k710 = diagnose(b["7.10"][0])  # no "0/N nodes are available" head
    assert k710.facts["total_nodes"] is None
    assert (k710.facts["reasons"][0]["taint_key"], k710.facts["reasons"][0]["taint_value"]) == (
        "nvidia.com/gpu", "present")
    assert k710.facts["verdict"] == "constraint"
    k714 = diagnose(b["7.14"][0])  # an autoscaler log line carrying the event
    assert k714.kind == "k8s-events" and k714.facts["reasons"][0]["count"] == 6
    k712 = diagnose(b["7.12"][0])
    assert _counts_dict(k712.facts["reasons"]) == {"node_affinity_mismatch": 3, "insufficient_gpu": 6}
    k716 = diagnose(b["7.16"][0])  # a CPU pod next to the tainted GPU pool: capacity, not the taint
    assert k716.facts["verdict"] == "capacity"
    assert diagnose(b["7.18"][0]).facts["total_nodes"] == 3


def _counts_dict(reasons: list[dict[str, object]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in reasons:
        out[str(r["reason"])] = out.get(str(r["reason"]), 0) + int(str(r["count"]))
    return out


def test_runbook_describe_with_folded_message_and_kubectl_style_taint() -> None:
    text = """Events:
  Warning  FailedScheduling  18m   0/12 nodes are available:
    3 node(s) had untolerated taint {sku=gpu:NoSchedule},
    9 node(s) didn't match Pod's node affinity/selector.
"""
    result = diagnose(text)
    assert result.kind == "k8s-events"
    assert result.facts["total_nodes"] == 12
    first = result.facts["reasons"][0]
    assert (first["reason"], first["taint_key"], first["taint_value"], first["count"]) == (
        "untolerated_taint", "sku", "gpu", 3)
    assert result.facts["verdict"] == "constraint"
    assert [f.id for f in result.findings] == ["K8S-PEND-001"]


def test_yaml_folded_pod_status() -> None:
    folded = """status:
  conditions:
  - lastProbeTime: null
    message: '0/3 nodes are available: 1 node(s) didn''t match pod anti-affinity
      rules, 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: },
      2 node(s) didn''t match Pod''s node affinity/selector. preemption: 0/3 nodes
      are available: 3 Preemption is not helpful for scheduling.'
    reason: Unschedulable
"""
    message = parse_events(folded).scheduler()
    assert message is not None and message.total_nodes == 3
    assert _counts(message.reasons) == {"pod_anti_affinity_mismatch": 1, "node_unreachable": 1,
                                        "node_affinity_mismatch": 2}
    assert _counts(message.preemption) == {"preempt_not_helpful": 3}


def test_case_double_period_and_stray_separators() -> None:
    message = parse_message("0/3 NODES ARE AVAILABLE: 1 INSUFFICIENT NVIDIA.COM/GPU. , 2 NODE(S) HAD UNTOLERATED "
                            "TAINT {SKU: GPU}..")
    assert message.total_nodes == 3
    assert _counts(message.reasons) == {"insufficient_gpu": 1, "untolerated_taint": 2}


def test_node_health_taints_are_node_state_not_constraints() -> None:
    for key, label in (("node.kubernetes.io/not-ready", "node_not_ready"),
                       ("node.kubernetes.io/memory-pressure", "node_memory_pressure"),
                       ("ToBeDeletedByClusterAutoscaler", "node_being_deleted")):
        message = parse_message(f"0/2 nodes are available: 2 node(s) had untolerated taint {{{key}: }}.")
        assert message.reasons[0].reason == label
        assert text_verdict(message.reasons, None) == "node_state"
        assert diagnose(message.text).facts["verdict"] == "node_state"


# --- the grammar, generated -------------------------------------------------------------------------------------

_REASONS = [
    ("Insufficient nvidia.com/gpu", "insufficient_gpu"),
    ("Insufficient cpu", "insufficient_cpu"),
    ("Insufficient memory", "insufficient_memory"),
    ("node(s) had untolerated taint {sku: gpu}", "untolerated_taint"),
    ("node(s) had untolerated taint(s)", "untolerated_taint"),
    ("node(s) had taint {dedicated: ml}, that the pod didn't tolerate", "untolerated_taint"),
    ("node(s) had taints that the pod didn't tolerate", "untolerated_taint"),
    ("node(s) didn't match Pod's node affinity/selector", "node_affinity_mismatch"),
    ("node(s) didn't match node selector", "node_affinity_mismatch"),
    ("node(s) were unschedulable", "node_unschedulable"),
    ("node(s) didn't match pod anti-affinity rules", "pod_anti_affinity_mismatch"),
    ("node(s) had volume node affinity conflict", "volume_node_affinity_conflict"),
    ("node(s) didn't have free ports for the requested pod ports", "host_port_conflict"),
    ("Too many pods", "too_many_pods"),
]


@st.composite
def _messages(draw: st.DrawFn) -> tuple[str, int, dict[str, int]]:
    picks = draw(st.lists(st.sampled_from(_REASONS), min_size=1, max_size=5, unique_by=lambda r: r[0]))
    counts = [draw(st.integers(1, 40)) for _ in picks]
    total = draw(st.integers(1, 60))
    items = sorted(f"{c} {text}" for c, (text, _) in zip(counts, picks, strict=True))
    body = ", ".join(items)
    end = draw(st.sampled_from(["", ".", "..", " ."]))
    text = f"0/{total} nodes are available: {body}{end}"
    if draw(st.booleans()):
        text += f" preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling."
    case = draw(st.sampled_from([str, str.lower, str.upper]))
    text = case(text)
    if draw(st.booleans()):  # folded like YAML: newlines and indentation between words
        words = text.split(" ")
        text = "\n      ".join(" ".join(words[i : i + 5]) for i in range(0, len(words), 5))
    expected: dict[str, int] = {}
    for c, (_, label) in zip(counts, picks, strict=True):
        expected[label] = expected.get(label, 0) + c
    return text, total, expected


@settings(max_examples=150, deadline=None)
@given(_messages())
def test_any_rendering_of_the_grammar(case: tuple[str, int, dict[str, int]]) -> None:
    text, total, expected = case
    message = parse_message(text)
    assert message.total_nodes == total
    assert _counts(message.reasons) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_no_crash_on_any_text(text: str) -> None:
    parse_events(text)
    parse_message(text)
    detect_kind(text)
    if text.strip():
        result = diagnose(text, kind="failed-scheduling")
        assert set(result.facts) == {"total_nodes", "reasons", "preemption", "verdict"}
        diagnose(text, kind="k8s-events")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["0/", "3 ", "nodes are available:", " node(s) had untolerated taint {", "}", ",",
                                 "Insufficient ", "preemption:", "'", "\n  ", "..", "pod didn't trigger scale-up",
                                 "(x2 over 5m)", "Warning  FailedScheduling  5m  ", "[a](http://b)", "=", ":"]),
                max_size=30))
def test_no_crash_on_near_miss_text(parts: list[str]) -> None:
    text = "".join(parts)
    parse_events(text)
    if text.strip():
        diagnose(text, kind="k8s-events")
