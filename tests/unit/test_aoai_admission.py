"""Admission windows and the deployment pool, on a virtual clock: minute windows in microseconds of test time."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.aoai.admission import Admission, Limits, SlidingWindow, default_rpm
from remediation.aoai.client import ClientConfig, Deployment, Pool
from remediation.aoai.hints import RetryHint
from remediation.core.errors import UsageError


def test_sliding_window_waits_for_the_oldest_charges_to_leave_the_minute() -> None:
    window = SlidingWindow(capacity=1000, window=60)
    window.charge(600, now=0)
    window.charge(300, now=10)
    assert window.wait(100, now=20) == 0
    assert window.wait(101, now=20) == pytest.approx(40)  # the charge at t=0 leaves at t=60
    assert window.wait(800, now=20) == pytest.approx(50)  # needs both gone: t=70
    assert window.wait(1001, now=20) == math.inf  # never fits
    assert window.used(now=60) == 300
    assert window.used(now=70) == 0


def test_margin_holds_a_charge_longer_than_the_server() -> None:
    window = SlidingWindow(capacity=100, window=60, margin=1.2)
    window.charge(100, now=0)
    assert window.wait(1, now=60) == pytest.approx(1.2)


def test_azure_rpm_is_rpm_over_6_per_10_seconds() -> None:
    admission = Admission(Limits(tpm=80_000, rpm=default_rpm(80_000)))  # 480 RPM: 80 per 10 s
    assert default_rpm(80_000) == 480
    for i in range(80):
        assert admission.wait(10, now=i * 0.01) == 0
        admission.charge(10, now=i * 0.01)
    assert admission.wait(10, now=1.0) == pytest.approx(9.0)  # the first request leaves the 10 s window at t=10


def test_tpm_charge_is_prompt_plus_max_tokens_per_rolling_minute() -> None:
    admission = Admission(Limits(tpm=80_000, rpm=10_000))
    admission.charge(50_000, now=0)
    assert admission.wait(30_000, now=30) == 0
    admission.charge(30_000, now=30)
    assert admission.wait(1, now=59) == pytest.approx(1)


def _pool(*deployments: Deployment, **config: float) -> Pool:
    return Pool(list(deployments), ClientConfig(headroom=1.0, admission_lag_s=0.0, **config), random.Random(1))  # noqa: S311 - deterministic jitter for the test


def dep(name: str, tpm: int = 10_000, priority: int = 1, weight: float = 1.0) -> Deployment:
    return Deployment(name, f"https://{name}.openai.azure.com", tpm, rpm=600, priority=priority, weight=weight)


def test_priority_first_then_overflow_when_the_primary_is_full() -> None:
    pool = _pool(dep("primary"), dep("overflow", priority=2))
    state, at, why = pool.choose(6000, now=0, deadline=300)
    assert (state.name, at, why) == ("primary", 0, None)  # type: ignore[union-attr]
    pool.admit(state, 6000, now=0)  # type: ignore[arg-type]
    state, at, _ = pool.choose(6000, now=1, deadline=300)
    assert state.name == "overflow" and at == 1  # type: ignore[union-attr]
    pool.admit(state, 6000, now=1)  # type: ignore[arg-type]
    state, at, _ = pool.choose(6000, now=2, deadline=300)  # both full: the earliest to free up, primary at t=60
    assert state.name == "primary" and at == pytest.approx(60)  # type: ignore[union-attr]


def test_weights_share_the_load_within_a_priority() -> None:
    pool = _pool(dep("a", tpm=10**9, weight=2), dep("b", tpm=10**9, weight=1))
    picks = [pool.choose(1, now=i * 0.001, deadline=300)[0].name for i in range(300)]  # type: ignore[union-attr]
    assert picks.count("a") == 200 and picks.count("b") == 100


def test_hint_within_the_cap_pauses_above_the_cap_cools_and_nothing_goes_to_a_cooling_deployment() -> None:
    pool = _pool(dep("primary"), dep("overflow", priority=2), retry_after_cap_s=60)
    primary = pool.states[0]
    assert pool.throttled(primary, RetryHint(2.0, "retry-after-ms"), now=0, attempt=1) == ("retry-after", 2.0)
    assert pool.choose(100, now=1, deadline=300)[0].name == "overflow"  # type: ignore[union-attr]
    assert pool.choose(100, now=2, deadline=300)[0].name == "primary"  # type: ignore[union-attr]
    assert pool.throttled(primary, RetryHint(86400, "body"), now=3, attempt=1) == ("cooldown", 86400)
    for t in (3, 100, 80_000):
        state, _, _ = pool.choose(100, now=t, deadline=t + 300)
        assert state is not None and state.name == "overflow"
    overflow = pool.states[1]
    pool.throttled(overflow, RetryHint(86400, "retry-after"), now=10, attempt=1)
    assert pool.choose(100, now=11, deadline=311) == (None, math.inf, "cooling")


def test_no_hint_is_exponential_backoff_with_jitter_capped() -> None:
    pool = _pool(dep("a"), backoff_base_s=1.0, backoff_max_s=8.0)
    delays = [pool.throttled(pool.states[0], None, now=0, attempt=n)[1] for n in range(1, 7)]
    steps = [1, 2, 4, 8, 8, 8]
    for delay, step in zip(delays, steps, strict=True):
        assert step / 2 <= delay <= step


def test_give_up_reasons() -> None:
    pool = _pool(dep("a", tpm=1000))
    assert pool.choose(1001, now=0, deadline=300)[2] == "too-large"
    pool.admit(pool.states[0], 1000, now=0)
    assert pool.choose(500, now=1, deadline=30)[2] == "deadline"  # frees at t=60, after the deadline


def test_configuration_is_checked() -> None:
    with pytest.raises(UsageError, match="endpoint"):
        Deployment("a", "ftp://x", 1000)
    with pytest.raises(UsageError, match="positive"):
        Deployment("a", "https://x", 0)
    with pytest.raises(UsageError, match="headroom"):
        ClientConfig(headroom=1.5)
    with pytest.raises(UsageError, match="once"):
        Pool([dep("a"), dep("a")], ClientConfig())


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=4000), min_size=1, max_size=120),
    gaps=st.lists(st.floats(min_value=0, max_value=5), min_size=1, max_size=120),
    tpms=st.tuples(st.integers(4000, 20_000), st.integers(4000, 20_000)),
)
def test_the_queue_never_exceeds_any_limit(sizes: list[int], gaps: list[float], tpms: tuple[int, int]) -> None:
    """Whatever arrives, what the pool admits never exceeds a deployment's TPM in any rolling minute, nor RPM/6 in
    any 10 seconds (checked independently of the pool's own windows)."""
    deployments = [Deployment(f"d{i}", f"https://d{i}.example", tpm, rpm=60, priority=i) for i, tpm in enumerate(tpms)]
    pool = Pool(deployments, ClientConfig(headroom=1.0, admission_lag_s=0.0), random.Random(0))  # noqa: S311 - deterministic test
    now = 0.0
    sent: dict[str, list[tuple[float, int]]] = {d.name: [] for d in deployments}
    for i, size in enumerate(sizes):
        now += gaps[i % len(gaps)]
        state, at, why = pool.choose(size, now, deadline=now + 10_000)
        if state is None:
            assert why == "too-large" and size > max(tpms)
            continue
        now = at  # the head of the queue waits until then
        again, at2, _ = pool.choose(size, now, deadline=now + 10_000)
        # at the time it was given, the request goes (float rounding in the windows may add a femtosecond)
        assert again is not None and at2 == pytest.approx(now, abs=1e-9)
        now = at2
        pool.admit(again, size, now)
        sent[again.name].append((now, size))
    for d in deployments:
        charges = sent[d.name]
        for t, _ in charges:
            in_minute = sum(c for t2, c in charges if t <= t2 < t + 60)
            assert in_minute <= d.tpm
            in_ten = sum(1 for t2, _ in charges if t <= t2 < t + 10)
            assert in_ten <= 10  # 60 RPM: 10 per 10 s
