"""Catalog remedies mark what the user must fill in as ``<name>`` (or ``{host}``, filled per host), never as a bare
ALL-CAPS word (``RG``, ``MODEL``, ``--batch B``), so the text and the JSON of a finding say the same command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from remediation.core.catalog import CATALOG

ROOT = Path(__file__).resolve().parents[2]
#: ALL-CAPS words a remedy may carry as themselves: acronyms and the names of real variables and metrics.
MEANT = frozenset({
    "GPU", "GPUs", "VM", "VMSS", "CPU", "PTU", "TPM", "RPM", "ECC", "NVML", "AKS", "DCGM_FI_DEV_GPU_TEMP",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "NVIDIA", "DKMS", "LoRA", "QLoRA", "ZeRO", "OOM", "IMDS",
    "CUDA", "ROCm", "HBM", "PCIe", "BAR1", "RAM", "AZCOPY_AUTO_LOGIN_TYPE", "NVMe", "SKU",
})
CAPS = re.compile(r"(?<![\w<{$/.=-])([A-Z][A-Z0-9_]+)(?![\w>}])")
FLAG_VALUE = re.compile(r"(--[a-z][a-z-]*)[ =]([A-Z][A-Z0-9_]*)(?![\w>}])")
IDS = sorted(CATALOG)


@pytest.mark.parametrize("finding_id", IDS)
def test_no_bare_placeholder_in_a_remedy(finding_id: str) -> None:
    remedy = CATALOG[finding_id].remedy
    assert not FLAG_VALUE.findall(remedy), (finding_id, remedy)  # --fleet FLEET, --batch B
    bare = set(CAPS.findall(remedy)) - MEANT
    assert not bare, (finding_id, sorted(bare), remedy)


def test_the_check_catches_what_it_is_for() -> None:
    for text in ("az vm redeploy --resource-group RG --name {host}", "invoke train.plan --batch B",
                 "kubectl logs POD --previous"):
        assert FLAG_VALUE.findall(text) or set(CAPS.findall(text)) - MEANT, text
    assert not FLAG_VALUE.findall("--resource-group <resource-group> --name {host}")


@pytest.mark.parametrize(
    "fixture", ["tests/fixtures/real-gpu-h200/torch-oom.txt", "tests/fixtures/tour/s1-after-reboot.txt",
                "tests/fixtures/tour/aoai-429.txt"]
)
def test_text_and_json_name_the_same_placeholders(fixture: str) -> None:
    from remediation.host.api import diagnose, render_text

    result = diagnose((ROOT / fixture).read_text(encoding="utf-8"), source=fixture)
    assert result.findings, fixture
    data = json.loads(json.dumps(result.to_dict()))
    text = render_text(result, explain=False)
    remedies = [finding["remedy"] for finding in data["findings"]]
    for remedy in remedies:
        assert not FLAG_VALUE.findall(remedy) and not set(CAPS.findall(remedy)) - MEANT, remedy
    runs = [line.split("run: ", 1)[1] for line in text.splitlines() if line.startswith("  run: ")]
    fixes = [line.split("fix: ", 1)[1] for line in text.splitlines() if line.startswith("  fix: ")]
    assert runs or fixes, text
    for shown in runs + fixes:  # the command the text says to run is the JSON's, word for word
        assert any(shown in remedy for remedy in remedies), (shown, remedies)


#: Upper-case values a runbook gives as themselves: an ISO 8601 interval, a GPU model.
REAL_VALUES = frozenset({"PT1M", "H200"})
SHORT_FLAG_VALUE = re.compile(r"(?<=\s)(-[a-zA-Z])[ ]([A-Z][A-Z0-9_]*)(?=[\s`)])")


@pytest.mark.parametrize("finding_id", IDS)
def test_no_bare_placeholder_in_a_runbook_command(finding_id: str) -> None:
    import dataclasses

    runbook = CATALOG[finding_id].runbook
    for field in dataclasses.fields(runbook):
        text = getattr(runbook, field.name)
        if not isinstance(text, str):
            continue
        for command in re.findall(r"`([^`]+)`", text):
            values = {v for _f, v in FLAG_VALUE.findall(command)} | {v for _f, v in SHORT_FLAG_VALUE.findall(command)}
            assert not values - REAL_VALUES - {"ECC", "PERFORMANCE"}, (finding_id, field.name, command)
