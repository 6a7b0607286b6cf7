"""Incident Markdown: grouping, the five runbook sections in order, real evidence, fences that hold."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token
from test_report_common import DOWN_HOST, S1_HOST, THERMAL_HOST, build_result, with_evidence

from remediation.core.errors import TemplateError
from remediation.report import markdown
from remediation.report.incident import family_of, incidents, render_incident
from remediation.report.jinja import environment, render_template

SECTIONS = ["Symptoms", "Diagnosis", "Root cause", "Resolution", "Prevention"]
MD = MarkdownIt("commonmark")


def tokens(text: str) -> list[Token]:
    return MD.parse(text)


def headings(text: str) -> list[tuple[str, str]]:
    toks = tokens(text)
    return [(t.tag, toks[i + 1].content) for i, t in enumerate(toks) if t.type == "heading_open"]


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_grouping_per_host_and_family() -> None:
    result = build_result()
    found = incidents(result)
    assert [(i.host, i.primary.id) for i in found] == [
        (S1_HOST, "GPU-DRV-001"),
        (THERMAL_HOST, "GPU-THM-001"),
        ("gpu-4", "GPU-HW-001"),
        ("gpu-6", "GPU-DRV-002"),
        ("gpu-7", "GPU-KRN-001"),
        ("gpu-8", "GPU-MEM-001"),
        ("gpu-9", "GPU-HW-003"),
    ]
    s1 = found[0]
    assert [f.id for f in s1.findings] == ["GPU-DRV-001", "GPU-KRN-002", "GPU-KRN-003", "GPU-KRN-004", "GPU-KRN-006"]
    assert s1.severity.value == "critical" and s1.scenario.value == "S1"
    assert family_of("GPU-DKMS-001") == "driver" and family_of("GPU-CFG-001") == "thermal"
    assert incidents(result, "gpu-1") == []


def test_s1_incident_sections_in_runbook_order() -> None:
    text = render_incident(build_result(), S1_HOST)
    heads = headings(text)
    assert heads[0][0] == "h1"
    assert heads[0][1].startswith(f"Incident on {S1_HOST}: NVIDIA driver not loaded")
    assert [h for tag, h in heads if tag == "h2"] == SECTIONS
    assert len([tag for tag, _ in heads if tag == "h1"]) == 1


def test_s1_header() -> None:
    text = render_incident(build_result(), S1_HOST)
    header = text[: text.index("## Symptoms")]
    assert f"- **Host:** `{S1_HOST}` (fleet `gpu`)" in header
    assert "- **Scenario:** S1," in header
    assert "- **Severity:** critical" in header
    assert "- **Detected at:** `2026-12-02T08:00:00+00:00`" in header
    assert "GPU-DRV-001 (critical), GPU-KRN-002 (warning)" in header and "GPU-KRN-006 (info)" in header


def test_s1_symptoms_diagnosis_root_cause_use_the_host_facts() -> None:
    text = render_incident(build_result(), S1_HOST)
    symptoms = section(text, "Symptoms")
    assert "NVML: driver_not_loaded: Driver Not Loaded (code 9)" in symptoms
    assert "couldn't communicate with the NVIDIA driver" in symptoms
    diagnosis = section(text, "Diagnosis")
    assert "Booted kernel (`uname -r`): `6.5.0-45-generic`" in diagnosis
    assert "`6.5.0-45-generic` (`linux-image-6.5.0-45-generic` `6.5.0-45.45`), **booted**: **no NVIDIA module**" in (
        diagnosis
    )
    assert "`/lib/modules/6.5.0-44-generic/updates/dkms/nvidia.ko`" in diagnosis
    assert "Driver package (dpkg): `nvidia-driver-535` `535.183.01`" in diagnosis
    assert "was installed by `unattended-upgrade` at `2026-12-02 03:14:07`" in diagnosis
    assert "Commandline: /usr/bin/unattended-upgrade" in diagnosis  # the apt history stanza itself
    assert "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.5.0-45-generic" in diagnosis
    root = section(text, "Root cause")
    assert "`unattended-upgrade` installed `linux-image-6.5.0-45-generic` (`6.5.0-45.45`)" in root
    assert "exists for `6.5.0-44-generic`; the host booted `6.5.0-45-generic`" in root
    assert "unattended-upgrades installed a new kernel automatically" in root  # the catalog text


def test_s1_resolution_and_prevention_commands() -> None:
    text = render_incident(build_result(), S1_HOST)
    resolution = section(text, "Resolution")
    assert f"invoke driver-restore --fleet gpu --limit {S1_HOST}\ninvoke audit --fleet gpu --limit {S1_HOST}" in (
        resolution
    )
    assert f"`invoke driver-restore --limit {S1_HOST}`, then verify" in resolution  # runbook <host> filled in
    assert "NvidiaGpuDriverLinux" in resolution
    prevention = section(text, "Prevention")
    assert "invoke harden --fleet gpu\n" in prevention
    assert "- GPU-KRN-003 (warning): unattended-upgrades would upgrade kernel packages" in prevention
    assert "Package-Blacklist" in prevention


def test_other_incidents() -> None:
    text = render_incident(build_result())
    assert [h for tag, h in headings(text) if tag == "h2"] == SECTIONS * 7
    version = render_incident(build_result(), "gpu-6")
    root = section(version, "Root cause")
    assert "`unattended-upgrade` upgraded `nvidia-driver-535` (`535.183.01-0ubuntu0.22.04.1 -> 535.216.01" in root
    assert "Failed to initialize NVML: Driver/library version mismatch" in version
    predictive = section(render_incident(build_result(), "gpu-7"), "Root cause")
    assert "Kernel `6.5.0-46-generic` (`linux-image-6.5.0-46-generic`) was installed by `unattended-upgrade`" in (
        predictive
    )
    thermal = render_incident(build_result(), THERMAL_HOST)
    assert "86 °C" in section(thermal, "Symptoms")
    assert "invoke driver-restore" not in thermal
    hardware = render_incident(build_result(), "gpu-4")
    assert "az vm redeploy --resource-group <resource-group> --name gpu-4" in section(hardware, "Resolution")


def test_not_probed_and_no_incident() -> None:
    text = render_incident(build_result())
    assert ("h1", "Not probed") in headings(text)
    assert f"- `{DOWN_HOST}`: unreachable: NoValidConnectionsError" in text
    quiet = render_incident(build_result(), "gpu-1")
    assert headings(quiet) == [("h1", "No incidents: gpu / gpu-1")]
    down = render_incident(build_result(), DOWN_HOST)
    assert ("h1", "Not probed") in headings(down)
    with pytest.raises(KeyError):
        render_incident(build_result(), "nope")


def test_environment_is_strict_and_shared() -> None:
    assert environment() is environment()
    assert environment().autoescape is False
    with pytest.raises(TemplateError, match=r"incident\.md\.j2"):
        render_template("incident.md.j2")  # missing variables fail loudly (StrictUndefined)


def test_markdown_helpers() -> None:
    assert markdown.fence("a\n```\nb") == "````text\na\n```\nb\n````"
    assert markdown.code("x`y") == "``x`y``"
    assert markdown.code("`x") == "`` `x ``"
    assert markdown.inline("# a *b*\n[c](d)") == "\\# a \\*b\\* \\[c\\](d)"


def fences(text: str) -> list[Token]:
    """The fenced code blocks, as a CommonMark parser sees them."""
    return [t for t in tokens(text) if t.type == "fence"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=60))
@example("```\n# not a heading\n```")
@example("````` ~~~ `")
@example("\r\n## Root cause\r\n")
@example("line\u2028sep\x00nul\x0bvt")
@example("<!-- open comment\n    indented\n---")
@example("`")
def test_any_evidence_stays_inside_its_fence(text: str) -> None:
    plain = render_incident(build_result({S1_HOST: "s1_unattended_kernel"}), S1_HOST)
    result = build_result({S1_HOST: "s1_unattended_kernel"}, edit=with_evidence(text))
    out = render_incident(result, S1_HOST)
    assert headings(out) == headings(plain)  # no heading added, lost or changed
    # the evidence block of every finding holds the injected text verbatim (line breaks normalised)
    expected = "\n".join(markdown.lines_of(text))
    blocks = [t.content for t in fences(out)]
    assert len(blocks) == len(fences(plain))
    assert sum(expected in b for b in blocks) >= len(result.host(S1_HOST).findings)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
@example("- item")
@example("1. first")
@example("<b>&amp;</b> [x](y) *e* `c` \\")
def test_inline_text_is_one_plain_paragraph(text: str) -> None:
    toks = tokens(markdown.inline(text))
    if not toks:
        return
    assert [t.type for t in toks] == ["paragraph_open", "inline", "paragraph_close"]
    children = toks[1].children or []
    assert {c.type for c in children} <= {"text"}, children


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
@example("``")
@example("` a `")
def test_code_span_holds_any_text(text: str) -> None:
    toks = tokens(f"x {markdown.code(text)} y")
    children = toks[1].children or []
    spans = [c for c in children if c.type == "code_inline"]
    assert len(spans) == 1
    assert spans[0].content == (" ".join(markdown.lines_of(text)).strip() or " ")
