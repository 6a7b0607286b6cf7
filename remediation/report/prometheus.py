"""The audit as Prometheus metrics, in the text exposition format node_exporter's textfile collector reads.

Two producers, one set of metric names:

- :func:`render_prometheus`: the controller's fleet audit (every host of the run, ``gpufleet_audit_*``).
- :func:`render_host_prometheus`: one host's own facts, for the probe's timer on that host, which writes
  ``/var/lib/node_exporter/textfile_collector/gpufleet.prom`` so Prometheus / Azure Monitor audit the fleet
  pull-side at any size.

Metrics (gauges unless marked counter; ``host`` is the inventory name, ``gpu`` the NVML index)::

    gpufleet_audit_host_up{host}                                1 probed, 0 not (fleet only)
    gpufleet_audit_host_status{host,status}                     1 for the probe run's status, 0 for the other
                                                                statuses (ok|failed|unreachable|timed_out)
    gpufleet_nvml_ok{host}                                      1 NVML answered for every GPU, 0 not
    gpufleet_nvml_error{host,error_class}                       1, only when NVML failed
    gpufleet_gpu_count{host}                                    nvmlDeviceGetCount (absent when NVML is down)
    gpufleet_gpu_expected_count{host}                           GPUs the host should have (when known)
    gpufleet_gpu_ok{host,gpu}                                   1 per GPU NVML listed, 0 when lost/no handle
    gpufleet_gpu_temperature_celsius{host,gpu,uuid}
    gpufleet_gpu_memory_used_bytes{host,gpu,uuid}
    gpufleet_gpu_memory_total_bytes{host,gpu,uuid}
    gpufleet_gpu_clocks_event_reasons{host,gpu}                 NVML clock event reason bitmask (0 = none)
    gpufleet_gpu_ecc_uncorrected_volatile_total{host,gpu}       counter: uncorrected ECC errors since driver load
    gpufleet_gpu_remap_pending{host,gpu}                        1 a row remap / page retirement awaits a reset
    gpufleet_kernel_held{host,kernel}                           the booted kernel: 1 its image package is held
    gpufleet_kernel_nvidia_module{host,kernel,booted}           per installed kernel: 1 it has an nvidia module
    gpufleet_driver_info{host,version}                          1; NVML's version, else the driver package's
    gpufleet_unattended_upgrades_enabled{host}                  1 unattended-upgrades installed and enabled
    gpufleet_reboot_required{host}                              1 /run/reboot-required exists
    gpufleet_probe_timestamp_seconds{host}                      when the probe collected the facts
    gpufleet_probe_duration_seconds{host}                       how long the probe took
    gpufleet_finding{host,id,severity,scenario}                 number of findings with these labels (1 for
                                                                nearly all; two hot GPUs make a 2)
    gpufleet_audit_findings{severity}                           fleet totals, every severity present (fleet only)
    gpufleet_audit_timestamp_seconds                            audit start, Unix time (fleet only)
    gpufleet_audit_duration_seconds                             audit wall time (fleet only)

The metrics the probe's own timer writes (``remediation/hostside/gpuprobe.py``, ``PROM_METRICS``) carry the same
name, type, HELP and labels here; ``tests/unit/test_report_prometheus.py`` holds the two producers to that.

A value that is not known (a GPU without a temperature sensor, NVML down) is left out, never written as 0.
Label values are escaped as the format requires (``\\`` ``"`` and newline); no sample carries a timestamp
(node_exporter rejects them in textfiles). Written by hand rather than with ``prometheus_client`` so the
on-host timer needs nothing but the standard library; the tests parse the output back with
``prometheus_client``'s parser.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from remediation.facts import HostFacts
from remediation.fanout import Status
from remediation.findings import Finding
from remediation.report import hostview

if TYPE_CHECKING:
    from remediation.audit import AuditResult

__all__ = ["METRICS", "escape_help", "escape_label_value", "render_host_prometheus", "render_prometheus"]

# name -> (type, help); the output follows this order. The metrics the probe's timer writes on the host
# (remediation/hostside/gpuprobe.py PROM_METRICS) have the same type, HELP text and labels here: node_exporter
# rejects one metric with two HELP texts, and dashboards must not care which producer wrote a sample.
METRICS: dict[str, tuple[str, str]] = {
    "gpufleet_audit_host_up": ("gauge", "1 when the audit probed the host, 0 when it could not."),
    "gpufleet_audit_host_status": ("gauge", "The probe run's status: 1 for the current status, 0 for the others."),
    "gpufleet_nvml_ok": ("gauge", "1 when NVML initialised and every GPU answered, else 0."),
    "gpufleet_nvml_error": ("gauge", "1 for the NVML error class of a host whose NVML check failed."),
    "gpufleet_gpu_count": ("gauge", "GPUs NVML reports (nvmlDeviceGetCount)."),
    "gpufleet_gpu_expected_count": ("gauge", "GPUs the host should have (inventory or VM size)."),
    "gpufleet_gpu_ok": ("gauge", "1 for a GPU NVML can talk to, 0 for a lost GPU or one without a handle."),
    "gpufleet_gpu_temperature_celsius": ("gauge", "GPU core temperature."),
    "gpufleet_gpu_memory_used_bytes": ("gauge", "GPU memory in use (includes the driver's reservation)."),
    "gpufleet_gpu_memory_total_bytes": ("gauge", "GPU memory in total."),
    "gpufleet_gpu_clocks_event_reasons": ("gauge", "Bit mask of active clock event (throttle) reasons."),
    "gpufleet_gpu_ecc_uncorrected_volatile_total": ("counter", "Uncorrected ECC errors since the driver loaded."),
    "gpufleet_gpu_remap_pending": ("gauge", "1 when a row remap (or page retirement) waits for a GPU reset."),
    "gpufleet_kernel_held": ("gauge", "1 when the booted kernel's image package is on hold in dpkg."),
    "gpufleet_driver_info": ("gauge", "NVIDIA driver version (NVML's, else the driver package's); value 1."),
    "gpufleet_kernel_nvidia_module": ("gauge", "1 when that installed kernel has an NVIDIA module, else 0."),
    "gpufleet_unattended_upgrades_enabled": ("gauge", "1 when unattended-upgrades is installed and enabled."),
    "gpufleet_reboot_required": ("gauge", "1 when /run/reboot-required exists."),
    "gpufleet_finding": ("gauge", "Findings of the audit by host, ID, severity and scenario (a count, usually 1)."),
    "gpufleet_audit_findings": ("gauge", "Findings of the whole audit by severity."),
    "gpufleet_audit_timestamp_seconds": ("gauge", "When the audit started, Unix time."),
    "gpufleet_audit_duration_seconds": ("gauge", "How long the audit took, seconds."),
    "gpufleet_probe_timestamp_seconds": ("gauge", "Unix time when the probe started collecting."),
    "gpufleet_probe_duration_seconds": ("gauge", "Wall time of the whole collection."),
}

Labels = tuple[tuple[str, str], ...]

_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_label_value(value: str) -> str:
    """Label value escaping of the text format: backslash, double quote and line feed (lone surrogates, which
    no UTF-8 file can hold, become U+FFFD)."""
    value = _SURROGATE.sub("\ufffd", value)
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text escaping of the text format: backslash and line feed."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass
class _Exposition:
    """Samples collected per metric, written family by family (a family's samples must stay together)."""

    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)

    def add(self, name: str, value: float | None, **labels: object) -> None:
        if name not in METRICS:
            raise KeyError(f"metric {name!r} is not declared in METRICS")
        if value is None:
            return
        key: Labels = tuple((k, "" if v is None else str(v)) for k, v in labels.items())
        family = self.samples.setdefault(name, {})
        family.setdefault(key, value)  # a duplicate label set would be rejected by node_exporter: first wins

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, help_text) in METRICS.items():
            family = self.samples.get(name)
            if not family:
                continue
            out.append(f"# HELP {name} {escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in family.items():
                rendered = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
                out.append(f"{name}{{{rendered}}} {_number(value)}" if labels else f"{name} {_number(value)}")
        return "\n".join(out) + "\n" if out else ""


def _host_samples(
    exp: _Exposition, host: str, facts: HostFacts, findings: Iterable[Finding], expected: int | None
) -> None:
    nvml = facts.nvml
    exp.add("gpufleet_nvml_ok", 1 if nvml.ok else 0, host=host)
    if not nvml.ok:
        exp.add("gpufleet_nvml_error", 1, host=host, error_class=nvml.error_class)
    exp.add("gpufleet_gpu_count", nvml.device_count, host=host)
    exp.add("gpufleet_gpu_expected_count", expected, host=host)
    for gpu in nvml.gpus:
        exp.add("gpufleet_gpu_ok", 1 if gpu.ok else 0, host=host, gpu=gpu.index)
    for gpu in nvml.gpus:
        if not gpu.ok:
            continue
        uuid = gpu.uuid or ""
        exp.add("gpufleet_gpu_temperature_celsius", gpu.temperature_c, host=host, gpu=gpu.index, uuid=uuid)
        if gpu.memory is not None:
            exp.add("gpufleet_gpu_memory_used_bytes", gpu.memory.used, host=host, gpu=gpu.index, uuid=uuid)
            exp.add("gpufleet_gpu_memory_total_bytes", gpu.memory.total, host=host, gpu=gpu.index, uuid=uuid)
        exp.add("gpufleet_gpu_clocks_event_reasons", gpu.clocks_event_mask, host=host, gpu=gpu.index)
        exp.add("gpufleet_gpu_ecc_uncorrected_volatile_total", gpu.ecc_volatile.uncorrected, host=host, gpu=gpu.index)
        exp.add("gpufleet_gpu_remap_pending", hostview.remap_pending(gpu), host=host, gpu=gpu.index)
    held = hostview.booted_kernel_held(facts)
    if held is not None and facts.system.kernel:
        exp.add("gpufleet_kernel_held", 1 if held else 0, host=host, kernel=facts.system.kernel)
    for kernel in facts.packages.kernels:
        exp.add(
            "gpufleet_kernel_nvidia_module",
            1 if kernel.has_nvidia_module else 0,
            host=host,
            kernel=kernel.release,
            booted="true" if kernel.release == facts.system.kernel else "false",
        )
    version = hostview.driver_version(facts)
    if version is not None:
        exp.add("gpufleet_driver_info", 1, host=host, version=version.version)
    if facts.unattended_upgrades.available:
        exp.add("gpufleet_unattended_upgrades_enabled", 1 if facts.unattended_upgrades.enabled else 0, host=host)
    system = facts.raw.get("system")
    if isinstance(system, Mapping) and "reboot_required" in system:
        exp.add("gpufleet_reboot_required", 1 if facts.system.reboot_required else 0, host=host)
    if facts.collected_at is not None:
        exp.add("gpufleet_probe_timestamp_seconds", facts.collected_at.timestamp(), host=host)
    if facts.duration_ms is not None:
        exp.add("gpufleet_probe_duration_seconds", facts.duration_ms / 1000.0, host=host)
    _finding_samples(exp, host, findings)


def _finding_samples(exp: _Exposition, host: str, findings: Iterable[Finding]) -> None:
    counts: dict[tuple[str, str, str], int] = {}
    for f in findings:
        key = (f.id, f.severity.value, f.scenario.value)
        counts[key] = counts.get(key, 0) + 1
    for (fid, severity, scenario), n in counts.items():
        exp.add("gpufleet_finding", n, host=host, id=fid, severity=severity, scenario=scenario)


def render_prometheus(result: AuditResult) -> str:
    """The fleet audit as a textfile (see the module docstring for every metric)."""
    exp = _Exposition()
    for h in result.hosts:
        exp.add("gpufleet_audit_host_up", 1 if h.probed else 0, host=h.host)
        for status in Status:
            exp.add("gpufleet_audit_host_status", 1 if h.status is status else 0, host=h.host, status=status.value)
        if h.facts is not None:
            _host_samples(exp, h.host, h.facts, h.findings, hostview.expected_gpus(h))
        else:
            exp.add("gpufleet_gpu_expected_count", hostview.expected_gpus(h), host=h.host)
            _finding_samples(exp, h.host, h.findings)
    for severity, n in hostview.by_severity(result.findings).items():
        exp.add("gpufleet_audit_findings", n, severity=severity.value)
    exp.add("gpufleet_audit_timestamp_seconds", result.started_at.timestamp())
    exp.add("gpufleet_audit_duration_seconds", round(result.seconds, 3))
    return exp.render()


def render_host_prometheus(
    facts: HostFacts, findings: Sequence[Finding], *, expected_gpus: int | None = None, host: str | None = None
) -> str:
    """One host's facts and findings as a textfile, with the fleet audit's metric names (``host`` label defaults
    to ``facts.host``): what the probe's timer writes on the host (``gpuprobe.render_prometheus``, computed from
    the raw document there) plus ``gpufleet_gpu_ok``, ``gpufleet_gpu_expected_count`` and ``gpufleet_finding``."""
    exp = _Exposition()
    _host_samples(exp, host or facts.host, facts, findings, expected_gpus)
    return exp.render()
