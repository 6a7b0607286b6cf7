"""The Prometheus textfile (node_exporter textfile collector), computed from the facts document alone."""

import calendar
import datetime
import socket

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple  # noqa: F401 - type comments

# (name, type, help), in the order of the output. The controller's renderer (remediation.report.prometheus) takes
# these definitions from here for the same metrics, and writes its textfiles with render_families too.
PROM_METRICS = (
    ("gpufleet_nvml_ok", "gauge", "1 when NVML initialised and every GPU answered, else 0."),
    ("gpufleet_nvml_error", "gauge", "1 for the NVML error class of a host whose NVML check failed."),
    ("gpufleet_gpu_count", "gauge", "GPUs NVML reports (nvmlDeviceGetCount)."),
    ("gpufleet_gpu_temperature_celsius", "gauge", "GPU core temperature."),
    ("gpufleet_gpu_memory_used_bytes", "gauge", "GPU memory in use (includes the driver's reservation)."),
    ("gpufleet_gpu_memory_total_bytes", "gauge", "GPU memory in total."),
    ("gpufleet_gpu_clocks_event_reasons", "gauge", "Bit mask of active clock event (throttle) reasons."),
    ("gpufleet_gpu_ecc_uncorrected_volatile_total", "counter", "Uncorrected ECC errors since the driver loaded."),
    ("gpufleet_gpu_remap_pending", "gauge", "1 when a row remap (or page retirement) waits for a GPU reset."),
    ("gpufleet_kernel_held", "gauge", "1 when the booted kernel's image package is on hold in dpkg."),
    ("gpufleet_driver_info", "gauge", "NVIDIA driver version (NVML's, else the driver package's); value 1."),
    ("gpufleet_kernel_nvidia_module", "gauge", "1 when that installed kernel has an NVIDIA module, else 0."),
    ("gpufleet_unattended_upgrades_enabled", "gauge", "1 when unattended-upgrades is installed and enabled."),
    ("gpufleet_reboot_required", "gauge", "1 when /run/reboot-required exists."),
    ("gpufleet_probe_timestamp_seconds", "gauge", "Unix time when the probe started collecting."),
    ("gpufleet_probe_duration_seconds", "gauge", "Wall time of the whole collection."),
)


def prom_escape_label(value):
    # type: (Any) -> str
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prom_escape_help(text):
    # type: (str) -> str
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def prom_number(value):
    # type: (Any) -> str
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _iso_to_epoch(text):
    # type: (Any) -> Optional[float]
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return float(calendar.timegm(parsed.timetuple()))


