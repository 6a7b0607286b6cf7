"""The fleet table: rows, details, summary and exit line, as rendered without a TTY."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from test_report_common import DOWN_HOST, S1_HOST, THERMAL_HOST, UNREACHABLE_ERROR, build_result

from remediation.core.findings import Severity
from remediation.report.table import exit_code_meaning, render_table


def rendered(result=None, **kwargs) -> str:  # type: ignore[no-untyped-def]
    console = Console(record=True, width=160)
    render_table(result or build_result(), console, **kwargs)
    return console.export_text()


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("│").split("│")]


def row(text: str, host: str) -> list[str]:
    """The host's row, cells joined across the lines rich wraps them onto."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(f"│ {host} ")]
    assert len(starts) == 1, text
    out = cells(lines[starts[0]])
    for line in lines[starts[0] + 1 :]:
        more = cells(line) if line.startswith("│") else []
        if not more or more[0]:
            break
        out = [f"{a} {b}".strip() for a, b in zip(out, more, strict=True)]
    return out


HEADER = ["host", "probe", "health", "kernel (booted)", "held", "driver", "NVML", "GPUs ok", "max temp", "findings"]


def test_header_and_one_row_per_host() -> None:
    text = rendered()
    header = next(line for line in text.splitlines() if line.startswith("┃ host"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == HEADER
    result = build_result()
    for h in result.hosts:
        row(text, h.host)


def test_s1_row_says_driver_not_loaded() -> None:
    c = row(rendered(), S1_HOST)
    assert c[:5] == [S1_HOST, "probed", "critical", "6.5.0-45-generic", "no"]
    assert c[5] == "535.183.01 (pkg; not loaded)"  # package version, marked: NVML is down
    assert c[6] == "driver_not_loaded"
    assert c[7] == "0/4"
    assert c[8] == "-"
    assert c[9].startswith("1 critical, 3 warning, 1 info:")
    assert "GPU-DRV-001" in c[9]


def test_healthy_and_thermal_rows() -> None:
    text = rendered()
    healthy = row(text, "gpu-1")
    assert healthy == ["gpu-1", "probed", "healthy", "6.5.0-45-generic", "yes", "535.183.01", "ok", "4/4", "33 °C", "-"]
    thermal = row(text, THERMAL_HOST)
    assert thermal[1:3] == ["probed", "warning"]
    assert thermal[8] == "86 °C"
    assert thermal[9] == "2 warning: GPU-THM-001 GPU-THM-003"


def test_lost_gpu_and_unknown_expected_count() -> None:
    text = rendered()
    assert (row(text, "gpu-4"))[6:8] == ["gpu_lost", "3/4"]
    assert (row(text, "gpu-8"))[7] == "4/4"  # expected from the Azure VM size
    assert (row(text, "gpu-9"))[7] == "4"  # expected unknown: only the count


def test_unreachable_row_and_detail() -> None:
    text = rendered()
    c = row(text, DOWN_HOST)
    assert c == [DOWN_HOST, "unreachable", "unknown", "-", "-", "-", "-", "-/4", "-", "not probed"]
    assert f"{DOWN_HOST}: not probed (unreachable): {UNREACHABLE_ERROR}" in text


def test_details_have_evidence_and_remedy_under_the_host() -> None:
    text = rendered()
    details = text[text.index("details") :]
    s1 = details[details.index(f"\n{S1_HOST}\n") :]
    assert "GPU-DRV-001 [critical, S1] NVIDIA driver not loaded" in s1
    assert "      NVML: driver_not_loaded: Driver Not Loaded (code 9)" in s1
    assert f"    remedy: invoke driver-restore --limit {S1_HOST}" in s1
    # worst first within the host
    assert s1.index("GPU-DRV-001") < s1.index("GPU-KRN-002") < s1.index("GPU-KRN-006")


def test_summary_and_exit_line() -> None:
    text = rendered()
    summary = f"9 host(s): 8 probed, 1 not probed ({DOWN_HOST}), 1 healthy; findings: 7 critical, 12 warning, 4 info"
    assert summary in text
    assert text.rstrip().endswith("exit 1: 7 finding(s) at or above critical")


def test_exit_line_for_unreachable_only_and_clean() -> None:
    result = build_result({"gpu-1": "healthy", DOWN_HOST: None})
    assert exit_code_meaning(result).startswith("exit 3: no finding at or above critical, but 1 host(s)")
    assert exit_code_meaning(result, unreachable_exit=0).startswith("exit 0: no finding")
    clean = build_result({"gpu-1": "healthy"})
    assert rendered(clean).rstrip().endswith("exit 0: every host probed, no finding at or above critical")
    thermal = build_result({THERMAL_HOST: "thermal"})
    assert exit_code_meaning(thermal, Severity.WARNING) == "exit 1: 2 finding(s) at or above warning"


def test_markup_in_field_text_prints_literally() -> None:
    result = build_result({"gpu-1": "healthy", S1_HOST: "s1_unattended_kernel"})
    h = result.host(S1_HOST)
    f = dataclasses.replace(h.findings[0], evidence=("[bold]not markup[/] [link=x]y[/link]",))
    result = dataclasses.replace(result, hosts=(result.hosts[0], dataclasses.replace(h, findings=(f,))))
    assert "[bold]not markup[/] [link=x]y[/link]" in rendered(result)


def test_a_host_with_a_critical_finding_never_reads_ok() -> None:
    """The first column on-call reads says whether the host answered, the second what its answer means."""
    result = build_result()
    text = rendered(result)
    for h in result.hosts:
        c = row(text, h.host)
        assert "ok" not in c[1:3], c
        if h.probed and h.worst is Severity.CRITICAL:
            assert c[1:3] == ["probed", "critical"], c
        if not h.probed:
            assert c[2] == "unknown"


def test_probe_words_for_every_status() -> None:
    from remediation.report.table import health_word, probe_word
    from remediation.transport.fanout import Status

    result = build_result({"gpu-1": "healthy", DOWN_HOST: None})
    down = result.host(DOWN_HOST)
    words = {s: probe_word(dataclasses.replace(down, status=s)) for s in (Status.OK, Status.FAILED,
                                                                            Status.UNREACHABLE, Status.TIMED_OUT)}
    assert words == {
        Status.OK: "probed",
        Status.FAILED: "probe failed",
        Status.UNREACHABLE: "unreachable",
        Status.TIMED_OUT: "timed out",
    }
    assert health_word(down) == "unknown" and health_word(result.host("gpu-1")) == "healthy"
