"""GPU host probe: collect the facts the controller's checks need, print ONE JSON document.

Runs ON the GPU host with the Python standard library (Python >= 3.8) plus ``pynvml`` (PyPI
``nvidia-ml-py``), which the controller's bundle supplies when the host lacks it.  The package is
self-contained on purpose (its modules import only each other, relatively, and the standard library):
it travels over one SSH round trip (:func:`remediation.hostside.bundle`), is installed as a directory by
the timer role, and is the module_utils package of the Ansible modules, which import :func:`collect`.

One module per section of the facts document:

- :mod:`.common`: :class:`Options`, the constants and small helpers every section shares;
- :mod:`.nvml`: NVML, in a forked child (``nvml``);
- :mod:`.system`: kernel release and flavour, boot, os-release, reboot-required (``system``);
- :mod:`.modules`: Secure Boot and kernel module signatures (``secure_boot``);
- :mod:`.packages`: dpkg status, installed kernels and their NVIDIA module, the driver package (``packages``);
- :mod:`.unattended`: unattended-upgrades' effective apt configuration (``unattended_upgrades``);
- :mod:`.history`: apt history stanzas (``apt_history``);
- :mod:`.kernellog`: NVIDIA kernel log lines since boot (``kernel_log``);
- :mod:`.locks`: ``dkms status`` and the dpkg locks (``dkms_status``, ``dpkg_lock``);
- :mod:`.devices`: processes holding the GPU device files open (``device_users``);
- :mod:`.collect`: :func:`collect`, every section into one document;
- :mod:`.prom`: the Prometheus textfile computed from the document;
- :mod:`.cli`: the command line, :func:`main` (``python3 -m gpuprobe``, or ``python3 DIR/gpuprobe``).

Contract:
- stdout carries exactly one JSON document (schema ``gpufleet.facts/1``, see docs/facts-schema.md);
  with ``--json-out PATH`` and/or ``--prom-out PATH`` (the timer's mode) stdout stays empty and the document
  (mode 0600) and/or a Prometheus textfile computed from it (:func:`render_prometheus`, mode 0644) are written
  atomically; a file that cannot be written makes the exit status 1;
- the exit status is 0 whenever that document was written, NVML failures included (failures are data);
- it never hangs: NVML runs in a forked child that is SIGKILLed and reaped after ``--nvml-timeout``,
  and every external command runs with a timeout;
- every section is collected on its own; an exception in one becomes an entry in ``errors``.

Keep every module Python 3.8 compatible: no ``from __future__ import annotations``, no PEP 604/585
annotations, no ``match``; imports of each other are relative (``from .common import ...``), so the package
works under any name (``gpuprobe`` on a host, ``remediation.hostside.gpuprobe`` on the controller,
``ansible_collections.gpufleet.remediation.plugins.module_utils.gpuprobe`` in an Ansible module).

Keep the probe's start light: it runs on every host of every audit, and its CPU is the host's share of the audit.
``typing`` is imported under ``if MYPY:`` (mypy reads ``MYPY`` as true, the host never imports typing); modules
needed only on some paths (``traceback`` for a failing section, ``tempfile`` and :mod:`.prom` for the timer's
output files) are imported where they are used.
"""

from .cli import (
    FACTS_DIR_MODE,
    FACTS_FILE_MODE,
    TEXTFILE_DIR_MODE,
    TEXTFILE_MODE,
    build_arg_parser,
    main,
    write_atomic,
)
from .collect import (
    collect,
)
from .common import (
    COMMAND_TIMEOUT_S,
    DEFAULT_NVML_TIMEOUT_S,
    KERNEL_FAMILY,
    PROBE_VERSION,
    REAP_GRACE_S,
    SCHEMA,
    Options,
    run_command,
    upstream_version,
)
from .devices import (
    COMM_MAX,
    DEVICE_USERS_MAX,
    DRIVER_SERVICES,
    collect_device_users,
)
from .history import (
    APT_HISTORY_MAX_BYTES,
    HISTORY_PATTERN,
    collect_apt_history,
    select_history_stanzas,
    split_history_stanzas,
)
from .kernellog import (
    KERN_LOG_TAIL_BYTES,
    KERNEL_LOG_HEAD_LINES,
    KERNEL_LOG_MAX_LINES,
    KERNEL_LOG_PATTERN,
    collect_kernel_log,
    filter_kernel_log_lines,
    kern_log_since_boot,
)
from .locks import (
    DKMS_TIMEOUT_S,
    collect_dkms_status,
    collect_dpkg_lock,
    lock_state,
)
from .modules import (
    MODULE_SCAN_MAX_BYTES,
    MODULE_SIGNATURE_MAGIC,
    SECURE_BOOT_EFIVAR,
    ZSTD_TIMEOUT_S,
    ZstdUnavailable,
    collect_secure_boot,
    module_signed,
    module_source,
    parse_mokutil_sb_state,
    parse_secure_boot_efivar,
    would_load,
)
from .nvml import (
    CLOCK_EVENT_REASONS,
    ERROR_CLASSES,
    collect_nvml,
    serve_pynvml,
)
from .packages import (
    BRANCH_PACKAGE_RE,
    DRIVER_PACKAGE_RE,
    KERNEL_IMAGE_RE,
    KERNEL_META_RE,
    KERNEL_NON_META,
    KERNEL_NON_META_PREFIXES,
    MODULE_WALK_MAX_DEPTH,
    MODULE_WALK_MAX_ENTRIES,
    NVIDIA_PACKAGE_RE,
    USERSPACE_PACKAGE_RE,
    VERSIONED_KERNEL_PKG_RE,
    collect_packages,
    find_nvidia_module,
    module_version,
    parse_dpkg_status,
)
from .system import (
    KERNEL_RELEASE_RE,
    collect_system,
    kernel_flavour,
    parse_os_release,
)
from .unattended import (
    SIMULATE_TIMEOUT_S,
    collect_unattended,
    parse_apt_config_dump,
    parse_unattended_dry_run,
    simulate_upgrades,
    unattended_from_config,
)

