"""The dispatcher: every format renders through ``render``; table prints, the others return text."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from test_report_common import S1_HOST, build_result

from remediation.core.errors import RemediationError
from remediation.report.formats import FORMATS, render
from remediation.report.incident import render_incident
from remediation.report.json_report import render_json
from remediation.report.junit import render_junit
from remediation.report.prometheus import render_prometheus


def test_formats() -> None:
    assert FORMATS == ("table", "json", "junit", "prom", "md")


def test_table_prints_on_the_console_and_returns_none() -> None:
    console = Console(record=True, width=160)
    assert render(build_result(), "table", console=console) is None
    assert "GPU fleet audit: gpu" in console.export_text()


def test_table_without_console_returns_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    text = render(build_result(), "table")
    assert text is not None and "GPU fleet audit: gpu" in text and "\x1b[" not in text
    assert capsys.readouterr().out == ""  # nothing printed


@pytest.mark.parametrize(
    ("fmt", "function"),
    [("json", render_json), ("junit", render_junit), ("prom", render_prometheus), ("md", render_incident)],
)
def test_text_formats_are_the_module_functions(fmt: str, function: object) -> None:
    result = build_result()
    assert render(result, fmt) == function(result)  # type: ignore[operator]


def test_md_for_one_host_and_json_is_json() -> None:
    result = build_result()
    assert render(result, "md", host=S1_HOST) == render_incident(result, S1_HOST)
    assert json.loads(render(result, "json") or "")["fleet"] == "gpu"


def test_unknown_format() -> None:
    with pytest.raises(RemediationError, match="unknown report format 'yaml'"):
        render(build_result(), "yaml")
