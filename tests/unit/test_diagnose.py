"""diagnose(): the JSON contract, kind detection on every corpus block, the fact → finding mapping."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.core.catalog import CATALOG
from remediation.core.errors import ParseError
from remediation.core.findings import make_finding
from remediation.core.parsers import detect_kind
from remediation.host.diagnose import DiagnoseResult, diagnose, remedy_command, render_text
from tests.corpus import blocks as _load

BLOCKS: dict[str, list[str]] = _load()


def _expected_kind(section: str, index: int) -> str:
    if section.startswith("2."):
        return "nvml"
    if section.startswith("3."):
        return "kernel-log"
    if section.startswith("4A."):
        return "apt-history"
    return "dkms"


CASES = [
    (s, i) for s, blocks in BLOCKS.items() if s.split(".")[0] in ("2", "3", "4A", "4C") for i in range(len(blocks))
]


@pytest.mark.parametrize(("section", "index"), CASES)
def test_kind_detection_on_each_corpus_block(section: str, index: int) -> None:
    assert detect_kind(BLOCKS[section][index]) == _expected_kind(section, index)


@pytest.mark.parametrize("section", ["5.4", "5.6"])
def test_other_sections_are_not_taken_for_these_kinds(section: str) -> None:
    # OOM and 429 text: no host kind claims it (the areas' own kinds do)
    assert detect_kind(BLOCKS[section][0]) not in {"nvml", "kernel-log", "apt-history", "dkms"}


def _assert_contract(doc: dict[str, object]) -> None:
    # a paste of several kinds (e.g. the corpus' 2.4 transcript: nvidia-smi, dkms, uname) adds parts and unread
    assert set(doc) in ({"kind", "facts", "findings"}, {"kind", "facts", "findings", "parts", "unread"})
    for part in doc.get("parts", []):
        assert isinstance(part, dict) and set(part) == {"kind", "lines", "findings"}
    for unread in doc.get("unread", []):
        assert isinstance(unread, dict) and unread["reason"] == "not recognised"
    assert isinstance(doc["kind"], str)
    assert isinstance(doc["facts"], dict)
    assert isinstance(doc["findings"], list)
    for finding in doc["findings"]:
        assert isinstance(finding, dict)
        assert set(finding) == {"id", "scenario", "severity", "summary", "evidence", "remedy"}
        assert finding["id"] in CATALOG
        assert finding["scenario"] in {"S1", "S2", "S3", "S4", "S5"}
        assert finding["severity"] in {"info", "warning", "critical"}
        assert isinstance(finding["summary"], str) and finding["summary"]
        assert isinstance(finding["evidence"], list) and all(isinstance(e, str) for e in finding["evidence"])
        assert finding["evidence"], "every finding rests on evidence lines"
        assert isinstance(finding["remedy"], str) and finding["remedy"]
    json.dumps(doc)  # serialisable as is


@pytest.mark.parametrize(("section", "index"), CASES)
def test_json_contract_on_each_corpus_block(section: str, index: int) -> None:
    doc = diagnose(BLOCKS[section][index]).to_dict()
    _assert_contract(doc)
    facts = doc["facts"]
    assert isinstance(facts, dict)
    if doc["kind"] == "nvml":
        assert facts["error_class"] in {
            "driver_not_loaded",
            "version_mismatch",
            "no_devices",
            "library_not_found",
            "gpu_lost",
            "handle_unknown_error",
            "other",  # NVML failed with a code no class covers (the probe's "other")
            "none",
        }
    if doc["kind"] == "kernel-log":
        for event in facts["xid_events"]:
            assert isinstance(event["code"], int)
            assert isinstance(event["pci"], str)
            assert event["pid"] is None or isinstance(event["pid"], int)
            assert isinstance(event["meaning"], str) and event["meaning"]


def _ids(result: DiagnoseResult) -> list[str]:
    return [f.id for f in result.findings]


def test_nvml_mapping() -> None:
    assert _ids(diagnose(BLOCKS["2.2"][0])) == ["GPU-DRV-001"]
    proved = diagnose(BLOCKS["2.4"][0])
    assert _ids(proved) == ["GPU-DRV-001"]
    assert "3.13.0-116-generic" in proved.findings[0].summary
    assert "3.13.0-88-generic" in proved.findings[0].summary
    assert proved.facts["module_missing"] is True
    assert _ids(diagnose(BLOCKS["2.8"][0])) == ["GPU-DRV-002"]
    assert "550.144" in diagnose(BLOCKS["2.8"][0]).findings[0].summary
    assert _ids(diagnose(BLOCKS["2.12"][0])) == ["GPU-DRV-002"]
    assert _ids(diagnose(BLOCKS["2.16"][0])) == ["GPU-HW-006"]
    assert "0000:09:00.0" in diagnose(BLOCKS["2.16"][0]).findings[0].summary
    mixed = diagnose(BLOCKS["2.14"][0])
    assert mixed.kind == "nvml" and mixed.facts["error_class"] == "no_devices"
    assert _ids(mixed) == ["GPU-HW-007"]  # the kernel lines merge into the same finding
    assert "0x22:0x56:884" in mixed.findings[0].summary
    assert any("RmInitAdapter" in line for line in mixed.findings[0].evidence)
    assert mixed.facts["kernel_log"]["rm_init_failures"][0]["code"] == "0x22:0x56:884"


def test_kernel_mapping() -> None:
    r = diagnose(BLOCKS["3.1"][0])
    assert r.kind == "kernel-log"
    assert sorted(_ids(r)) == ["GPU-HW-005", "GPU-HW-005"]
    assert [(e["code"], e["pid"]) for e in r.facts["xid_events"]] == [(13, None)] * 3 + [(109, 1797828)]
    by_code = {f.summary.split()[1]: f for f in r.findings}
    # one finding per (Xid code, GPU), as in the audit: a count line, then the three event lines
    assert [line for line in by_code["13"].evidence if "NVRM" in line] == [e["text"] for e in r.facts["xid_events"][:3]]
    r = diagnose(BLOCKS["3.9"][0])
    assert r.findings[0].severity.value == "critical"  # Xid 48 (DBE)
    r = diagnose(BLOCKS["3.3"][0])
    assert r.findings[0].severity.value == "warning"  # Xid 13 (application)
    assert [f.id for f in diagnose(BLOCKS["3.11"][0]).findings] == ["GPU-HW-001"]  # probe failure folded in
    assert [f.id for f in diagnose(BLOCKS["3.11"][1]).findings] == ["GPU-HW-001"]  # Xid 79 not also HW-005
    assert diagnose(BLOCKS["3.11"][0]).facts["fallen_off_bus"][0]["xid_equivalent"] == 79
    r = diagnose(BLOCKS["3.19"][0])
    assert _ids(r) == ["GPU-DRV-007"]
    assert "595.84" in r.findings[0].summary and "595.80" in r.findings[0].summary
    assert "kwin_wayland" in r.findings[0].summary
    assert set(_ids(diagnose(BLOCKS["3.25"][0]))) == {"GPU-DRV-007", "GPU-HW-007"}
    assert "gsp_ga10x.bin" in next(f for f in diagnose(BLOCKS["3.25"][0]).findings if f.id == "GPU-HW-007").summary
    assert _ids(diagnose(BLOCKS["3.27"][0])) == ["GPU-HW-008"]
    assert _ids(diagnose(BLOCKS["3.17"][0])) == []


def test_apt_mapping() -> None:
    r = diagnose(BLOCKS["4A.1"][0])
    # KRN-004: it upgrades NVIDIA packages; KRN-006 (info): what it installed, NVIDIA packages included, as the
    # audit has always said (one rule per ID: the apt-history diagnosis used to leave NVIDIA installs out of KRN-006)
    assert _ids(r) == ["GPU-KRN-004", "GPU-KRN-006"]
    summary = r.findings[0].summary
    assert (
        "libnvidia-common-460" in summary and "460.80-0ubuntu0.20.04.2" in summary and "2021-06-04 06:41:09" in summary
    )
    packagekit = diagnose(BLOCKS["4A.4"][0])
    assert "GPU-KRN-006" not in _ids(packagekit)  # a person asked packagekit for it
    assert {k["actor"] for k in packagekit.facts["kernel_installs"]} == {"packagekit"}
    assert _ids(diagnose(BLOCKS["4A.3"][0])) == []
    assert _ids(diagnose(BLOCKS["4A.5"][0])) == []


def test_unattended_kernel_install_and_dry_run() -> None:
    stanza = (
        "Start-Date: 2024-07-13  06:25:01\n"
        "Commandline: /usr/bin/unattended-upgrade{flag}\n"
        "Install: linux-image-6.5.0-44-generic:amd64 (6.5.0-44.44, automatic), "
        "linux-modules-6.5.0-44-generic:amd64 (6.5.0-44.44, automatic)\n"
        "Upgrade: linux-image-generic:amd64 (6.5.0.41.41, 6.5.0.44.44)\n"
        "End-Date: 2024-07-13  06:25:40\n"
    )
    real = diagnose(stanza.format(flag=""))
    assert real.kind == "apt-history"
    # KRN-003: it upgrades kernel packages (the same rule as KRN-004 for NVIDIA ones); KRN-006: what it installed
    assert _ids(real) == ["GPU-KRN-003", "GPU-KRN-006"]
    summary = real.findings[1].summary
    assert "linux-image-6.5.0-44-generic" in summary and "2024-07-13 06:25:01" in summary
    assert "unattended-upgrade" in summary
    assert any(line.startswith("Commandline:") for line in real.findings[1].evidence)
    dry = diagnose(stanza.format(flag=" --dry-run"))
    assert _ids(dry) == []
    assert dry.facts["transactions"][0]["dry_run"] is True


def test_dkms_mapping() -> None:
    r = diagnose(BLOCKS["4C.3"][0])
    assert _ids(r) == ["GPU-DKMS-001"] * 4
    assert "4.7.2_1" in r.findings[0].summary and "367.35" in r.findings[0].summary
    r = diagnose(BLOCKS["4C.4"][0])
    assert _ids(r) == ["GPU-DKMS-001"]
    assert "6.17.9-76061709-generic" in r.findings[0].summary and "580.119.02" in r.findings[0].summary
    assert _ids(diagnose(BLOCKS["4C.6"][0])) == []
    assert _ids(diagnose(BLOCKS["4C.1"][0])) == []


@pytest.mark.parametrize("text", ["", "   \n\t\n"])
def test_empty_input_is_a_parse_error_naming_the_input(text: str) -> None:
    with pytest.raises(ParseError) as err:
        diagnose(text, source="dmesg.txt")
    message = str(err.value)
    assert "dmesg.txt" in message and "\n" not in message


def test_unknown_text_is_a_result_not_an_error() -> None:
    result = diagnose("hello world\nnothing here about GPUs")
    assert result.to_dict() == {"kind": "unknown", "facts": {}, "findings": []}
    assert "no findings" in render_text(result)


def test_unregistered_kind_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="no-such-kind"):
        diagnose("x", kind="no-such-kind")


def test_explicit_kind_overrides_detection() -> None:
    text = "NVRM: Xid (PCI:0000:01:00): 48, DBE\nFailed to initialize NVML: Driver/library version mismatch"
    assert diagnose(text).kind == "nvml"
    forced = diagnose(text, kind="kernel-log")
    assert forced.kind == "kernel-log" and _ids(forced) == ["GPU-HW-005"]


def test_render_text_has_evidence_remedy_and_runbook() -> None:
    text = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    out = render_text(diagnose(text))
    assert "GPU-DRV-001" in out
    assert "| NVIDIA-SMI has failed" in out
    assert "remedy: invoke driver-restore" in out
    for section in ("Symptoms:", "Diagnosis:", "Root cause:", "Resolution:", "Prevention:"):
        assert section in out
    assert "Package-Blacklist" in out


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=1500))
def test_diagnose_any_text_gives_the_contract_or_a_parse_error_for_blank_input(text: str) -> None:
    try:
        result = diagnose(text)
    except ParseError:
        assert not text.strip()
        return
    _assert_contract(result.to_dict())
    assert render_text(result).startswith(f"kind: {result.kind}")
    assert render_text(result, explain=False).startswith(f"kind: {result.kind}")


@pytest.mark.parametrize("finding_id", sorted(CATALOG))
def test_the_one_command_of_every_remedy_has_its_unknown_values_marked(finding_id: str) -> None:
    """No ``{host}`` template and no bare ``--flag VALUE`` placeholder (``--location LOCATION``, ``--model MODEL``):
    an unknown value reads ``<host>``, ``<location>``."""
    command = remedy_command(make_finding(finding_id, "s", ()).remedy)
    if command is None:
        return
    assert "{" not in command and "}" not in command, command
    assert not re.search(r"(?:^| )(?:--?[\w-]+ )?[A-Z][A-Z_]*(?: |$)", command), command


def test_brief_text_is_a_few_lines_per_finding_with_the_command() -> None:
    result = diagnose("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    out = render_text(result, explain=False)
    assert "[CRITICAL] GPU-DRV-001" in out and "  run: invoke driver-restore --limit <host>" in out
    assert "Resolution:" not in out and len(out.splitlines()) <= 8
