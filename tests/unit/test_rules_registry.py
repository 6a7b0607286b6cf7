"""One rule per finding ID: every ``make_finding("ID", ...)`` sits in the one function registered for that ID, and
the audit (a host's facts) and ``invoke diagnose`` (pasted text) give the same finding for the same evidence."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from remediation.core import catalog
from remediation.core.catalog import host as host_catalog
from remediation.core.checks import RULES, Policy, run_checks
from remediation.core.checks.registry import rule
from remediation.core.facts import facts_from_dict
from remediation.core.findings import Finding
from remediation.host.diagnose import critical_first, diagnose
from tests.corpus import blocks as corpus_blocks

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "facts"


def _make_finding_sites() -> dict[str, set[str]]:
    """finding ID -> the functions (``module.qualname``) whose body calls ``make_finding`` with that ID."""
    sites: dict[str, set[str]] = {}
    for path in sorted((ROOT / "remediation").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, scope: list[str], module: str = module, path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(child, [*scope, child.name])
                    continue
                if isinstance(child, ast.Call):
                    func = child.func
                    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                    if name == "make_finding" and module != "remediation.core.findings":
                        first = child.args[0] if child.args else None
                        assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                            f"{path}:{child.lineno}: make_finding's ID must be a literal, so its rule can be found"
                        )
                        assert scope, f"{path}:{child.lineno}: make_finding outside a function"
                        sites.setdefault(first.value, set()).add(f"{module}.{'.'.join(scope)}")
                visit(child, scope)

        visit(tree, [])
    return sites


def test_every_finding_id_is_made_by_exactly_one_function_its_rule() -> None:
    sites = _make_finding_sites()
    assert sites, "no make_finding call found"
    for finding_id, functions in sorted(sites.items()):
        assert finding_id in catalog.CATALOG, finding_id
        assert len(functions) == 1, f"{finding_id} is decided in {sorted(functions)}: one rule per finding ID"
        if finding_id in RULES:
            assert functions == {RULES[finding_id].where}, (finding_id, functions, RULES[finding_id].where)


def test_every_host_finding_has_a_registered_rule() -> None:
    assert {e.id for e in host_catalog.ENTRIES} == set(RULES)


def test_a_second_rule_for_an_id_is_refused() -> None:
    with pytest.raises(RuntimeError, match="GPU-HW-005 has two rules"):

        @rule("GPU-HW-005")
        def another_xid_rule(ev: object) -> list[Finding]:
            return []


# --- the same evidence, from a host or from text, gives the same finding -----------------------------------------


def _host_with(kernel_lines: list[str] | None = None, apt_text: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / "healthy.json").read_text())
    if kernel_lines is not None:
        doc["kernel_log"]["lines"] = kernel_lines
    if apt_text is not None:
        doc["apt_history"]["text"] = apt_text
    return doc


def _key(f: Finding) -> tuple[str, str, str, tuple[str, ...]]:
    return (f.id, f.severity.value, f.summary, f.evidence)


KERNEL_IDS = {"GPU-HW-001", "GPU-HW-005", "GPU-HW-007", "GPU-HW-008", "GPU-DRV-007"}
TWO_GPUS = [
    "[ 101.000001] NVRM: Xid (PCI:0000:07:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x1",
    "[ 101.000002] NVRM: Xid (PCI:0000:08:00): 13, pid=4243, name=python3, Graphics Exception: ESR 0x1",
    "[ 102.000000] NVRM: Xid (PCI:0000:07:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x2",
    "[ 103.000000] NVRM: Xid (PCI:0000:08:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable ECC error",
]


def test_xid_granularity_is_code_and_gpu_in_both() -> None:
    """Formerly one GPU-HW-005 per code in diagnose and one per (code, GPU) in the audit."""
    audit = [f for f in run_checks(facts_from_dict(_host_with(TWO_GPUS)), Policy()) if f.id == "GPU-HW-005"]
    text = [f for f in diagnose("\n".join(TWO_GPUS)).findings if f.id == "GPU-HW-005"]
    assert [_key(f) for f in critical_first(audit)] == [_key(f) for f in text]  # diagnose lists critical first
    assert [f.summary.split(":")[0] for f in text] == ["Xid 48 on 0000", "Xid 13 on 0000", "Xid 13 on 0000"]
    assert {f.summary.split()[3].rstrip(":") for f in text} == {"0000:07:00", "0000:08:00"}


KERNEL_SECTIONS = sorted(s for s in corpus_blocks() if s.startswith(("2.", "3.")))


@pytest.mark.parametrize("section", KERNEL_SECTIONS)
def test_kernel_lines_from_a_host_or_pasted_give_the_same_findings(section: str) -> None:
    """Every kernel-log corpus block (and the kernel lines inside NVML ones) as a host's kernel log and as text."""
    for block in corpus_blocks()[section]:
        lines = block.splitlines()
        audit = [f for f in run_checks(facts_from_dict(_host_with(lines)), Policy()) if f.id in KERNEL_IDS]
        pasted = [f for f in diagnose(block, kind="kernel-log").findings if f.id in KERNEL_IDS]
        assert [_key(f) for f in critical_first(audit)] == [_key(f) for f in pasted], section


def test_unattended_installs_from_a_host_or_pasted_give_the_same_krn006() -> None:
    """Formerly: the audit listed kernel and NVIDIA installs in one GPU-KRN-006 per host, diagnose one per
    transaction and only the kernel ones (NVIDIA changes only as GPU-KRN-004)."""
    history = (
        "Start-Date: 2024-07-13  06:25:01\n"
        "Commandline: /usr/bin/unattended-upgrade\n"
        "Install: linux-image-6.5.0-44-generic:amd64 (6.5.0-44.44, automatic)\n"
        "Upgrade: linux-image-generic:amd64 (6.5.0.41.41, 6.5.0.44.44)\n"
        "End-Date: 2024-07-13  06:25:40\n"
        "\n"
        "Start-Date: 2024-07-20  06:31:12\n"
        "Commandline: /usr/bin/unattended-upgrade\n"
        "Upgrade: libnvidia-compute-535:amd64 (535.183.01-0ubuntu1, 535.216.01-0ubuntu1)\n"
        "End-Date: 2024-07-20  06:31:40\n"
    )
    audit = [f for f in run_checks(facts_from_dict(_host_with(apt_text=history)), Policy()) if f.id == "GPU-KRN-006"]
    pasted = [f for f in diagnose(history).findings if f.id == "GPU-KRN-006"]
    assert len(pasted) == 1 and [_key(f) for f in audit] == [_key(f) for f in pasted]
    assert "linux-image-6.5.0-44-generic" in pasted[0].summary and "libnvidia-compute-535" in pasted[0].summary


def test_nvml_error_from_text_and_from_the_probe_give_the_same_id() -> None:
    """The probe's classes and the text's map to the same rule (summaries differ: a host knows its packages)."""
    cases = {
        "version_mismatch": "Failed to initialize NVML: Driver/library version mismatch",
        "handle_unknown_error": "Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error",
        "gpu_lost": "nvmlDeviceGetHandleByIndex(3) failed: GPU is lost",
        "library_not_found": "NVML Shared Library Not Found",
        "no_devices": "No devices were found",
    }
    for error_class, text in cases.items():
        doc = _host_with()
        doc["nvml"].update({"ok": False, "error_class": error_class, "error": text})
        audit_ids = {f.id for f in run_checks(facts_from_dict(doc), Policy()) if f.severity.value == "critical"}
        text_ids = {f.id for f in diagnose(text).findings}
        assert text_ids <= audit_ids and text_ids, (error_class, text_ids, audit_ids)
