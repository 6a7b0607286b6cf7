"""The closed loop's guards (remediation.remediate.guards) and its state file (remediation.remediate.state): the
in-flight cap, the breaker tripping and staying tripped until reset, the budget across two runs through the file,
the lock, and a corrupt file stopping with one line (never reset silently)."""

from __future__ import annotations

import datetime as _dt
import json
import multiprocessing
from pathlib import Path

import pytest

from remediation.core.exitcodes import ExitCode
from remediation.remediate.errors import StateError, StateLockedError
from remediation.remediate.flow import reset
from remediation.remediate.guards import Breaker, Budget, InFlightCap, Observation, Outcome, classify_failure
from remediation.remediate.state import Attempt, RemediateState, Seen, Trip, load, locked, save, state_path

T0 = _dt.datetime(2025, 6, 7, 12, 0, tzinfo=_dt.UTC)
H = _dt.timedelta(hours=1)


@pytest.mark.parametrize(
    ("hosts", "pct", "size", "cap"),
    [(2, 10.0, 100, 2), (20, 10.0, 100, 10), (5, 10.0, 12, 1), (5, 10.0, 3, 1), (3, 50.0, 4, 2), (1, 100.0, 1, 1)],
)
def test_in_flight_cap_is_the_smaller_of_hosts_and_share_at_least_one(hosts: int, pct: float, size: int,
                                                                       cap: int) -> None:
    assert InFlightCap(hosts, pct).limit(size) == cap


def test_in_flight_cap_shows_its_arithmetic() -> None:
    assert InFlightCap(2, 10).describe(12) == "cap 1 = min(2 hosts, 10% of 12 hosts = 1)"
    assert InFlightCap(2, 10).describe(3) == "cap 1 = min(2 hosts, 10% of 3 hosts = 0) raised to 1"


def test_breaker_trips_above_the_share_within_the_window_only() -> None:
    breaker = Breaker(threshold_pct=50, window_s=600, min_hosts=2)
    half = [Observation(T0, 4, ("a", "b"))]
    assert not breaker.evaluate(half, T0).tripped  # 50 % is not above 50 %
    three = [Observation(T0 - _dt.timedelta(seconds=300), 4, ("a", "b")), Observation(T0, 4, ("b", "c"))]
    verdict = breaker.evaluate(three, T0)
    assert verdict.tripped and verdict.unhealthy == ("a", "b", "c") and verdict.share_pct == 75
    assert "3 of 4 hosts unhealthy (75%) within 600 s" in verdict.why
    old = [Observation(T0 - _dt.timedelta(seconds=601), 4, ("a", "b")), Observation(T0, 4, ("c",))]
    assert not breaker.evaluate(old, T0).tripped  # the first run is outside the window
    assert not breaker.evaluate([Observation(T0, 1, ("a",))], T0).tripped  # one host is never a fleet-wide cause
    assert Breaker(50, 600, 1).evaluate([Observation(T0, 1, ("a",))], T0).tripped


def test_breaker_stays_tripped_until_reset_through_the_state_file(tmp_path: Path) -> None:
    path = state_path(tmp_path, "gpu")
    state = RemediateState("gpu").with_observation(Observation(T0, 4, ("a", "b", "c")))
    state = state.tripped(Trip(T0, "3 of 4 hosts unhealthy", ("a", "b", "c")))
    state = state.with_attempt(Attempt("a", "GPU-DRV-001", "boot-1", "driver-restore", T0, Outcome.PERMANENT, False))
    state = replace_seen(state, Seen("a", "GPU-DRV-001", "boot-1", T0, T0, "escalate"))
    save(path, state)
    # later runs see a healthy fleet: the breaker keeps its first trip
    later = load(path, "gpu").with_observation(Observation(T0 + 5 * H, 4, ()))
    later = later.tripped(Trip(T0 + 5 * H, "another", ()))
    save(path, later)
    again = load(path, "gpu")
    assert again.breaker == Trip(T0, "3 of 4 hosts unhealthy", ("a", "b", "c"))

    preview = reset(tmp_path, "gpu", apply=False)
    assert preview.existed and load(path, "gpu").breaker is not None  # a preview changes nothing
    done = reset(tmp_path, "gpu")
    after = load(path, "gpu")
    assert after.breaker is None and after.seen == () and after.observations == ()  # stale findings discarded
    assert after.attempts == again.attempts  # a reset does not refill the budget
    assert done.to_dict()["findings_discarded"] == 1 and done.to_dict()["attempts_kept"] == 1
    assert not reset(tmp_path, "other").existed


def replace_seen(state: RemediateState, seen: Seen) -> RemediateState:
    from dataclasses import replace

    return replace(state, seen=(*state.seen, seen))


def test_budget_counts_attempts_across_two_runs_through_the_state_file(tmp_path: Path) -> None:
    path = state_path(tmp_path, "gpu")
    budget = Budget(attempts=3, window_s=24 * 3600)
    # run 1: two attempts on gpu-1
    with locked(path):
        state = load(path, "gpu")
        for i in range(2):
            state = state.with_attempt(Attempt("gpu-1", "GPU-KRN-002", f"boot-{i}", "harden", T0 + i * H, ok=True))
        save(path, state)
    # run 2, a new process would read the same file: one attempt left, then none
    with locked(path):
        state = load(path, "gpu")
        times = [a.at for a in state.attempts_on("gpu-1")]
        assert budget.used(times, T0 + 2 * H) == 2 and budget.left(times, T0 + 2 * H) == 1
        state = state.with_attempt(Attempt("gpu-1", "GPU-KRN-002", "boot-2", "harden", T0 + 2 * H, ok=True))
        save(path, state)
    times = [a.at for a in load(path, "gpu").attempts_on("gpu-1")]
    assert budget.left(times, T0 + 3 * H) == 0 and budget.next_free(times, T0 + 3 * H) == T0 + 24 * H
    assert budget.describe(times, T0 + 3 * H) == "3 of 3 attempts used in 24 h, 0 left"
    assert budget.left(times, T0 + 24 * H) == 1  # the first attempt left the rolling window
    assert load(path, "gpu").attempts_on("gpu-2") == ()


