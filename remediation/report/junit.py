"""The audit as JUnit XML, for CI systems (Jenkins, GitLab, Azure Pipelines) that chart test results.

Shape (the Ant/Jenkins JUnit format; ``tests/fixtures/schemas/junit.xsd`` is the schema the tests hold it to)::

    <testsuites name="gpu-audit" tests= failures= errors= skipped= time= timestamp=>
      <testsuite name="gpu-audit.HOST" package="gpu-audit" hostname="HOST" id= tests= failures= errors= skipped=
                 time= timestamp=>
        <properties> fleet, inventory, status, kernel, driver, nvml </properties>
        <testcase classname="HOST" name="probe" time=/>                 the SSH/probe run
        <testcase classname="HOST" name="GPU-DRV-001" time="0"/>        one per catalog ID, catalog order
        ...
      </testsuite>
    </testsuites>

Decisions:

- One test case per host x check, the checks being the catalog IDs (:data:`remediation.core.catalog.CATALOG`), so
  every host's suite has the same test names from run to run and a CI trend shows a check going red or green.
  A finding whose ID is not in the catalog gets its own test case after the catalog ones.
- Warning or critical finding(s) with that ID: ``<failure message=SUMMARY type=SEVERITY>`` with the evidence
  lines and the remedy as text. Several findings with one ID on one host (two hot GPUs) make one failure: the
  message joins the summaries, ``type`` is the worst severity, the text lists each finding.
- Info findings only: the test case passes and carries the finding in ``<system-out>``.
- The probe itself is the test case ``probe``: it passes when the host was probed and is an ``<error
  type=STATUS>`` (unreachable, timed_out, failed) with the reason when not. The catalog test cases of a host that
  was not probed are ``<skipped>`` ("not checked"), never passing: a host nobody looked at must not look healthy,
  and one error per host (not one per check) keeps the CI summary readable.
- Built as data with :mod:`xml.etree.ElementTree`; characters XML 1.0 cannot carry (control characters other
  than tab/newline/CR, U+FFFE/U+FFFF, lone surrogates) are written as ``\\xNN``/``\\uNNNN`` so any evidence text
  yields a well-formed document.
- Timestamps are ``YYYY-MM-DDTHH:MM:SS`` in UTC without an offset (Ant's format, which Jenkins reads).
"""

from __future__ import annotations

import datetime as _dt
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from remediation.core import catalog
from remediation.core.findings import Finding, Severity
from remediation.report import hostview

if TYPE_CHECKING:
    from remediation.host.audit import AuditResult, HostAudit

__all__ = ["PROBE_TEST", "SUITE_PREFIX", "check_ids", "render_junit", "xml_text"]

SUITE_PREFIX = "gpu-audit"
PROBE_TEST = "probe"

# Everything XML 1.0 does not allow (https://www.w3.org/TR/xml/#charsets).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _escape_char(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def xml_text(value: object) -> str:
    """``value`` as text XML 1.0 can carry: forbidden characters become ``\\xNN``/``\\uNNNN``."""
    return _NOT_XML.sub(_escape_char, str(value))


def check_ids() -> tuple[str, ...]:
    """The checks every host is tested against: the catalog IDs in catalog order."""
    return tuple(catalog.CATALOG)


def _stamp(when: _dt.datetime) -> str:
    if when.tzinfo is not None:
        when = when.astimezone(_dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    el = ET.SubElement(parent, tag, {k: xml_text(v) for k, v in attrs.items()})
    if text is not None:
        el.text = xml_text(text)
    return el


def _finding_text(findings: Iterable[Finding]) -> str:
    blocks = []
    for f in findings:
        lines = [f"{f.id} [{f.severity.value}, {f.scenario.value}] {f.summary}"]
        lines.extend(f"  {line}" for line in f.evidence)
        lines.append(f"remedy: {f.remedy}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _testcase(suite: ET.Element, host: str, name: str, findings: Sequence[Finding]) -> str:
    """Add one check's test case; returns its outcome: ``passed`` or ``failure``."""
    case = _sub(suite, "testcase", classname=host, name=name, time="0")
    failing = [f for f in findings if f.severity is not Severity.INFO]
    if failing:
        worst = Severity.worst(f.severity for f in failing)
        assert worst is not None
        summaries = [f.summary for f in failing]
        message = summaries[0] if len(summaries) == 1 else f"{len(summaries)} findings: " + "; ".join(summaries)
        _sub(case, "failure", _finding_text(hostview.severity_order(findings)), message=message, type=worst.value)
        return "failure"
    if findings:
        _sub(case, "system-out", _finding_text(findings))
    return "passed"


def _properties(suite: ET.Element, result: AuditResult, h: HostAudit) -> None:
    props = _sub(suite, "properties")
    values: list[tuple[str, str]] = [
        ("fleet", result.fleet),
        ("inventory", result.inventory),
        ("status", h.status.value),
    ]
    if h.facts is not None:
        version = hostview.driver_version(h.facts)
        values += [
            ("kernel", h.facts.system.kernel or ""),
            ("driver", f"{version.version} ({version.source})" if version else ""),
            ("nvml", "ok" if h.facts.nvml.ok else h.facts.nvml.error_class),
        ]
    for name, value in values:
        _sub(props, "property", name=name, value=value)


def _suite(root: ET.Element, result: AuditResult, h: HostAudit, index: int) -> dict[str, int]:
    suite = _sub(
        root,
        "testsuite",
        name=f"{SUITE_PREFIX}.{h.host}",
        package=SUITE_PREFIX,
        hostname=h.host,
        id=index,
        tests=0,
        failures=0,
        errors=0,
        skipped=0,
        time=f"{h.seconds:.3f}",
        timestamp=_stamp(result.started_at),
    )
    _properties(suite, result, h)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    ids = list(check_ids())
    ids += [fid for fid in dict.fromkeys(f.id for f in h.findings) if fid not in ids]

    probe = _sub(suite, "testcase", classname=h.host, name=PROBE_TEST, time=f"{h.seconds:.3f}")
    counts["tests"] += 1
    if not h.probed:
        reason = h.error or f"host {h.status.value}"
        _sub(probe, "error", reason, message=f"{h.status.value}: {reason}", type=h.status.value)
        counts["errors"] += 1
        for fid in ids:
            case = _sub(suite, "testcase", classname=h.host, name=fid, time="0")
            _sub(case, "skipped", message=f"not checked: host not probed ({h.status.value})")
            counts["tests"] += 1
            counts["skipped"] += 1
    else:
        for fid in ids:
            outcome = _testcase(suite, h.host, fid, [f for f in h.findings if f.id == fid])
            counts["tests"] += 1
            if outcome == "failure":
                counts["failures"] += 1
    for key, value in counts.items():
        suite.set(key, str(value))
    return counts


def render_junit(result: AuditResult) -> str:
    """``result`` as a JUnit XML document (see the module docstring), with an XML declaration."""
    root = ET.Element("testsuites", {"name": SUITE_PREFIX})
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for index, h in enumerate(result.hosts):
        for key, value in _suite(root, result, h, index).items():
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{result.seconds:.3f}")
    root.set("timestamp", _stamp(result.started_at))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
