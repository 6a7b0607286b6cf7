"""The gate under load: verdicts from the load program's NVML samples, the setting, the gate that folds the verdict
in, and a run whose load gate fails (the loop halts, the host is escalated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from remediation.config import RemediateSettings, load_section
from remediation.core.errors import UsageError
from remediation.remediate.act import HostStatus, gate
from remediation.remediate.loadgate import LoadMode, LoadResult, LoadVerdict, judge, load_mode, verdict_of
from remediation.transport.fanout import HostRun, Status
from tests.unit.test_remediate_act import Fleet, audit_of, run

WHEN = LoadMode.WHEN_AVAILABLE


def doc(*gpus: list[tuple[int | None, str | None]], tool: str | None = "torch", **extra: Any) -> dict[str, Any]:
    """A load program document: one list of (util, error) samples per GPU."""
    return {"schema": "gpufleet.gpuload/1", "tool": tool, "tool_note": "", "seconds": 5.0, "nvml_error": None,
            "xid_new": [], "gpus": [{"index": i, "load_error": None,
                                     "samples": [{"t": 0.25 * k, "util_gpu": u, "error": e}
                                                 for k, (u, e) in enumerate(g)]} for i, g in enumerate(gpus)],
            **extra}


def test_busy_gpus_that_answer_pass() -> None:
    v = judge("h", doc([(0, None), (97, None), (100, None)], [(88, None)]), WHEN)
    assert v.result is LoadResult.PASSED and v.passed is True and v.tool == "torch"
    assert "2 GPU(s) under torch load" in v.why and "peak utilisation 88-100 %" in v.why


def test_a_gpu_lost_under_load_fails_even_when_the_others_are_fine() -> None:
    v = judge("h", doc([(100, None)], [(100, None), (None, "GPU is lost")]), WHEN)
    assert v.result is LoadResult.FAILED and v.passed is False
    assert v.why == "load gate: GPU 1: NVML failed under load (GPU is lost; 1 of 2 samples)"


def test_a_load_that_never_reached_the_gpu_fails() -> None:
    v = judge("h", doc([(3, None), (12, None)]), WHEN)
    assert v.passed is False and "utilisation at most 12 % under load (at least 30 % expected)" in v.why
    assert judge("h", doc([(30, None)]), WHEN).passed is True  # the threshold itself passes
    assert judge("h", doc([]), WHEN).why == "load gate: GPU 0: no NVML sample during the load"


def test_xids_logged_during_the_load_the_load_breaking_and_nvml_failing_fail() -> None:
    xid = "NVRM: Xid (PCI:0001:00:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    v = judge("h", doc([(100, None)], xid_new=[xid]), WHEN)
    assert v.passed is False and v.why == f"load gate: 1 Xid line(s) logged during the load: {xid}"
    broken = doc([(100, None)])
    broken["gpus"][0]["load_error"] = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "GPU 0: the load broke (RuntimeError" in judge("h", broken, WHEN).why
    assert judge("h", doc(nvml_error="NVML: Driver Not Loaded"), WHEN).why == "load gate: NVML: Driver Not Loaded"
    assert judge("h", doc(), WHEN).why == "load gate: NVML counts no GPU"


def test_no_load_tool_is_a_skip_or_a_failure_per_the_setting() -> None:
    none = doc([(0, None)], tool=None, tool_note="no load tool on the host: torch not importable (ImportError)")
    skip = judge("h", none, WHEN)
    assert skip.result is LoadResult.SKIPPED and skip.passed is True
    assert skip.why == "load gate skipped: no load tool on the host: torch not importable (ImportError)"
    required = judge("h", none, LoadMode.REQUIRED)
    assert required.passed is False and required.why.endswith("(remediate.load_gate: required)")


def test_a_host_without_an_answer_gives_no_verdict() -> None:
    gone = verdict_of(HostRun("h", Status.UNREACHABLE, None, "", "", 1.0, "connection refused"), WHEN)
    assert gone.result is LoadResult.NO_ANSWER and gone.passed is None
    garbage = verdict_of(HostRun("h", Status.OK, 1, "Traceback", "SyntaxError: bad", 1.0), WHEN)
    assert garbage.passed is None and "SyntaxError: bad" in garbage.why
    import json

    fine = verdict_of(HostRun("h", Status.OK, 0, "noise\n" + json.dumps(doc([(99, None)])), "", 1.0), WHEN)
    assert fine.passed is True


def test_the_setting() -> None:
    assert load_mode(" When-Available ") is WHEN and RemediateSettings().load_gate == "when-available"
    with pytest.raises(UsageError, match="give required, when-available or off"):
        load_mode("sometimes")
    with pytest.raises(UsageError, match=r"remediate\.load_gate 'always'"):
        load_section(RemediateSettings, {"load_gate": "always"}, "remediate")
    with pytest.raises(UsageError, match="at most 30 seconds"):
        load_section(RemediateSettings, {"load_gate_seconds": 300}, "remediate")


def test_the_gate_folds_the_load_verdict_in() -> None:
    after = audit_of("gpu-1")
    ok, why = gate({}, after, ["GPU-KRN-002"], LoadVerdict("gpu-1", LoadResult.PASSED, "load gate passed: x"))
    assert ok is True and why.startswith("gate passed: GPU-KRN-002 gone") and why.endswith("; load gate passed: x")
    ok, why = gate({}, after, ["GPU-KRN-002"], LoadVerdict("gpu-1", LoadResult.FAILED, "load gate: GPU 0: lost"))
    assert ok is False and why == "gate: load gate: GPU 0: lost"
    ok, why = gate({}, after, ["GPU-KRN-002"], LoadVerdict("gpu-1", LoadResult.NO_ANSWER, "load gate: timed-out"))
    assert ok is None
    # the checks before the load still come first
    ok, why = gate({}, audit_of("gpu-1", "GPU-KRN-002"), ["GPU-KRN-002"],
                   LoadVerdict("gpu-1", LoadResult.PASSED, "load gate passed: x"))
    assert ok is False and "still present" in why


def test_a_failed_load_gate_halts_the_loop_and_escalates_the_host(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"], "gpu-2": ["GPU-KRN-002"]})
    fleet.load_fails["gpu-1"] = "GPU is lost"
    result = run(fleet, tmp_path)
    assert fleet.hardened == [["gpu-1"]] and fleet.loaded == [["gpu-1"]]
    one = result.outcomes["gpu-1"]
    assert one.status is HostStatus.FAILED and one.why.startswith("gate: load gate: GPU 0: NVML failed under load")
    assert result.outcomes["gpu-2"].status is HostStatus.NOT_STARTED and result.halted.startswith("gpu-1: gate")
    (esc,) = result.escalations
    assert (esc.host, esc.finding, esc.page) == ("gpu-1", "GPU-KRN-002", "sent") and "under load" in esc.why
    assert result.exit_code == 1


def test_the_load_gate_off_runs_no_load(tmp_path: Path) -> None:
    fleet = Fleet({"gpu-1": ["GPU-KRN-002"]})
    fleet.load_fails["gpu-1"] = "GPU is lost"
    result = run(fleet, tmp_path, load_gate="off")
    assert fleet.loaded == [] and result.outcomes["gpu-1"].status is HostStatus.FIXED
    assert "load gate: off (remediate.load_gate: off)" in result.notes
