"""NVML's return codes, their names and the strings programs print for them, mapped to ``error_class``.

Every ``nvmlReturn_t`` of ``nvml.h`` is here with the names and texts it shows up as in field text:

- the enum name, ``NVML_ERROR_DRIVER_NOT_LOADED`` (C, pynvml), its go-nvml spelling ``ERROR_DRIVER_NOT_LOADED``
  and pynvml's exception class ``NVMLError_DriverNotLoaded``;
- ``nvmlErrorString()``'s text as the library returns it (``Driver Not Loaded``; for code 18 the library says
  ``Driver/library version mismatch`` while pynvml's fallback table says ``RM has detected an NVML/RM version
  mismatch.``) and ``nvml.h``'s one-line description of the code (``NVIDIA driver is not loaded``, ``An internal
  driver error occurred``), which wrappers print instead;
- the number itself (``nvmlInit_v2 failed with error 9``).

``error_class`` is the class the probe gives the same code (:mod:`remediation.hostside.gpuprobe`): 9
``driver_not_loaded``, 18 ``version_mismatch``, 12 ``library_not_found``, 15 ``gpu_lost``, 999 ``Unknown Error``
``handle_unknown_error`` when it came from getting a device handle (``nvmlDeviceGetHandleBy*``, nvidia-smi's
"Unable to determine the device handle"); every other code is ``other``: NVML failed, for a reason no remedy of
its own covers (the probe's ``_CODE_TO_CLASS`` is the same mapping; a unit test keeps the two equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NVML_ERRORS", "NvmlError", "by_code", "by_name", "class_for"]


@dataclass(frozen=True)
class NvmlError:
    code: int
    name: str  # "NVML_ERROR_DRIVER_NOT_LOADED"
    strings: tuple[str, ...]  # nvmlErrorString() texts and nvml.h's description
    error_class: str

    @property
    def short(self) -> str:
        """``DRIVER_NOT_LOADED``."""
        return self.name[len("NVML_ERROR_") :]

    @property
    def exception(self) -> str:
        """pynvml's exception class for the code: ``NVMLError_DriverNotLoaded``."""
        return "NVMLError_" + "".join(part.capitalize() for part in self.short.split("_"))


_OTHER = "other"

