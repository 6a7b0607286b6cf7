"""What a real, healthy H200 showed (tests/fixtures/real-gpu-h200/README.md, "measured again"): the checks find
nothing wrong in its NVML answer, ``diagnose`` calls its nvidia-smi output "no error" (not "unknown"), and its torch
OOM parses as it always did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remediation.core.checks import run_checks
from remediation.core.checks.policy import Policy
from remediation.core.facts import facts_from_dict
from remediation.core.parsers import detect_kind
from remediation.host.diagnose import diagnose, render_text

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-gpu-h200"


def _text(name: str) -> str:
    return (REAL / name).read_text(encoding="utf-8")


def test_the_healthy_nvml_answer_as_a_facts_document_has_no_findings() -> None:
    doc = json.loads(_text("probe-nvml.json"))
    assert doc["nvml"]["error_class"] == "none"
    facts = facts_from_dict(doc, host="h200")
    assert facts.nvml.ok and not facts.nvml.failed
    assert [g.name for g in facts.nvml.gpus] == ["NVIDIA H200"]
    assert run_checks(facts, Policy()) == ()


@pytest.mark.parametrize(("name", "report"), [("nvidia-smi.txt", "nvidia-smi"), ("nvidia-smi-q.txt", "nvidia-smi -q")])
def test_healthy_nvidia_smi_is_no_error_not_unknown(name: str, report: str) -> None:
    text = _text(name)
    assert detect_kind(text) == "nvml"
    result = diagnose(text)
    assert result.kind == "nvml" and result.findings == ()
    facts = result.facts
    assert facts["error_class"] == "none" and facts["healthy"] is True
    assert facts["report"] == report
    assert facts["driver_version"] == "580.159.04"
    assert facts["gpus"] == ["NVIDIA H200"]
    assert "no error" in render_text(result)


def test_a_table_with_an_unreadable_field_is_not_called_healthy() -> None:
    text = _text("nvidia-smi.txt").replace("|                    0 |", "|                 ERR! |", 1)
    assert "ERR!" in text
    result = diagnose(text)
    assert result.kind == "nvml" and result.facts["healthy"] is False
    assert "no error" not in render_text(result)


def test_a_failure_pasted_under_the_table_is_still_the_failure() -> None:
    text = _text("nvidia-smi.txt") + "\nUnable to determine the device handle for GPU 0000:00:06.0: Unknown Error\n"
    result = diagnose(text)
    assert result.facts["error_class"] == "handle_unknown_error" and result.facts["healthy"] is False
    assert result.findings


def test_the_real_torch_oom_parses_as_before() -> None:
    result = diagnose(_text("torch-oom.txt"))
    assert result.kind == "oom"
    facts = result.facts
    assert facts["format"] == "D" and facts["gpu_index"] == 0
    assert facts["requested_bytes"] == 200005889556  # 186.27 GiB as printed
    assert facts["allocated_bytes"] == facts["reserved_bytes"] == 64 * 1024 * 1024
    assert facts["process_bytes"] == 822 * 1024 * 1024
    assert [f.id for f in result.findings] == ["TRAIN-OOM-001"]
