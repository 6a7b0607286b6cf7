"""Every Molecule scenario, for real, on lab hosts: check before converge, idempotence, verify.

One test per ``molecule/<scenario>/molecule.yml``; Molecule gets its hosts from ``lab.molecule``. The scenarios run
side by side in two lanes (:func:`lanes`), each on its own lab.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_lab

pytestmark = pytest.mark.lab

SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


#: Scenarios run side by side, in this many lanes (each lane one scenario after another): a scenario mostly waits on
#: its hosts and on Ansible's round trips, so two share the machine's two cores well.
LANES = 2


def _start_slot(scenario: str) -> str:
    """The address prefix ``lab.molecule`` gives the scenario when no other scenario holds it: its fixed one, or the
    slot its name hashes to (two scenarios that hash to one slot run in the same lane, one after the other, so no
    scenario ever falls back to the next slot and meets another one there)."""
    import hashlib

    from lab.molecule import SCENARIO_PREFIXES, SLOTS

    if scenario in SCENARIO_PREFIXES:
        return SCENARIO_PREFIXES[scenario]
    free = [s for s in SLOTS if s not in SCENARIO_PREFIXES.values()]
    return free[int(hashlib.sha256(scenario.encode()).hexdigest(), 16) % len(free)]


def lanes(scenarios: list[str], count: int = LANES) -> list[list[str]]:
    """The scenarios in ``count`` lanes: those of one address slot together, the slots spread to even the lanes."""
    by_slot: dict[str, list[str]] = {}
    for scenario in scenarios:
        by_slot.setdefault(_start_slot(scenario), []).append(scenario)
    out: list[list[str]] = [[] for _ in range(count)]
    for group in sorted(by_slot.values(), key=len, reverse=True):
        min(out, key=len).extend(group)
    return [lane for lane in out if lane]


def molecule_test(scenario: str) -> subprocess.CompletedProcess[str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run(
        [str(Path(venv_bin) / "molecule"), "test", "-s", scenario],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Every scenario's ``molecule test``, started at once in :data:`LANES` lanes; each test waits for its own. Each
    scenario has its own lab (state in .lab/molecule/<scenario>, its own address prefix, see :func:`lanes`) and its
    own Molecule ephemeral directory."""
    require_lab()
    futures: dict[str, Future[subprocess.CompletedProcess[str]]] = {s: Future() for s in SCENARIOS}

    def lane(names: list[str]) -> None:
        for name in names:
            if futures[name].set_running_or_notify_cancel():
                try:
                    futures[name].set_result(molecule_test(name))
                except BaseException as exc:  # the test of that scenario reports it
                    futures[name].set_exception(exc)

    threads = [threading.Thread(target=lane, args=(names,), daemon=True) for names in lanes(SCENARIOS)]
    for thread in threads:
        thread.start()
    try:
        yield futures
    finally:
        for thread in threads:  # no scenario left running (or with hosts up) after the module
            thread.join()


def test_scenarios_of_one_address_slot_share_a_lane() -> None:
    placed = lanes(SCENARIOS)
    assert sorted(s for lane in placed for s in lane) == SCENARIOS
    for lane in placed:
        others = {_start_slot(s) for other in placed if other is not lane for s in other}
        assert not others & {_start_slot(s) for s in lane}, placed


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario: str, runs: dict[str, Future[subprocess.CompletedProcess[str]]]) -> None:
    proc = runs[scenario].result()
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    # The sequence really ran, in order: check before converge, then idempotence and verify, each successful.
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    done = re.findall(rf"^INFO\s+{re.escape(scenario)} ➜ (\w+): Executed: Successful", out, re.M)
    steps = [s for s in done if s in ("check", "converge", "idempotence", "verify")]
    assert steps == ["check", "converge", "idempotence", "verify"], done