def _prom_samples(doc, host):
    # type: (Dict[str, Any], str) -> Dict[str, List[Tuple[List[Tuple[str, str]], Any]]]
    """Facts document -> {metric name: [(labels, value), ...]}, labels as (name, value) pairs; absent facts give no
    sample."""
    out = dict((name, []) for name, _, _ in PROM_METRICS)  # type: Dict[str, List[Tuple[List[Tuple[str, str]], Any]]]

    def add(name, value, **labels):
        # type: (str, Any, str) -> None
        if value is None:
            return
        merged = {"host": host}
        merged.update(labels)
        out[name].append((list(merged.items()), value))

    nvml = doc.get("nvml") or {}
    ok = bool(nvml.get("ok"))
    add("gpufleet_nvml_ok", ok)
    if not ok:
        add("gpufleet_nvml_error", 1, error_class=str(nvml.get("error_class") or "other"))
    count = nvml.get("device_count")
    if isinstance(count, int) and not isinstance(count, bool):
        add("gpufleet_gpu_count", count)
    for gpu in nvml.get("gpus") or []:
        if not isinstance(gpu, dict) or gpu.get("index") is None:
            continue
        index = str(gpu["index"])
        uuid = gpu.get("uuid") or ""
        add("gpufleet_gpu_temperature_celsius", gpu.get("temperature_c"), gpu=index, uuid=uuid)
        memory = gpu.get("memory") or {}
        add("gpufleet_gpu_memory_used_bytes", memory.get("used"), gpu=index, uuid=uuid)
        add("gpufleet_gpu_memory_total_bytes", memory.get("total"), gpu=index, uuid=uuid)
        add("gpufleet_gpu_clocks_event_reasons", (gpu.get("clocks_event_reasons") or {}).get("mask"), gpu=index)
        ecc_volatile = (gpu.get("ecc") or {}).get("volatile") or {}
        add("gpufleet_gpu_ecc_uncorrected_volatile_total", ecc_volatile.get("uncorrected"), gpu=index)
        pending = (gpu.get("remapped_rows") or {}).get("pending")
        if pending is None:
            pending = (gpu.get("retired_pages") or {}).get("pending")
        add("gpufleet_gpu_remap_pending", pending, gpu=index)

    system = doc.get("system") or {}
    packages = doc.get("packages") or {}
    booted = system.get("kernel")
    kernels = [k for k in packages.get("kernels") or [] if isinstance(k, dict) and k.get("release")]
    if booted and packages.get("available", True) and doc.get("packages") is not None:
        held = set(packages.get("held") or [])
        images = set(k.get("image_package") for k in kernels if k.get("release") == booted)
        images.add("linux-image-%s" % booted)
        add("gpufleet_kernel_held", bool(images & held), kernel=booted)
    for kernel in kernels:
        add(
            "gpufleet_kernel_nvidia_module",
            bool((kernel.get("nvidia_module") or {}).get("present")),
            kernel=kernel["release"],
            booted="true" if kernel["release"] == booted else "false",
        )
    version = nvml.get("driver_version") or packages.get("driver_package_version")
    if version:
        add("gpufleet_driver_info", 1, version=str(version))
    unattended = doc.get("unattended_upgrades")
    if isinstance(unattended, dict) and "enabled" in unattended:
        add("gpufleet_unattended_upgrades_enabled", bool(unattended.get("enabled")))
    if "reboot_required" in system:
        add("gpufleet_reboot_required", bool(system.get("reboot_required")))
    add("gpufleet_probe_timestamp_seconds", _iso_to_epoch(doc.get("collected_at")))
    duration_ms = doc.get("duration_ms")
    if isinstance(duration_ms, (int, float)) and not isinstance(duration_ms, bool):
        add("gpufleet_probe_duration_seconds", duration_ms / 1000.0)
    return out


def render_prometheus(doc, host=None):
    # type: (Dict[str, Any], Optional[str]) -> str
    """The facts document as a Prometheus textfile (exposition format 0.0.4), computed from the facts alone.

    ``host`` is the value of every sample's ``host`` label (default: the document's ``hostname``)."""
    host = host or str(doc.get("hostname") or socket.gethostname())
    return render_families(PROM_METRICS, _prom_samples(doc, host))


def render_families(metrics, samples, number=prom_number):
    # type: (Iterable[Tuple[str, str, str]], Mapping[str, Sequence[Tuple[Iterable[Tuple[str, Any]], Any]]], Callable[[Any], str]) -> str
    """Samples in the text exposition format (0.0.4), family by family in the order of ``metrics`` ((name, type,
    HELP) triples): a family's HELP and TYPE lines, then its samples, each ``(labels, value)`` with the labels as
    (name, value) pairs, written with ``number``. A metric without samples is left out; no samples at all is "".

    The controller writes its textfiles (remediation.report.prometheus) with this function too."""
    lines = []  # type: List[str]
    for name, kind, help_text in metrics:
        family = samples.get(name)
        if not family:
            continue
        lines.append("# HELP %s %s" % (name, prom_escape_help(help_text)))
        lines.append("# TYPE %s %s" % (name, kind))
        for labels, value in family:
            rendered = ",".join('%s="%s"' % (key, prom_escape_label(text)) for key, text in labels)
            if rendered:
                lines.append("%s{%s} %s" % (name, rendered, number(value)))
            else:
                lines.append("%s %s" % (name, number(value)))
    return "\n".join(lines) + "\n" if lines else ""


def render_textfile(doc, host=None):
    # type: (Dict[str, Any], Optional[str]) -> str
    """The node_exporter textfile: :func:`render_prometheus` of the document without its kernel log lines."""
    return render_prometheus(dict((k, v) for k, v in doc.items() if k != "kernel_log"), host)
