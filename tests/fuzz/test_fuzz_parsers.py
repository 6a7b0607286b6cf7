"""Issue 20: fuzzing the text parsers and the facts loader (hypothesis, bounded: the file runs in well under 60 s).

- Every registered kind's ``score``/``parse`` and :func:`remediation.host.diagnose.diagnose` on arbitrary text (control
  characters, NULs, lone surrogates as ``surrogateescape`` leaves them, very long lines, keyword soup) raise nothing
  but the project's own errors and return their declared types.
- The facts loader on arbitrary JSON-like documents and on mutations of the real probe documents in
  tests/fixtures/facts/ raises nothing but :class:`~remediation.core.errors.ProbeError`; the audit's per-host boundary
  (:func:`remediation.host.audit.parse_run`) never raises, and the checks run on whatever it accepts.
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remediation.core.checks import Policy, run_fleet_checks
from remediation.core.errors import ProbeError, RemediationError
from remediation.core.facts import HostFacts, facts_from_dict
from remediation.core.parsers import KindSpec, kinds
from remediation.host.audit import parse_run
from remediation.host.diagnose import DiagnoseResult, diagnose, render_text
from remediation.transport.fanout import HostRun, Status

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
FIXTURES = {p.stem: json.loads(p.read_text()) for p in sorted(FACTS.glob("*.json"))}
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORDS = (
    "NVRM:", "Xid", "(PCI:0000:00:1e):", "79,", "pid=", "name=", "nvml", "error:", "NVIDIA-SMI", "Failed",
    "Start-Date:", "Install:", "(", ")", "[", "]", "{", "}", "|", "dkms", "status", "Insufficient",
    "nvidia.com/gpu", "0/5", "nodes",
    "are", "available:", "429", "Retry-After:", "CUDA", "out", "of", "memory.", "Tried", "to", "allocate", "GiB",
    "GPU", "0;", "Loading", "took", "s", "Events:", "Warning", "FailedScheduling", "=", ":", ",", "'", '"', "\t", " ",
)  # fmt: skip

# Any code point, surrogates included (what ``errors="surrogateescape"`` leaves in text), plus control characters.
ANY_CHAR = st.characters(blacklist_categories=())
TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=400),
    st.lists(st.sampled_from(WORDS), max_size=200).map(" ".join),
    st.lists(st.one_of(st.sampled_from(WORDS), st.text(ANY_CHAR, max_size=8)), max_size=100).map("\n".join),
    st.builds(
        lambda word, unit, n: word + unit * n,
        st.sampled_from(WORDS),
        st.sampled_from(["|", " ", "\x00", ":", "1", "\r", "\u2019"]),
        st.integers(1, 20_000),
    ),
)


def _kind_specs() -> list[KindSpec]:
    return list(kinds().values())


def _declared(function: Any) -> type | None:
    """The class ``function`` says it returns, when it says one (``object``: nothing to check)."""
    try:
        hint = get_type_hints(function).get("return")
    except Exception:  # an unresolvable annotation: nothing to check
        return None
    return hint if inspect.isclass(hint) and hint is not object else None


@pytest.mark.parametrize("spec", _kind_specs(), ids=lambda s: s.name)
@SETTINGS
@given(text=TEXT)
def test_kind_parsers_take_any_text(spec: KindSpec, text: str) -> None:
    score = spec.score(text)
    assert isinstance(score, int) and score >= 0
    parsed = spec.parse(text)
    declared = _declared(spec.parse)
    if declared is not None:
        assert isinstance(parsed, declared)
    try:
        result = diagnose(text, kind=spec.name)
    except RemediationError:
        return  # the project's refusal (empty text): the edge prints it
    assert isinstance(result, DiagnoseResult) and result.kind == spec.name
    json.dumps(result.to_dict())
    render_text(result)


@SETTINGS
@given(text=TEXT)
def test_diagnose_takes_any_text(text: str) -> None:
    try:
        result = diagnose(text, source="<fuzz>")
    except RemediationError as exc:
        assert "<fuzz>" in str(exc)  # one line naming the input (``<fuzz>: ...`` or ``... <fuzz> is empty``)
        return
    assert isinstance(result, DiagnoseResult)
    json.dumps(result.to_dict())
    render_text(result)


# --- the facts loader ---------------------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(),  # NaN and infinities included
    st.text(max_size=20),
    st.sampled_from(["", "none", "ok", "gpufleet.facts/1", "2026-12-04T08:00:00Z", "6.5.0-45-generic"]),
)
JSONISH = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


def _loads_or_probe_error(doc: Any) -> HostFacts | None:
    try:
        facts = facts_from_dict(doc, host="fuzz-host")
    except ProbeError as exc:
        assert str(exc).startswith("host fuzz-host: ") and len(str(exc)) < 1000
        return None
    assert isinstance(facts, HostFacts)
    run_fleet_checks({"fuzz-host": facts}, Policy())  # what the audit does next with accepted facts
    return facts


def _boundary(doc: Any) -> None:
    """The audit's per-host boundary on the document as the probe would print it: never raises."""
    try:
        stdout = json.dumps(doc)
    except ValueError:  # an int json cannot print: the probe could not have sent it
        return
    facts, error = parse_run(HostRun("fuzz-host", Status.OK, 0, stdout, "", 0.1))
    assert (facts is None) != (error is None)
    assert error is None or (error.startswith("probe output unusable: ") and "\n" not in error)


@SETTINGS
@given(doc=JSONISH)
def test_loader_on_arbitrary_documents(doc: Any) -> None:
    _loads_or_probe_error(doc)
    _boundary(doc)


@SETTINGS
@given(body=st.dictionaries(st.text(max_size=12), JSONISH, max_size=6))
def test_loader_on_arbitrary_documents_of_the_right_schema(body: dict[str, Any]) -> None:
    doc = {**body, "schema": "gpufleet.facts/1"}
    _loads_or_probe_error(doc)
    _boundary(doc)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return doc


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(sorted(FIXTURES)))
def test_loader_on_mutated_probe_documents(data: st.DataObject, name: str) -> None:
    doc = copy.deepcopy(FIXTURES[name])
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = [p for p in _paths(doc) if p != ("schema",)]
        path = data.draw(st.sampled_from(paths), label="path")
        doc = _replace(doc, path, data.draw(JSONISH, label="value"))
    _loads_or_probe_error(doc)
    _boundary(doc)
