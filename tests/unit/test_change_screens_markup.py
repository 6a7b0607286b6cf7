"""Host text on the change screens (restore, kernel update, harden) prints as itself, never as Rich markup.

Cordon markers, host stderr and gate details are whatever the host says; a ``[/]`` or ``[bold]`` in them must
neither raise ``MarkupError`` (after hosts were changed, before the incident report) nor style the screen.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from test_report_common import build_result

from remediation.kernelupdate.flow import KernelOutcome, KernelStatus, KernelUpdateOptions, KernelUpdateResult
from remediation.kernelupdate.rules import KernelPlan
from remediation.report.kernel_update_view import print_kernel_plan, print_kernel_result
from remediation.report.restore_view import print_restore_plan, print_restore_result
from remediation.restore.flow import HostOutcome, HostStatus, RestoreOptions, RestoreResult
from remediation.restore.rules import Action, Decision
from remediation.rollout.engine import ChangeKind, StopReason, Verdict
from remediation.rollout.lock import HostLeases

HOSTILE = (
    "maintenance by ops [/] see ticket [bold]x",
    "E: dpkg [/red] was interrupted [link=file:///etc]x[/link]",
    "[/]",
    "\\[not-escaped] [red]",
)


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=400, highlight=False, color_system=None), buf


def _restore_result(text: str) -> RestoreResult:
    before = build_result({"gpu-1": "healthy", "gpu-2": "s1_unattended_kernel"})
    left = Decision("gpu-1", Action.SKIP, f"left alone: cordoned on the host ({text})", blocked=text)
    failed = Decision("gpu-2", Action.REBUILD, text, steps=(text,))
    outcomes = (
        HostOutcome("gpu-1", left, HostStatus.LEFT_ALONE, detail=text),
        HostOutcome("gpu-2", failed, HostStatus.FAILED, where=f"apply: {text}", detail=text, changed=(text,),
                    undone=(text,), undo_error=f"undo failed: {text}"),
    )
    leases = HostLeases("run-1", held=["gpu-2"], unreachable=["gpu-1"], took_over={"gpu-2": {"run_id": text}})
    return RestoreResult("gpu", "run-1", ChangeKind.DRIVER_RESTORE, RestoreOptions(), before, (left, failed), outcomes,
                         {"gpu-1": Verdict.LEFT_ALONE, "gpu-2": Verdict.FAILED}, before, StopReason.MAX_FAILURES,
                         f"stopped after 1 failed host(s): gpu-2 at apply: {text}", leases=leases)


def _kernel_result(text: str) -> KernelUpdateResult:
    before = build_result({"gpu-1": "healthy", "gpu-2": "s1_unattended_kernel"})
    left = KernelPlan("gpu-1", "skip", text, blocked=text)
    moving = KernelPlan("gpu-2", "update", text, target_kernel="6.8.0-1", steps=(text,), module_source="dkms",
                        module_source_reason=text)
    outcomes = (
        KernelOutcome("gpu-1", left, KernelStatus.LEFT_ALONE, detail=text),
        KernelOutcome("gpu-2", moving, KernelStatus.FAILED, where=f"gate: {text}", detail=text, undone=(text,),
                      undo_error=text),
    )
    return KernelUpdateResult("gpu", "run-1", ChangeKind.KERNEL_UPDATE, KernelUpdateOptions(), before, (left, moving),
                              outcomes, {"gpu-1": Verdict.LEFT_ALONE, "gpu-2": Verdict.FAILED}, before,
                              StopReason.MAX_FAILURES, f"stopped at gpu-2: {text}")


@pytest.mark.parametrize("text", HOSTILE)
def test_restore_screens_print_host_text_literally(text: str) -> None:
    console, buf = _console()
    result = _restore_result(text)
    print_restore_plan(console, result.plan)
    print_restore_result(console, result)
    out = buf.getvalue()
    assert text in out
    assert f"stopped after 1 failed host(s): gpu-2 at apply: {text}" in out


@pytest.mark.parametrize("text", HOSTILE)
def test_kernel_update_screens_print_host_text_literally(text: str) -> None:
    console, buf = _console()
    result = _kernel_result(text)
    print_kernel_plan(console, result.plan)
    print_kernel_result(console, result)
    out = buf.getvalue()
    assert text in out
    assert f"stopped at gpu-2: {text}" in out


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="[]/\\ab =:", min_size=1, max_size=30))
def test_any_bracket_text_never_breaks_the_screens(text: str) -> None:
    console, buf = _console()
    print_restore_plan(console, _restore_result(text).plan)
    print_restore_result(console, _restore_result(text))
    print_kernel_plan(console, _kernel_result(text).plan)
    print_kernel_result(console, _kernel_result(text))
    assert text.strip() in buf.getvalue()


@pytest.mark.parametrize("text", HOSTILE)
@pytest.mark.parametrize("outcome", ["check", "succeeded"])
def test_azure_quota_request_text_prints_literally(text: str, outcome: str) -> None:
    from remediation.azure.quota import QuotaRequestResult
    from remediation.azure.report import print_request

    console, buf = _console()
    print_request(console, QuotaRequestResult("sub", "eastus", "standardNDSv2Family", 8, 24, 96, outcome,
                                              message=text, limit_after=96))
    assert text in buf.getvalue()
