"""What a rule reads: parsed evidence, from a host's facts or from text pasted into ``invoke diagnose``.

A rule (:mod:`remediation.core.checks.registry`) is one function of one :class:`Evidence`. The audit builds the
evidence from a host's facts (:func:`from_facts`: NVML's answer, the kernel log, apt history, ``dkms status``, and
the whole :class:`~remediation.core.facts.HostFacts` for the rules that need packages or per-GPU counters); ``invoke
diagnose`` builds it from what one piece of text says (:func:`from_nvml_text`, :func:`from_kernel_log`, ...), with
``None``/empty for what the text does not say. So the same parsed evidence (a KernelLog, an apt history, DKMS
output, an NVML error) gives the same finding whichever way it arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from remediation.core.checks.policy import Policy
from remediation.core.facts import HostFacts
from remediation.core.parsers import kernel_log as _kernel_log
from remediation.core.parsers import nvml_errors
from remediation.core.parsers.apt_history import AptHistory
from remediation.core.parsers.dkms import Dkms
from remediation.core.parsers.kernel_log import KernelLog
from remediation.core.parsers.nvml_text import NvmlText
from remediation.core.parsers.unattended_upgrades import UnattendedLog

__all__ = [
    "EMPTY_KERNEL_LOG",
    "Evidence",
    "GpuError",
    "NvmlEvidence",
    "from_apt_history",
    "from_dkms",
    "from_facts",
    "from_kernel_log",
    "from_nvml_text",
    "from_unattended_log",
]

EMPTY_KERNEL_LOG: KernelLog = _kernel_log.parse("")
EMPTY_APT_HISTORY = AptHistory(())


@dataclass(frozen=True)
class GpuError:
    """A GPU NVML could not use; ``label`` names it (``GPU 3 (00000001:00:00.0)``, ``GPU 0000:09:00.0``)."""

    label: str
    pci: str | None
    error_class: str
    error: str | None


@dataclass(frozen=True)
class NvmlEvidence:
    """NVML's answer: it answered (``answered``) or failed with ``error_class`` (see nvml_text.ERROR_CLASSES and the
    probe's ``timeout``), the message, NVML's code, the GPUs it could not use, and the lines that show it."""

    answered: bool
    error_class: str
    message: str | None
    code: int | None
    gpus: tuple[GpuError, ...]
    lines: tuple[str, ...]
    library_version: str | None = None
    service: str | None = None  # a container service that could not start because of it
    child_reaped: bool | None = None  # the probe's NVML child after a timeout

    @property
    def failed(self) -> bool:
        return not self.answered

    def gpus_of(self, error_class: str) -> tuple[GpuError, ...]:
        return tuple(g for g in self.gpus if g.error_class == error_class)


@dataclass(frozen=True)
class Evidence:
    """Everything one host or one text says, parsed. ``None``/empty: the input does not say."""

    host: str | None = None
    policy: Policy = field(default_factory=Policy)
    nvml: NvmlEvidence | None = None
    kernel_log: KernelLog = EMPTY_KERNEL_LOG
    apt_history: AptHistory = EMPTY_APT_HISTORY
    dkms: Dkms | None = None
    unattended_log: UnattendedLog = field(default_factory=UnattendedLog)
    transcript: NvmlText | None = None  # a terminal transcript's clues: modprobe lines, uname, find output
    facts: HostFacts | None = None  # the whole host, when the evidence comes from a probe

    @property
    def nvml_failed(self) -> bool:
        return self.nvml is not None and self.nvml.failed

    @property
    def nvml_class(self) -> str | None:
        """NVML's error class when it failed, ``"none"`` when it answered, ``None`` when the input does not say."""
        return None if self.nvml is None else self.nvml.error_class


def _nvml_line(error_class: str, error: str | None, code: int | None) -> str:
    suffix = f" (code {code})" if code is not None else ""
    return f"NVML: {error_class}: {error or 'no message'}{suffix}"


def from_facts(facts: HostFacts, policy: Policy) -> Evidence:
    """The evidence of one probed host."""
    n = facts.nvml
    gpus = tuple(GpuError(g.label, g.pci_bus_id, g.error_class, g.error) for g in n.gpus if not g.ok)
    nvml = NvmlEvidence(
        answered=n.ok,
        error_class="none" if n.ok else n.error_class,
        message=n.error,
        code=n.error_code,
        gpus=gpus,
        lines=() if n.ok else (_nvml_line(n.error_class, n.error, n.error_code),),
        library_version=n.nvml_version,
        child_reaped=n.child_reaped,
    )
    return Evidence(
        host=facts.host,
        policy=policy,
        nvml=nvml,
        kernel_log=facts.kernel_log,
        apt_history=facts.apt_history,
        dkms=facts.dkms,
        facts=facts,
    )


def from_nvml_text(parsed: NvmlText, log: KernelLog) -> Evidence:
    """nvidia-smi / NVML error text (with the kernel lines pasted along with it)."""
    nvml: NvmlEvidence | None = None
    if parsed.has_error:
        cls = parsed.error_class
        error = nvml_errors.by_code(parsed.nvml_error_code) if parsed.nvml_error_code is not None else None
        message = parsed.nvml_init_error or (f"{error.strings[0]} ({error.name})" if error is not None else None)
        gpus = tuple(GpuError(f"GPU {pci}", pci, cls, message) for pci in parsed.pci_bus_ids)
        nvml = NvmlEvidence(
            answered=False,
            error_class=cls,
            message=message,
            code=parsed.nvml_error_code,
            gpus=gpus,
            lines=parsed.evidence,
            library_version=parsed.nvml_library_version,
            service=parsed.service,
        )
    return Evidence(nvml=nvml, kernel_log=log, transcript=parsed)


def from_kernel_log(log: KernelLog) -> Evidence:
    return Evidence(kernel_log=log)


def from_apt_history(history: AptHistory) -> Evidence:
    return Evidence(apt_history=history)


def from_dkms(dkms: Dkms) -> Evidence:
    return Evidence(dkms=dkms)


def from_unattended_log(log: UnattendedLog) -> Evidence:
    return Evidence(unattended_log=log)
