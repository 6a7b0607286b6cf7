"""Issue 20 item 5: one host's malformed probe document is that host's "unusable probe output", never the run's crash.

Each corruption goes through :func:`remediation.host.audit.audit_runs` (what ``run_audit`` does with the fan-out's
results) beside healthy hosts, whose audit must not change; then every report format renders the run.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from remediation.core.errors import ProbeError
from remediation.core.facts import facts_from_dict
from remediation.host.audit import AuditOptions, AuditResult, audit_runs, parse_run
from remediation.report.formats import FORMATS, render
from remediation.transport.fanout import FanoutResult, HostRun, Status
from remediation.transport.inventory import Host

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
STARTED = _dt.datetime(2026, 12, 4, 8, 0, 0, tzinfo=_dt.UTC)
GOOD = {"gpu-a": "healthy", "gpu-b": "thermal"}
BAD = "gpu-bad"


def doc(name: str = "xid79_lost") -> dict[str, Any]:
    return json.loads((FACTS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def _gpu(d: dict[str, Any]) -> dict[str, Any]:
    gpus = d["nvml"]["gpus"]
    for g in gpus:
        if g.get("ok"):
            return g  # type: ignore[no-any-return]
    return gpus[0]  # type: ignore[no-any-return]


def _set(path: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        path(d)[key] = value

    return edit


def _healthy_gpu(d: dict[str, Any]) -> dict[str, Any]:
    return _gpu(d)


# Each: a corruption of a real probe document (applied to the healthy fixture, whose GPUs are all ok).
CORRUPTIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "field_errors: 1": _set(_healthy_gpu, "field_errors", 1),
    "field_errors: a string": _set(_healthy_gpu, "field_errors", "nvmlDeviceGetPowerUsage"),
    "field_errors: a list of lists": _set(_healthy_gpu, "field_errors", [["a", "b"], ["c"]]),
    "nvml: a string": _set(lambda d: d, "nvml", "NVML down"),
    "gpus: an object": _set(lambda d: d["nvml"], "gpus", {"0": {}}),
    "a gpu: a list": lambda d: d["nvml"]["gpus"].__setitem__(0, [1, 2]),
    "memory: a number": _set(_healthy_gpu, "memory", 80),
    "memory.total: a string": lambda d: _healthy_gpu(d)["memory"].__setitem__("total", "80 GiB"),
    "temperature: NaN": _set(_healthy_gpu, "temperature_c", math.nan),
    "power: infinity": _set(_healthy_gpu, "power_w", math.inf),
    "memory.used: 10**400": lambda d: _healthy_gpu(d)["memory"].__setitem__("used", 10**400),
    "memory.total: 1e300": lambda d: _healthy_gpu(d)["memory"].__setitem__("total", 1e300),
    "index: null": _set(_healthy_gpu, "index", None),
    "processes: nested lists": _set(_healthy_gpu, "processes", [[[1]]]),
    "clocks: a list": _set(_healthy_gpu, "clocks_mhz", [1, 2]),
    "packages.kernels: a string": _set(lambda d: d["packages"], "kernels", "linux-image"),
    "packages.nvidia: a list": _set(lambda d: d["packages"], "nvidia", ["nvidia-driver-535"]),
    "kernel_log.lines: numbers": _set(lambda d: d["kernel_log"], "lines", [1, 2, 3]),
    "dkms_status: a number": _set(lambda d: d, "dkms_status", 7),
    "dkms_status.output: a list": _set(lambda d: d, "dkms_status", {"output": ["nvidia"]}),
    "errors: an object": _set(lambda d: d, "errors", {"section": "nvml"}),
    "system.boot_time: a number": _set(lambda d: d, "system", {"kernel": None, "os_release": None, "boot_time": 5}),
}

# Corruptions that degrade to a value (an unavailable section, no timestamp) instead of an error.
DEGRADED: dict[str, Callable[[dict[str, Any]], None]] = {
    "errors: a huge int": _set(lambda d: d, "errors", [10**400]),
    "collected_at: year 99999": _set(lambda d: d, "collected_at", "99999-01-01T00:00:00"),
    "everything null": lambda d: d.update({k: None for k in list(d) if k != "schema"}),
}

# Raw stdout no json.loads gives a document for.
RAW: dict[str, str] = {
    "not JSON": "Traceback (most recent call last):\n  File ...",
    "truncated JSON": json.dumps(doc("healthy"))[:500],
    "a JSON list": "[1, 2, 3]",
    "JSON null": "null",
    "nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "an int of 5000 digits": '{"schema": "gpufleet.facts/1", "duration_ms": ' + "9" * 5000 + "}",
    "NaN literal": '{"schema": "gpufleet.facts/1", "duration_ms": NaN}',
    "empty": "",
}


def _run(host: str, stdout: str) -> HostRun:
    return HostRun(host=host, status=Status.OK, exit_code=0, stdout=stdout, stderr="", seconds=0.5)


def _audit(bad_stdout: str) -> AuditResult:
    hosts = [Host(name, "127.0.0.1") for name in (*GOOD, BAD)]
    runs = {name: _run(name, json.dumps(doc(fixture))) for name, fixture in GOOD.items()}
    runs[BAD] = _run(BAD, bad_stdout)
    audits = audit_runs(hosts, FanoutResult(runs, 1.0), AuditOptions())
    return AuditResult("gpu", "inventory.yml", STARTED, 1.0, audits)


def _corrupted(name: str) -> str:
    d = doc("healthy")
    {**CORRUPTIONS, **DEGRADED}[name](d)
    return json.dumps(d)  # json.dumps writes NaN/Infinity as the probe's json would


def _stdouts() -> list[Any]:
    return [pytest.param(_corrupted(n), id=n) for n in CORRUPTIONS] + [pytest.param(s, id=n) for n, s in RAW.items()]


ALONE = _audit(json.dumps(doc("healthy")))


@pytest.mark.parametrize("stdout", _stdouts())
def test_a_corrupt_document_is_that_hosts_error_and_every_format_renders(stdout: str) -> None:
    result = _audit(stdout)
    bad = result.host(BAD)
    assert bad.status is Status.FAILED and bad.facts is None and bad.findings == ()
    assert bad.error is not None and bad.error.startswith("probe output unusable: ")
    assert len(bad.error) < 400 and "\n" not in bad.error
    for name in GOOD:  # the other hosts are audited exactly as without the bad one
        assert result.host(name).status is Status.OK
        assert result.host(name).facts == ALONE.host(name).facts
        assert result.host(name).findings == ALONE.host(name).findings
    assert result.not_probed == [BAD] and result.exit_code() in (1, 3)
    for fmt in FORMATS:
        out = render(result, fmt)
        assert fmt == "table" or (out and BAD in out)


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_the_loader_names_the_field_with_a_probe_error(name: str) -> None:
    """facts.py itself degrades a wrong type to a ProbeError naming the host (not a TypeError from deep inside)."""
    d = doc("healthy")
    CORRUPTIONS[name](d)
    d = json.loads(json.dumps(d))
    with pytest.raises(ProbeError, match=rf"^host {BAD}: ") as info:
        facts_from_dict(d, host=BAD)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("name", list(DEGRADED))
def test_degraded_documents_load_and_render(name: str) -> None:
    result = _audit(_corrupted(name))
    assert result.host(BAD).error is None and result.host(BAD).facts is not None
    for fmt in FORMATS:
        render(result, fmt)


def test_unprintable_values_are_shortened_in_the_reason() -> None:
    d = doc("healthy")
    _healthy_gpu(d)["name"] = ["x" * 100_000]
    facts, error = parse_run(_run(BAD, json.dumps(d)))
    assert facts is None and error is not None and len(error) < 400 and "name" in error


def test_a_reading_of_the_healthy_fixture_is_untouched() -> None:
    d = copy.deepcopy(doc("healthy"))
    facts, error = parse_run(_run("gpu-a", json.dumps(d)))
    assert error is None and facts is not None and facts.host == "gpu-a"