NVML_ERRORS: tuple[NvmlError, ...] = (
    NvmlError(1, "NVML_ERROR_UNINITIALIZED", ("Uninitialized", "NVML was not first initialized"), _OTHER),
    NvmlError(2, "NVML_ERROR_INVALID_ARGUMENT", ("Invalid Argument", "A supplied argument is invalid"), _OTHER),
    NvmlError(
        3,
        "NVML_ERROR_NOT_SUPPORTED",
        ("Not Supported", "The requested operation is not available on target device"),
        _OTHER,
    ),
    NvmlError(
        4,
        "NVML_ERROR_NO_PERMISSION",
        ("Insufficient Permissions", "The current user does not have permission for operation"),
        _OTHER,
    ),
    NvmlError(
        5, "NVML_ERROR_ALREADY_INITIALIZED", ("Already Initialized", "Multiple initializations are now allowed"), _OTHER
    ),
    NvmlError(6, "NVML_ERROR_NOT_FOUND", ("Not Found", "A query to find an object was unsuccessful"), _OTHER),
    NvmlError(
        7, "NVML_ERROR_INSUFFICIENT_SIZE", ("Insufficient Size", "An input argument is not large enough"), _OTHER
    ),
    NvmlError(
        8,
        "NVML_ERROR_INSUFFICIENT_POWER",
        ("Insufficient External Power", "A device's external power cables are not properly attached"),
        _OTHER,
    ),
    NvmlError(
        9, "NVML_ERROR_DRIVER_NOT_LOADED", ("Driver Not Loaded", "NVIDIA driver is not loaded"), "driver_not_loaded"
    ),
    NvmlError(10, "NVML_ERROR_TIMEOUT", ("Timeout", "User provided timeout passed"), _OTHER),
    NvmlError(
        11,
        "NVML_ERROR_IRQ_ISSUE",
        ("Interrupt Request Issue", "NVIDIA Kernel detected an interrupt issue with a GPU"),
        _OTHER,
    ),
    NvmlError(
        12,
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        ("NVML Shared Library Not Found", "NVML Shared Library couldn't be found or loaded"),
        "library_not_found",
    ),
    NvmlError(
        13,
        "NVML_ERROR_FUNCTION_NOT_FOUND",
        ("Function Not Found", "Local version of NVML doesn't implement this function"),
        _OTHER,
    ),
    NvmlError(14, "NVML_ERROR_CORRUPTED_INFOROM", ("Corrupted infoROM", "infoROM is corrupted"), _OTHER),
    NvmlError(
        15,
        "NVML_ERROR_GPU_IS_LOST",
        ("GPU is lost", "The GPU has fallen off the bus or has otherwise become inaccessible"),
        "gpu_lost",
    ),
    NvmlError(
        16,
        "NVML_ERROR_RESET_REQUIRED",
        ("GPU requires restart", "The GPU requires a reset before it can be used again"),
        _OTHER,
    ),
    NvmlError(
        17,
        "NVML_ERROR_OPERATING_SYSTEM",
        (
            "The operating system has blocked the request",
            "The GPU control device has been blocked by the operating system",
        ),
        _OTHER,
    ),
    NvmlError(
        18,
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        (
            "Driver/library version mismatch",
            "RM has detected an NVML/RM version mismatch",
            "RM detects a driver/library version mismatch",
        ),
        "version_mismatch",
    ),
    NvmlError(
        19,
        "NVML_ERROR_IN_USE",
        ("In use by another client", "An operation cannot be performed because the GPU is currently in use"),
        _OTHER,
    ),
    NvmlError(20, "NVML_ERROR_MEMORY", ("Insufficient Memory",), _OTHER),
    NvmlError(21, "NVML_ERROR_NO_DATA", ("No data",), _OTHER),
    NvmlError(
        22,
        "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        ("The requested vgpu operation is not available on target device",),
        _OTHER,
    ),
    NvmlError(
        23,
        "NVML_ERROR_INSUFFICIENT_RESOURCES",
        ("Insufficient Resources", "Ran out of critical resources"),
        _OTHER,
    ),
    NvmlError(24, "NVML_ERROR_FREQ_NOT_SUPPORTED", ("Frequency not supported",), _OTHER),
    NvmlError(
        25,
        "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        ("Argument version mismatch", "The provided version is invalid/unsupported"),
        _OTHER,
    ),
    NvmlError(26, "NVML_ERROR_DEPRECATED", ("The requested functionality has been deprecated",), _OTHER),
    NvmlError(27, "NVML_ERROR_NOT_READY", ("Not Ready", "The system is not ready for the request"), _OTHER),
    NvmlError(28, "NVML_ERROR_GPU_NOT_FOUND", ("GPU not found", "No GPUs were found"), _OTHER),
    NvmlError(
        29,
        "NVML_ERROR_INVALID_STATE",
        ("Invalid state", "Resource not in correct state to perform requested operation"),
        _OTHER,
    ),
    NvmlError(
        30,
        "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
        ("Reset type not supported", "Reset not supported for given device/parameters"),
        _OTHER,
    ),
    NvmlError(999, "NVML_ERROR_UNKNOWN", ("Unknown Error", "An internal driver error occurred"), _OTHER),
)

_BY_CODE = {e.code: e for e in NVML_ERRORS}
_BY_NAME = {e.short: e for e in NVML_ERRORS}
_BY_EXCEPTION = {e.exception.lower(): e for e in NVML_ERRORS}

#: Device-handle calls: an Unknown Error there is the GPU itself (GPU-HW-006), not NVML as a whole.
HANDLE_CONTEXT = re.compile(
    r"device[ _-]?handle|handle (?:for|of) (?:the )?(?:gpu|device)|GetHandleBy\w*|DeviceGetHandle\w*", re.I
)


def by_code(code: int) -> NvmlError | None:
    return _BY_CODE.get(code)


def by_name(name: str) -> NvmlError | None:
    """``NVML_ERROR_GPU_IS_LOST``, ``ERROR_GPU_IS_LOST`` or ``NVMLError_GpuIsLost`` (any case)."""
    upper = name.upper()
    for prefix in ("NVML_ERROR_", "ERROR_"):
        if upper.startswith(prefix):
            return _BY_NAME.get(upper[len(prefix) :])
    return _BY_EXCEPTION.get(name.lower().rsplit(".", 1)[-1])


def class_for(error: NvmlError, *, handle: bool) -> str:
    """The ``error_class`` of ``error``; ``handle``: it came from getting a device handle."""
    if error.code == 999 and handle:
        return "handle_unknown_error"
    return error.error_class
