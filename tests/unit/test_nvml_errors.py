"""NVML errors printed by any program: NVML's whole table (every code, name and string) maps to an error_class,
whatever program printed it, and to the finding the probe's class gets in the audit."""

from __future__ import annotations

import pynvml
import pytest

from remediation.core.parsers import detect_kind, nvml_errors, nvml_text
from remediation.host.diagnose import diagnose
from remediation.hostside import gpuprobe

ERRORS = nvml_errors.NVML_ERRORS
CLASS_FINDING = {
    "driver_not_loaded": "GPU-DRV-001",
    "version_mismatch": "GPU-DRV-002",
    "library_not_found": "GPU-DRV-003",
    "gpu_lost": "GPU-HW-001",
    "handle_unknown_error": "GPU-HW-006",
    "other": "GPU-DRV-004",
}


def test_the_table_has_every_code_pynvml_knows() -> None:
    codes = {getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVML_ERROR_")}
    assert codes <= {e.code for e in ERRORS}
    for e in ERRORS:
        if hasattr(pynvml, e.name):
            assert getattr(pynvml, e.name) == e.code, e.name
    # pynvml's own strings for the codes it has a fallback for
    for code, text in pynvml.NVMLError._errcode_to_string.items():
        error = nvml_errors.by_code(code)
        assert error is not None and text.rstrip(".").lower() in {s.lower() for s in error.strings}, (code, text)


def test_the_table_classes_are_the_probes() -> None:
    """One mapping: the probe (which cannot import this package on a host) classes codes the same way."""
    table = {e.code: e.error_class for e in ERRORS if e.error_class != "other"}
    assert table == gpuprobe.nvml._CODE_TO_CLASS
    assert set(CLASS_FINDING) | {"no_devices", "none"} == set(nvml_text.ERROR_CLASSES)


def _forms(e: nvml_errors.NvmlError) -> list[tuple[str, bool]]:
    """How programs print NVML error ``e``: (text, from a device-handle call)."""
    s = e.strings[0]
    return [
        (f"Failed to initialize NVML: {s}", False),  # nvidia-smi, dcgm, nvtop
        (f"nvidia-container-cli: initialization error: nvml error: {s.lower()}: unknown", False),
        (f"ERROR: nvmlInit_v2() failed: {s}", False),  # C programs
        (f"nvmlInit_v2 failed with error {e.code}", False),
        (f"pynvml.nvml.{e.exception}: {s}", False),  # Python
        (f"call to nvmlInit returned {e.name}", False),
        (f'E0412 main.go:71] failed to initialize NVML: {e.name.replace("NVML_", "")}', False),  # go-nvml
        (f"nvmlDeviceGetHandleByIndex(0) failed: {s}", True),
        (f"Unable to determine the device handle for GPU 0000:3b:00.0: {s}", True),  # nvidia-smi
        (f"error getting device handle for index '1': {s}", True),  # k8s device plugin
        (f"nvml.DeviceGetHandleByIndex(2): {e.strings[-1]}", True),  # nvml.h's description of the code
    ]


CASES = [(e, text, handle) for e in ERRORS for text, handle in _forms(e)]


@pytest.mark.parametrize(("error", "text", "handle"), CASES, ids=[f"{c[0].code}-{i}" for i, c in enumerate(CASES)])
def test_every_nvml_error_maps_whatever_program_printed_it(
    error: nvml_errors.NvmlError, text: str, handle: bool
) -> None:
    assert detect_kind(text) == "nvml"
    parsed = nvml_text.parse(text)
    assert parsed.error_class == nvml_errors.class_for(error, handle=handle)
    assert parsed.nvml_error_code == error.code and parsed.nvml_error_name == error.name
    assert parsed.evidence == (text,)


@pytest.mark.parametrize(
    ("text", "error_class", "function"),
    [
        ("nvmlDeviceGetHandleByIndex(0) failed: Unknown Error", "handle_unknown_error", "nvmlDeviceGetHandleByIndex"),
        ("nvmlDeviceGetHandleByIndex_v2 failed: unknown error", "handle_unknown_error",
         "nvmlDeviceGetHandleByIndex_v2"),
        ("Unable to determine the device handle for gpu 0000:3B:00.0: Unknown Error", "handle_unknown_error", None),
        ("Unable to get the device handle for GPU 1: unknown error", "handle_unknown_error", None),
        ("Failed to get device handle for GPU 0: Unknown Error", "handle_unknown_error", None),
        ("nvml error: unknown error", "other", None),  # not a handle call: NVML as a whole
        ("nvml error: driver not loaded", "driver_not_loaded", None),
        ("nvmlInit_v2 returned NVML_ERROR_DRIVER_NOT_LOADED", "driver_not_loaded", "nvmlInit_v2"),
        ("nvml.Init(): ERROR_LIB_RM_VERSION_MISMATCH", "version_mismatch", "nvmlInit"),
        ("Unable to determine the device handle for GPU 0000:04:00.0: GPU is lost. Reboot it", "gpu_lost", None),
        ("nvmlDeviceGetCount() failed: Insufficient Permissions", "other", "nvmlDeviceGetCount"),
    ],
)
def test_device_handle_wording_variants_and_calls(text: str, error_class: str, function: str | None) -> None:
    parsed = nvml_text.parse(text)
    assert parsed.error_class == error_class
    assert parsed.nvml_function == function


@pytest.mark.parametrize(
    "text",
    [
        "hello: Not Found",  # an NVML string with no NVML around it
        "Timeout: 30 s",
        "RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at CUDACachingAllocator.cpp:1154",  # success code
        "nvmlDeviceGetCount() returned 4 devices",  # a count, not an error code
        "ERROR_UNKNOWN in some other library",  # go-nvml's bare names only next to NVML
    ],
)
def test_strings_without_an_nvml_error_are_not_taken(text: str) -> None:
    assert nvml_text.parse(text).error_class == "none"


@pytest.mark.parametrize(("error_class", "finding"), sorted(CLASS_FINDING.items()))
def test_each_class_from_any_program_gives_the_audits_finding(error_class: str, finding: str) -> None:
    error = next(e for e in ERRORS if nvml_errors.class_for(e, handle=True) == error_class)
    text = f"nvmlDeviceGetHandleByIndex(0) failed: {error.strings[0]}"
    if error_class != "handle_unknown_error":
        text = f"nvidia-container-cli: initialization error: nvml error: {error.strings[0].lower()}"
    result = diagnose(text)
    assert result.kind == "nvml" and result.facts["error_class"] == error_class
    assert [f.id for f in result.findings] == [finding]
    assert result.facts["nvml_error_code"] == error.code


def test_python_traceback_names_the_call_frames_above_the_error() -> None:
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/opt/conda/lib/python3.10/site-packages/gpustat/core.py", line 570, in new_query\n'
        "    handle = N.nvmlDeviceGetHandleByIndex(index)\n"
        '  File "/opt/conda/lib/python3.10/site-packages/pynvml/nvml.py", line 1655, in nvmlDeviceGetHandleByIndex\n'
        "    _nvmlCheckReturn(ret)\n"
        '  File "/opt/conda/lib/python3.10/site-packages/pynvml/nvml.py", line 765, in _nvmlCheckReturn\n'
        "    raise NVMLError(ret)\n"
        "pynvml.nvml.NVMLError_Unknown: Unknown Error\n"
    )
    result = diagnose(traceback)
    assert result.kind == "nvml" and result.facts["error_class"] == "handle_unknown_error"
    assert result.facts["nvml_function"] == "nvmlDeviceGetHandleByIndex"
    assert [f.id for f in result.findings] == ["GPU-HW-006"]
