"""JUnit XML: valid against tests/fixtures/schemas/junit.xsd, failures exactly for warning/critical findings."""

from __future__ import annotations

import dataclasses
import functools
import xml.etree.ElementTree as ET

import pytest
import xmlschema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_report_common import DOWN_HOST, JUNIT_XSD, S1_HOST, UNREACHABLE_ERROR, build_result, with_evidence

from remediation.core import catalog
from remediation.core.findings import Severity
from remediation.report.junit import PROBE_TEST, render_junit, xml_text


@functools.cache
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(JUNIT_XSD))


def parsed(text: str) -> ET.Element:
    schema().validate(text)
    return ET.fromstring(text.encode())  # noqa: S314 - the document this test just rendered


def suite(root: ET.Element, host: str) -> ET.Element:
    found = root.find(f"testsuite[@name='gpu-audit.{host}']")
    assert found is not None
    return found


def test_validates_against_the_xsd() -> None:
    text = render_junit(build_result())
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites')
    assert schema().is_valid(text)


def test_the_xsd_rejects_what_it_should() -> None:
    good = '<testsuites><testsuite name="s" tests="1" failures="0" errors="0"><testcase name="t" classname="c"/>'
    assert schema().is_valid(good + "</testsuite></testsuites>")
    assert not schema().is_valid(good.replace(' tests="1"', "") + "</testsuite></testsuites>")  # tests required
    assert not schema().is_valid(good.replace('name="t" ', "") + "</testsuite></testsuites>")  # name required
    bad_child = good.replace("/>", "><bogus/></testcase>")
    assert not schema().is_valid(bad_child + "</testsuite></testsuites>")
    skipped_and_failure = good.replace("/>", '><skipped/><failure type="x"/></testcase>')
    assert not schema().is_valid(skipped_and_failure + "</testsuite></testsuites>")


def test_one_suite_per_host_and_one_case_per_catalog_id() -> None:
    result = build_result()
    root = parsed(render_junit(result))
    assert [s.get("name") for s in root.findall("testsuite")] == [f"gpu-audit.{h.host}" for h in result.hosts]
    names = [PROBE_TEST, *catalog.CATALOG]
    for s in root.findall("testsuite"):
        cases = s.findall("testcase")
        assert [c.get("name") for c in cases] == names
        assert {c.get("classname") for c in cases} == {s.get("hostname")}
        assert s.get("tests") == str(len(names))


def test_failures_exactly_for_warning_and_critical_findings() -> None:
    result = build_result()
    root = parsed(render_junit(result))
    for h in result.hosts:
        if not h.probed:
            continue
        s = suite(root, h.host)
        failing = {c.get("name") for c in s.findall("testcase") if c.find("failure") is not None}
        expected = {f.id for f in h.findings if f.severity is not Severity.INFO}
        assert failing == expected, h.host
        assert s.get("failures") == str(len(expected))
        assert s.get("errors") == "0"
    total = sum(len({f.id for f in h.findings if f.severity is not Severity.INFO}) for h in result.hosts)
    assert root.get("failures") == str(total)


def test_s1_failure_carries_severity_summary_and_evidence() -> None:
    root = parsed(render_junit(build_result()))
    case = suite(root, S1_HOST).find("testcase[@name='GPU-DRV-001']")
    assert case is not None
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("type") == "critical"
    assert failure.get("message", "").startswith("NVIDIA driver not loaded: booted kernel 6.5.0-45-generic")
    assert "NVML: driver_not_loaded: Driver Not Loaded (code 9)" in (failure.text or "")
    assert f"remedy: invoke driver-restore --limit {S1_HOST}" in (failure.text or "")
    krn2 = suite(root, S1_HOST).find("testcase[@name='GPU-KRN-002']/failure")
    assert krn2 is not None and krn2.get("type") == "warning"


def test_info_findings_pass_with_system_out() -> None:
    root = parsed(render_junit(build_result()))
    case = suite(root, S1_HOST).find("testcase[@name='GPU-KRN-006']")
    assert case is not None
    assert case.find("failure") is None and case.find("error") is None
    out = case.find("system-out")
    assert out is not None
    assert "unattended-upgrade installed linux-image-6.5.0-45-generic" in (out.text or "")


def test_unreachable_host_probe_error_and_skipped_checks() -> None:
    root = parsed(render_junit(build_result()))
    s = suite(root, DOWN_HOST)
    probe = s.find(f"testcase[@name='{PROBE_TEST}']/error")
    assert probe is not None
    assert probe.get("type") == "unreachable"
    assert probe.get("message") == f"unreachable: {UNREACHABLE_ERROR}"
    checks = [c for c in s.findall("testcase") if c.get("name") != PROBE_TEST]
    assert checks and all(c.find("skipped") is not None for c in checks)
    assert (s.get("errors"), s.get("skipped"), s.get("failures")) == ("1", str(len(checks)), "0")
    assert root.get("errors") == "1"


def test_two_findings_with_one_id_make_one_failure() -> None:
    result = build_result({"gpu-3": "thermal"})
    h = result.host("gpu-3")
    twice = (*h.findings, h.findings[0])
    result = dataclasses.replace(result, hosts=(dataclasses.replace(h, findings=twice),))
    root = parsed(render_junit(result))
    failures = root.findall(".//testcase[@name='GPU-THM-001']/failure")
    assert len(failures) == 1
    assert failures[0].get("message", "").startswith("2 findings: ")


@pytest.mark.parametrize("char", ["\x00", "\x08", "\x0b", "\x1b", "\ufffe", "\ud800"])
def test_characters_xml_cannot_carry_are_escaped(char: str) -> None:
    assert char not in xml_text(f"a{char}b")
    assert xml_text("tab\tnl\ncr\r<&>\"'") == "tab\tnl\ncr\r<&>\"'"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=80))
@example("]]></failure><error type='x'>&amp;<!--")
@example("\x00\x1b[31m\ufffe\r\n\"'<>&")
def test_any_evidence_keeps_the_document_valid(text: str) -> None:
    result = build_result({S1_HOST: "s1_unattended_kernel", DOWN_HOST: None}, edit=with_evidence(text))
    root = parsed(render_junit(result))
    failure = suite(root, S1_HOST).find("testcase[@name='GPU-DRV-001']/failure")
    assert failure is not None
    body = failure.text or ""
    expected = xml_text(text).replace("\r\n", "\n").replace("\r", "\n")  # XML normalises line ends in text
    assert expected in body