def test_pruning_drops_what_no_guard_reads_but_keeps_attempts_without_a_verdict() -> None:
    state = RemediateState(
        "gpu",
        attempts=(Attempt("a", "X", None, "harden", T0 - 48 * H, ok=True),
                  Attempt("b", "X", None, "harden", T0 - 48 * H)),
        observations=(Observation(T0 - 48 * H, 2, ()), Observation(T0, 2, ())),
    )
    pruned = state.pruned(T0, 24 * 3600)
    assert [a.host for a in pruned.attempts] == ["b"] and len(pruned.observations) == 1


def test_outcome_classes_only_transient_is_retried() -> None:
    assert classify_failure(started=False, finished=False) is Outcome.TRANSIENT
    assert classify_failure(started=True, finished=True) is Outcome.PERMANENT
    assert classify_failure(started=True, finished=False) is Outcome.AMBIGUOUS
    assert [o for o in Outcome if o.retried] == [Outcome.TRANSIENT]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"{not json", "is not valid JSON (line 1, column 2)"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (b"[]", "is not a remediate state (the top level is not a JSON object)"),
        (b'{"schema": "gpufleet.remediate-state/9", "fleet": "gpu"}', "schema is 'gpufleet.remediate-state/9'"),
        (b'{"schema": "gpufleet.remediate-state/1", "fleet": "a100"}', "it is the state of fleet 'a100'"),
        (b'{"schema": "gpufleet.remediate-state/1", "fleet": "gpu", "attempts": [{"host": "a"}]}',
         "an entry has no 'finding'"),
        (b'{"schema": "gpufleet.remediate-state/1", "fleet": "gpu", "attempts": [{"host": "a", "finding": "X", '
         b'"boot_id": null, "action": "harden", "at": "2025-06-07T12:00:00"}]}', "at has no time zone"),
        (b'{"schema": "gpufleet.remediate-state/1", "fleet": "gpu", "attempts": [{"host": "a", "finding": "X", '
         b'"boot_id": null, "action": "harden", "at": "2025-06-07T12:00:00+00:00", "outcome": "fine"}]}',
         "'fine' is not a valid Outcome"),
        (b'{"schema": "gpufleet.remediate-state/1", "fleet": "gpu", "observations": "x"}', "observations is not"),
    ],
)
def test_a_corrupt_state_file_stops_with_one_line_and_is_left_as_it_is(tmp_path: Path, content: bytes,
                                                                      needle: str) -> None:
    path = state_path(tmp_path, "gpu")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(StateError) as err:
        load(path, "gpu")
    text = str(err.value)
    assert text.startswith(f"remediate state file {path} ") and needle in text and "\n" not in text
    assert f"mv {path} {path}.bad" in text and err.value.exit_code == ExitCode.BAD_INPUT
    assert path.read_bytes() == content  # never reset silently
    with pytest.raises(StateError):
        reset(tmp_path, "gpu")
    assert path.read_bytes() == content


def test_an_unreadable_state_file_names_the_file(tmp_path: Path) -> None:
    path = state_path(tmp_path, "gpu")
    path.mkdir(parents=True)  # a directory where the file should be: read fails with EISDIR
    with pytest.raises(StateError, match=rf"^remediate state file {path} cannot be read \(Is a directory\)"):
        load(path, "gpu")


def test_the_state_round_trips_and_a_missing_file_is_an_empty_state(tmp_path: Path) -> None:
    path = state_path(tmp_path, "gpu")
    assert load(path, "gpu") == RemediateState("gpu")
    state = RemediateState(
        "gpu",
        attempts=(Attempt("a", "GPU-DRV-001", "b1", "driver-restore", T0, Outcome.TRANSIENT, False),),
        seen=(Seen("a", "GPU-HW-001", None, T0, T0 + H, "escalate"),),
        observations=(Observation(T0, 3, ("a",)),),
        breaker=Trip(T0, "why", ("a",)),
    )
    save(path, state)
    assert load(path, "gpu") == state
    assert json.loads(path.read_text())["schema"] == "gpufleet.remediate-state/1"
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("fleet", ["../x", "a/b", "", ".hidden"])
def test_a_fleet_name_that_is_not_a_file_name_is_refused(tmp_path: Path, fleet: str) -> None:
    with pytest.raises(StateError, match="cannot name a state file"):
        state_path(tmp_path, fleet)


def _hold(path: str, ready: multiprocessing.synchronize.Event, done: multiprocessing.synchronize.Event) -> None:
    with locked(Path(path)):
        ready.set()
        done.wait(10)


def test_two_runs_do_not_interleave(tmp_path: Path) -> None:
    path = state_path(tmp_path, "gpu")
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(str(path), ready, done))
    other.start()
    try:
        assert ready.wait(10)
        with pytest.raises(StateLockedError, match=r"another remediate run holds .*gpu\.json\.lock") as err, \
                locked(path, wait_s=0.2):
            pass
        assert err.value.exit_code == ExitCode.LOCK_HELD
    finally:
        done.set()
        other.join(10)
    with locked(path, wait_s=1):  # free again
        pass
