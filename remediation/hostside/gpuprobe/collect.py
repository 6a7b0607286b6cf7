"""Assembly: every section into the facts document, a failing section becoming an entry in ``errors``."""

import contextlib
import os
import sys
import time

from .common import PROBE_VERSION, SCHEMA, Options, _read_text, _utc_iso
from .devices import collect_device_users
from .history import collect_apt_history
from .kernellog import collect_kernel_log
from .locks import collect_dkms_status, collect_dpkg_lock
from .modules import collect_secure_boot
from .nvml import _empty_nvml, collect_nvml
from .packages import _is_installed, collect_packages, parse_dpkg_status
from .system import collect_system
from .unattended import collect_unattended

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Callable, Dict, List, Optional  # noqa: F401 - type comments


def collect(options=None):
    # type: (Any) -> Dict[str, Any]
    """Collect every section; the returned dict is the facts document.  ``options`` is an
    :class:`Options`, a mapping of its fields (the Ansible module passes its params), or None."""
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        options = Options.from_mapping(options)
    started = time.monotonic()
    errors = []  # type: List[Dict[str, str]]
    doc = {
        "schema": SCHEMA,
        "probe_version": PROBE_VERSION,
        "collected_at": _utc_iso(time.time()),
        "duration_ms": None,
        "hostname": os.uname().nodename,  # what socket.gethostname() returns
        "python": "%d.%d.%d" % sys.version_info[:3],
        # Who ran the probe: not 0 means other users' /proc/<pid>/fd were unreadable (no sudo): device users unknown.
        "euid": os.geteuid(),
    }  # type: Dict[str, Any]

    def section(name, fn, *args):
        # type: (str, Callable[..., Any], Any) -> Any
        try:
            return fn(*args)
        except Exception as exc:  # a broken section is data, the rest goes on
            import traceback  # only when a section fails

            errors.append(
                {"section": name, "error": "%s: %s" % (type(exc).__name__, exc), "trace": traceback.format_exc(limit=3)}
            )
            return None

    # NVML first: the fork happens while this process is still single-threaded and small.
    if options.skip_nvml:
        doc["nvml"] = _empty_nvml("other", "NVML not probed (--skip-nvml)")
    else:
        doc["nvml"] = section("nvml", collect_nvml, options.nvml_timeout)
        if doc["nvml"] is None:
            doc["nvml"] = _empty_nvml("other", "NVML section failed: %s" % errors[-1]["error"])
    doc["system"] = section("system", collect_system, options)
    doc["secure_boot"] = section("secure_boot", collect_secure_boot, options)
    dpkg_entries = None  # type: Optional[List[Dict[str, str]]]
    with contextlib.suppress(IOError, OSError):  # unreadable: the packages section reads it again and says why
        dpkg_entries = parse_dpkg_status(_read_text(options.path("/var/lib/dpkg/status")))
    secure_boot_enabled = (doc["secure_boot"] or {}).get("enabled")
    doc["packages"] = section("packages", collect_packages, options, secure_boot_enabled, dpkg_entries)
    installed = {e["Package"]: e for e in dpkg_entries or () if _is_installed(e) and "Package" in e}
    doc["unattended_upgrades"] = section("unattended_upgrades", collect_unattended, options, installed)
    doc["apt_history"] = section("apt_history", collect_apt_history, options)
    boot_time = (doc.get("system") or {}).get("boot_time")
    doc["kernel_log"] = section("kernel_log", collect_kernel_log, options, boot_time)
    doc["dkms_status"] = section("dkms_status", collect_dkms_status, options)
    doc["dpkg_lock"] = section("dpkg_lock", collect_dpkg_lock, options)
    doc["device_users"] = section("device_users", collect_device_users, options)
    doc["errors"] = errors
    doc["duration_ms"] = int((time.monotonic() - started) * 1000)
    return doc
