"""The pure part of the audit is linear in the fleet's size: 5,000 synthetic facts documents through parsing, every
check and fleet-wide rule, every report format and the comparison with the previous run (issue 25).

No clock: the work is counted. Python function calls (cProfile's counts, deterministic) at 5,000 hosts are at most
6x those at 1,000 (linear is 5x; a step quadratic in the hosts shows as 25x on its own functions), and no function
of this project is called more than 6.5x as often (a library's bounded cache, rich's cell widths, misses more often
in a bigger table: not a step of ours). A quadratic step in C that calls no Python function (``name in a_list``
inside a loop over hosts) is caught by the host names themselves: they are a ``str`` subclass that counts its ``==``,
which a list scan calls once per element and a dict or set look-up at most once.
"""

from __future__ import annotations

import cProfile
import datetime as _dt
import json
import pstats
from pathlib import Path

import pytest

from remediation.host.audit import AuditOptions, AuditResult, audit_runs
from remediation.host.history import compare
from remediation.report.formats import FORMATS, render
from remediation.transport.fanout import FanoutResult, HostRun, Status
from remediation.transport.inventory import Host

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
STARTED = _dt.datetime(2026, 12, 2, 8, 0, 0, tzinfo=_dt.UTC)

pytestmark = pytest.mark.slow


class CountedName(str):
    """A host name that counts how often it is compared for equality (hashing stays ``str``'s)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def _documents() -> list[str]:
    """The fixture probe documents (healthy, S1 kernel, thermal, XID 79, ...) as the probe prints them."""
    docs = [json.loads(p.read_text()) for p in sorted(FACTS.glob("*.json"))]
    assert len(docs) >= 5
    return [json.dumps(d) for d in docs]


def _pipeline(n: int, docs: list[str]) -> tuple[AuditResult, list[str]]:
    """``n`` hosts: facts from the documents (every 50th host unreachable, every 7th on another driver) -> findings
    -> every report format -> the comparison with itself as the previous run -> every host looked up by name."""
    hosts = [
        Host(CountedName(f"gpu-{i}"), "127.0.0.1",
             vars={"gpu_expected_count": 4} if i % 7 else {"azure_vm_size": "Standard_NC96ads_A100_v4"})
        for i in range(n)
    ]
    runs = {
        h.name: HostRun(h.name, Status.UNREACHABLE, None, "", "", 0.1, "refused") if i % 50 == 7
        else HostRun(h.name, Status.OK, 0, docs[i % len(docs)], "", 0.25)
        for i, h in enumerate(hosts)
    }
    result = AuditResult("gpu", "hosts.yml", STARTED, 1.0, audit_runs(hosts, FanoutResult(runs, 1.0), AuditOptions()))
    outputs = [render(result, fmt) or "" for fmt in FORMATS]
    compare(json.loads(outputs[FORMATS.index("json")]), result)
    for i in range(n):
        assert result.host(f"gpu-{i}").host == f"gpu-{i}"  # a plain str: a dict look-up compares once
    result.exit_code()
    return result, outputs


def _counted(n: int, docs: list[str]) -> tuple[dict[str, int], int, AuditResult]:
    CountedName.compared = 0
    profile = cProfile.Profile()
    profile.enable()
    try:
        result, outputs = _pipeline(n, docs)
    finally:
        profile.disable()
    compared = CountedName.compared
    assert all(outputs), "every format renders something"
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    calls = {f"{path}:{line}({name})": primitive for (path, line, name), (primitive, *_rest) in stats.items()}
    return calls, compared, result


def test_five_thousand_hosts_cost_five_times_one_thousand() -> None:
    docs = _documents()
    small, small_eq, small_result = _counted(1000, docs)
    large, large_eq, large_result = _counted(5000, docs)

    # The run did the work it is meant to bound: findings on most hosts, the unreachable ones kept, driver drift.
    assert len(large_result.hosts) == 5000 and len(large_result.not_probed) == 100
    assert sum(1 for h in large_result.hosts if h.findings) > 2500
    assert len(small_result.findings) * 4 < len(large_result.findings) < len(small_result.findings) * 6

    total_small, total_large = sum(small.values()), sum(large.values())
    assert total_large <= 6 * total_small, f"{total_large} calls at 5,000 hosts vs {total_small} at 1,000"
    grown = {
        name: (small.get(name, 0), count)
        for name, count in large.items()
        if "/remediation/" in name and count >= 5000 and count > 6.5 * max(small.get(name, 0), 1)
    }
    assert not grown, f"called more than 6.5x as often for 5x the hosts: {grown}"
    assert large_eq <= 6 * small_eq + 100, f"host names compared {large_eq} times at 5,000 vs {small_eq} at 1,000"


def test_the_name_counter_sees_a_list_scan() -> None:
    """The detector itself: a look-up by scanning a list of counted names is quadratic, a dict's is not."""
    names = [CountedName(f"gpu-{i}") for i in range(300)]
    by_name = dict.fromkeys(names)
    CountedName.compared = 0
    for i in range(300):
        assert f"gpu-{i}" in by_name
    dict_compares = CountedName.compared
    CountedName.compared = 0
    for i in range(300):
        assert f"gpu-{i}" in names
    assert dict_compares <= 300 and CountedName.compared >= 300 * 299 // 2
