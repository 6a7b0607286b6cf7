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

The metrics the probe's own timer writes are defined once, in the probe (``remediation/hostside/gpuprobe/prom.py``,
``PROM_METRICS``: name, type, HELP): :data:`METRICS` takes them from there, and both producers write their families
with the probe's ``render_families`` (escaping, number format). The samples are computed on each side, here from the
typed facts the checks read, there from the raw document; ``tests/unit/test_report_prometheus.py`` holds their
labels and values to be the same.

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

from remediation.core.facts import HostFacts
from remediation.core.findings import Finding
from remediation.hostside.gpuprobe.prom import (
    PROM_METRICS,
    prom_escape_help,
    prom_escape_label,
    prom_number,
    render_families,
)
from remediation.report import hostview
from remediation.transport.fanout import Status

if TYPE_CHECKING:
    from remediation.host.audit import AuditResult

__all__ = ["METRICS", "escape_help", "escape_label_value", "render_host_prometheus", "render_prometheus"]

_PROBE_METRICS = {name: (kind, help_text) for name, kind, help_text in PROM_METRICS}


def _probe(*names: str) -> dict[str, tuple[str, str]]:
    """The probe's own definitions of these metrics (type, HELP)."""
    return {name: _PROBE_METRICS[name] for name in names}


# name -> (type, help); the output follows this order. The metrics the probe's timer writes on the host are the
# probe's definitions (one type and HELP text: node_exporter rejects one metric with two HELP texts, and dashboards
# must not care which producer wrote a sample); the others only the controller writes.
METRICS: dict[str, tuple[str, str]] = {
    "gpufleet_audit_host_up": ("gauge", "1 when the audit probed the host, 0 when it could not."),
    "gpufleet_audit_host_status": ("gauge", "The probe run's status: 1 for the current status, 0 for the others."),
    **_probe("gpufleet_nvml_ok", "gpufleet_nvml_error", "gpufleet_gpu_count"),
    "gpufleet_gpu_expected_count": ("gauge", "GPUs the host should have (inventory or VM size)."),
    "gpufleet_gpu_ok": ("gauge", "1 for a GPU NVML can talk to, 0 for a lost GPU or one without a handle."),
    **_probe(
        "gpufleet_gpu_temperature_celsius",
        "gpufleet_gpu_memory_used_bytes",
        "gpufleet_gpu_memory_total_bytes",
        "gpufleet_gpu_clocks_event_reasons",
        "gpufleet_gpu_ecc_uncorrected_volatile_total",
        "gpufleet_gpu_remap_pending",
        "gpufleet_kernel_held",
        "gpufleet_driver_info",
        "gpufleet_kernel_nvidia_module",
        "gpufleet_unattended_upgrades_enabled",
        "gpufleet_reboot_required",
    ),
    "gpufleet_finding": ("gauge", "Findings of the audit by host, ID, severity and scenario (a count, usually 1)."),
    "gpufleet_audit_findings": ("gauge", "Findings of the whole audit by severity."),
    "gpufleet_audit_timestamp_seconds": ("gauge", "When the audit started, Unix time."),
    "gpufleet_audit_duration_seconds": ("gauge", "How long the audit took, seconds."),
    **_probe("gpufleet_probe_timestamp_seconds", "gpufleet_probe_duration_seconds"),
}

Labels = tuple[tuple[str, str], ...]

_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_surrogates(value: str) -> str:
    """Lone surrogates, which no UTF-8 file can hold, become U+FFFD."""
    return _SURROGATE.sub("\ufffd", value)


def escape_label_value(value: str) -> str:
    """Label value escaping of the text format: backslash, double quote and line feed (the probe's
    ``prom_escape_label``; lone surrogates become U+FFFD)."""
    return prom_escape_label(_no_surrogates(value))


def escape_help(text: str) -> str:
    """HELP text escaping of the text format: backslash and line feed (the probe's ``prom_escape_help``)."""
    return prom_escape_help(text)


def _number(value: float) -> str:
    """The probe's number format (``prom_number``), with the text format's NaN, +Inf and -Inf."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return prom_number(value)


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
        """Written by the probe's ``render_families``, in the order of :data:`METRICS`."""
        families = {
            name: [(tuple((k, _no_surrogates(v)) for k, v in labels), value) for labels, value in family.items()]
            for name, family in self.samples.items()
        }
        metrics = [(name, kind, help_text) for name, (kind, help_text) in METRICS.items()]
        return render_families(metrics, families, _number)


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
    to ``facts.host``): what the probe's timer writes on the host (``gpuprobe.render_prometheus``, its samples
    computed from the raw document there, here from the typed facts) plus ``gpufleet_gpu_ok``,
    ``gpufleet_gpu_expected_count`` and ``gpufleet_finding``."""
    exp = _Exposition()
    _host_samples(exp, host or facts.host, facts, findings, expected_gpus)
    return exp.render()