__all__ = [
    "APT_HISTORY_MAX_BYTES",
    "BRANCH_PACKAGE_RE",
    "CLOCK_EVENT_REASONS",
    "COMMAND_TIMEOUT_S",
    "COMM_MAX",
    "DEFAULT_NVML_TIMEOUT_S",
    "DEVICE_USERS_MAX",
    "DKMS_TIMEOUT_S",
    "DRIVER_PACKAGE_RE",
    "DRIVER_SERVICES",
    "ERROR_CLASSES",
    "FACTS_DIR_MODE",
    "FACTS_FILE_MODE",
    "HISTORY_PATTERN",
    "KERNEL_FAMILY",
    "KERNEL_IMAGE_RE",
    "KERNEL_LOG_HEAD_LINES",
    "KERNEL_LOG_MAX_LINES",
    "KERNEL_LOG_PATTERN",
    "KERNEL_META_RE",
    "KERNEL_NON_META",
    "KERNEL_NON_META_PREFIXES",
    "KERNEL_RELEASE_RE",
    "KERN_LOG_TAIL_BYTES",
    "MODULE_SCAN_MAX_BYTES",
    "MODULE_SIGNATURE_MAGIC",
    "MODULE_WALK_MAX_DEPTH",
    "MODULE_WALK_MAX_ENTRIES",
    "NVIDIA_PACKAGE_RE",
    "PROBE_VERSION",
    "REAP_GRACE_S",
    "SCHEMA",
    "SECURE_BOOT_EFIVAR",
    "SIMULATE_TIMEOUT_S",
    "TEXTFILE_DIR_MODE",
    "TEXTFILE_MODE",
    "USERSPACE_PACKAGE_RE",
    "VERSIONED_KERNEL_PKG_RE",
    "ZSTD_TIMEOUT_S",
    "Options",
    "ZstdUnavailable",
    "build_arg_parser",
    "collect",
    "collect_apt_history",
    "collect_device_users",
    "collect_dkms_status",
    "collect_dpkg_lock",
    "collect_kernel_log",
    "collect_nvml",
    "collect_packages",
    "collect_secure_boot",
    "collect_system",
    "collect_unattended",
    "filter_kernel_log_lines",
    "find_nvidia_module",
    "kern_log_since_boot",
    "kernel_flavour",
    "lock_state",
    "main",
    "module_signed",
    "module_source",
    "module_version",
    "parse_apt_config_dump",
    "parse_dpkg_status",
    "parse_mokutil_sb_state",
    "parse_os_release",
    "parse_secure_boot_efivar",
    "parse_unattended_dry_run",
    "run_command",
    "select_history_stanzas",
    "serve_pynvml",
    "simulate_upgrades",
    "split_history_stanzas",
    "unattended_from_config",
    "upstream_version",
    "would_load",
    "write_atomic",
]

#: The names :mod:`.prom` lends the package, imported on first use: the probe's own run never needs them (not in
#: ``__all__``, which names what the package itself defines).
_PROM_NAMES = frozenset(
    ("PROM_METRICS", "prom_escape_help", "prom_escape_label", "prom_number", "render_families", "render_prometheus",
     "render_textfile")
)


def __getattr__(name):
    # type: (str) -> object
    if name in _PROM_NAMES:
        import importlib

        return getattr(importlib.import_module(__name__ + ".prom"), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
