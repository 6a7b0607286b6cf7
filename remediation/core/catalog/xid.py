"""Xid codes of NVIDIA's Xid catalog that are seen in the field: a short meaning and the severity a finding
about them gets."""

from __future__ import annotations

from remediation.core.findings import Severity

__all__ = [
    "XID_APPLICATION",
    "XID_CRITICAL",
    "XID_MEANINGS",
    "XID_SEVERITY",
    "xid_class",
    "xid_meaning",
    "xid_remedy",
    "xid_severity",
]


# --- Xid -----------------------------------------------------------------------------------------------------
# Codes and meanings from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) and the driver's nverror.h.

XID_MEANINGS: dict[int, str] = {
    8: "GPU stopped processing: channel idle timeout (ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT)",
    13: "Graphics engine exception: usually an application error, e.g. out-of-range access (GR_EXCEPTION)",
    31: "GPU memory page fault: usually an application error, illegal address (FIFO_ERROR_MMU_ERR_FLT)",
    32: "Invalid or corrupted push buffer stream (PBDMA_ERROR)",
    38: "Driver firmware error (FECS_ERROR)",
    43: "GPU stopped processing: application fault, channel reset (RESETCHANNEL_VERIF_ERROR)",
    44: "Graphics engine fault during context switch (GR_FAULT_DURING_CTXSW)",
    45: "Preemptive cleanup after previous errors or an application killed (PREEMPTIVE_REMOVAL)",
    48: "Double-bit (uncorrectable) ECC error (GPU_ECC_DBE)",
    56: "Display engine error (DISP_MISSED_NOTIFIER)",
    57: "Error programming video memory interface (VIDMEM_ERROR)",
    58: "Unstable video memory interface detected (FB_MEMORY_ERROR)",
    61: "Internal micro-controller breakpoint/warning (PMU_BREAKPOINT)",
    62: "Internal micro-controller halt (PMU_HALT_ERROR)",
    63: "ECC page retirement or row remapping recording event (INFOROM_PAGE_RETIREMENT_EVENT)",
    64: "ECC page retirement or row remapper recording failure (INFOROM_PAGE_RETIREMENT_FAILURE)",
    68: "Video processor (NVDEC) exception (NVDEC0_ERROR)",
    69: "Graphics engine class error (GR_CLASS_ERROR)",
    73: "Video encoder (NVENC2) error (NVENC2_ERROR)",
    74: "NVLink error (NVLINK_ERROR)",
    79: "GPU has fallen off the bus (GPU_HAS_FALLEN_OFF_THE_BUS)",
    92: "High single-bit ECC error rate (EXCESSIVE_SBE_INTERRUPTS)",
    94: "Contained ECC error: the application hit uncorrectable memory, other work unaffected (CONTAINED_ERROR)",
    95: "Uncontained ECC error: all work on the GPU affected, GPU reset required (UNCONTAINED_ERROR)",
    109: "Context switch timeout (CTXSW_TIMEOUT_ERROR)",
    110: "Security fault (SEC_FAULT_ERROR)",
    119: "GSP RPC timeout: the GPU System Processor did not answer (GSP_RPC_TIMEOUT)",
    120: "GSP error (GSP_ERROR)",
    121: "C2C link corrected error (C2C_ERROR)",
    136: "NVLink link training failure (ALI_TRAINING_FAIL)",
    137: "NVLink FLA privilege error (NVLINK_FLA_PRIV_ERR)",
    140: "Unrecovered ECC error escaped page retirement / row remapping (UNRECOVERABLE_ECC_ERROR_ESCAPE)",
    143: "GPU initialization error (GPU_INIT_ERROR)",
    144: "NVLink SAW error (NVLINK_SAW_ERROR)",
    145: "NVLink RLW error (NVLINK_RLW_ERROR)",
    146: "NVLink TLW error (NVLINK_TLW_ERROR)",
    147: "NVLink TREX error (NVLINK_TREX_ERROR)",
    148: "NVLink NVLPW control error (NVLINK_NVLPW_CTRL_ERROR)",
    149: "NVLink NETIR error (NVLINK_NETIR_ERROR)",
    150: "NVLink MSE error (NVLINK_MSE_ERROR)",
    154: "GPU recovery action changed: says which recovery the other Xids need (GPU_RECOVERY_ACTION_CHANGED)",
}

# Critical: the GPU (or its memory, bus, firmware) is in a state that needs a reset, a reboot or new hardware.
# Warning: usually an application fault (13, 31, 43, 45, 69...) or a condition to watch.
XID_CRITICAL = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 136, 140, 143, *range(144, 151)})
_XID_CRITICAL = XID_CRITICAL  # the name this module used before

# Application class: NVIDIA's Xid table gives "user application" as the usual cause (13 graphics engine exception,
# 31 GPU memory page fault, 43 GPU stopped processing): the workload's own bug (illegal address, out-of-range
# access, a killed kernel) far more often than the GPU. The host is healthy until the same Xid follows several
# workloads on that GPU. The alert rules (remediation.k8s.alerts) page on XID_CRITICAL and warn on the rest.
XID_APPLICATION = frozenset({13, 31, 43})

XID_SEVERITY: dict[int, Severity] = {
    code: (Severity.CRITICAL if code in XID_CRITICAL else Severity.WARNING) for code in XID_MEANINGS
}

_REMEDY_APPLICATION = (
    "an application-class Xid (NVIDIA: usually the user application): check the application first (the "
    "processes named, their CUDA errors; rerun with CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer); do not "
    "drain for one workload's Xid: drain the host and run `dcgmi diag -r 3` only when the same Xid repeats on "
    "this GPU across several workloads"
)
_REMEDY_HARDWARE = "drain the host; reset the GPU or redeploy the VM as the Xid's catalog entry says"
_REMEDY_OTHER = (
    "check the workload and the driver version first; drain the host, reset the GPU or redeploy the VM when it "
    "repeats or comes with a critical Xid"
)


def xid_meaning(code: int) -> str:
    """A short meaning for Xid ``code``; a generic line for codes not in :data:`XID_MEANINGS`."""
    return XID_MEANINGS.get(code, f"Xid {code}: not in this catalog; see NVIDIA's Xid catalog")


def xid_class(code: int) -> str:
    """``hardware`` (a critical Xid: GPU, memory, bus, firmware), ``application`` (13, 31, 43) or ``other``."""
    if code in XID_CRITICAL:
        return "hardware"
    return "application" if code in XID_APPLICATION else "other"


def xid_remedy(code: int) -> str:
    """The remedy of a GPU-HW-005 finding about Xid ``code``: by its class (:func:`xid_class`)."""
    return {"hardware": _REMEDY_HARDWARE, "application": _REMEDY_APPLICATION}.get(xid_class(code), _REMEDY_OTHER)


def xid_severity(code: int) -> Severity:
    """The severity of a finding about Xid ``code`` (warning for codes not in the table)."""
    return XID_SEVERITY.get(code, Severity.WARNING)
