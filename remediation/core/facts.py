"""Host facts: the probe's JSON document (schema ``gpufleet.facts/1``) as frozen dataclasses.

:func:`facts_from_dict` is the one boundary: it checks the schema version, turns every section into typed
values and runs the raw text sections (kernel log lines, apt history stanzas, ``dkms status``) through the
field-text parsers, so checks never see a dict.  The original document stays available as ``HostFacts.raw`` for
JSON output.  A section the probe could not collect (``null`` in the document, with an entry in ``errors``)
becomes that section's *unavailable* value (``available=False`` or empty), never a crash.

See docs/facts-schema.md for every field.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from remediation.core.errors import ProbeError
from remediation.core.parsers import apt_history as _apt_history
from remediation.core.parsers import dkms as _dkms
from remediation.core.parsers import kernel_log as _kernel_log
from remediation.core.parsers import nvml_text as _nvml_text
from remediation.core.parsers.apt_history import AptHistory, AptTransaction
from remediation.core.parsers.dkms import Dkms
from remediation.core.parsers.kernel_log import KernelLog
from remediation.hostside.gpuprobe import kernel_flavour as flavour_of

__all__ = [
    "SCHEMA_MAJOR",
    "SCHEMA_PREFIX",
    "DkmsTreeEntry",
    "DpkgLock",
    "EccCounts",
    "GpuFacts",
    "HostFacts",
    "KernelPackage",
    "MemoryInfo",
    "NvidiaModule",
    "NvmlFacts",
    "PackagesFacts",
    "ProbeSectionError",
    "ProcessInfo",
    "RemappedRows",
    "RetiredPages",
    "SecureBootFacts",
    "SystemFacts",
    "TemperatureThresholds",
    "UnattendedUpgradesFacts",
    "WouldUpgrade",
    "facts_from_dict",
]

SCHEMA_PREFIX = "gpufleet.facts/"
SCHEMA_MAJOR = 1

# The classes field text can show (diagnose's contract) plus the two only a live probe sees.
NVML_ERROR_CLASSES = frozenset(_nvml_text.ERROR_CLASSES) | {"timeout", "other"}


# --- system -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemFacts:
    """The booted system: ``kernel`` is ``uname -r`` of the running kernel."""

    kernel: str | None
    boot_id: str | None
    boot_time: _dt.datetime | None
    os_id: str | None
    os_version_id: str | None
    os_pretty_name: str | None
    reboot_required: bool
    reboot_required_pkgs: tuple[str, ...]
    kernel_flavour: str | None = None  # the booted kernel's flavour (``azure``, ``generic``), from ``uname -r``


@dataclass(frozen=True)
class SecureBootFacts:
    """Secure Boot on the host: ``enabled`` None when it cannot be told. ``source``: ``efivars`` (the SecureBoot EFI
    variable), ``mokutil`` (``mokutil --sb-state``), ``no-efi`` (a BIOS boot has no Secure Boot), or None."""

    enabled: bool | None = None
    source: str | None = None
    error: str | None = None

    @property
    def state(self) -> str:
        return "unknown" if self.enabled is None else ("enabled" if self.enabled else "disabled")


# --- NVML -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryInfo:
    """Framebuffer memory in bytes."""

    total: int
    used: int
    free: int

    @property
    def used_pct(self) -> float:
        return 100.0 * self.used / self.total if self.total else 0.0


@dataclass(frozen=True)
class TemperatureThresholds:
    """NVML temperature thresholds in °C; None where the GPU does not support one."""

    shutdown: int | None = None
    slowdown: int | None = None
    gpu_max: int | None = None
    mem_max: int | None = None


@dataclass(frozen=True)
class EccCounts:
    corrected: int | None = None
    uncorrected: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    single_bit: int | None
    double_bit: int | None
    pending: bool | None

    @property
    def total(self) -> int:
        return (self.single_bit or 0) + (self.double_bit or 0)


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory: int | None
    name: str | None


@dataclass(frozen=True)
class GpuFacts:
    """One GPU.  ``ok`` False: the GPU is lost or has no handle, and only ``index``/``error*`` are meaningful."""

    index: int
    ok: bool
    error_class: str
    error: str | None = None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    memory: MemoryInfo | None = None
    temperature_c: int | None = None
    thresholds: TemperatureThresholds = TemperatureThresholds()
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    clocks_mhz: tuple[tuple[str, int | None], ...] = ()
    max_clocks_mhz: tuple[tuple[str, int | None], ...] = ()
    clocks_event_mask: int | None = None
    clocks_event_reasons: tuple[str, ...] = ()
    ecc_mode: bool | None = None
    ecc_volatile: EccCounts = EccCounts()
    ecc_aggregate: EccCounts = EccCounts()
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    persistence_mode: bool | None = None
    pstate: int | None = None
    processes: tuple[ProcessInfo, ...] = ()
    field_errors: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """``GPU 0 (00000001:00:00.0)`` for evidence lines."""
        return f"GPU {self.index} ({self.pci_bus_id})" if self.pci_bus_id else f"GPU {self.index}"


@dataclass(frozen=True)
class NvmlFacts:
    """What NVML said.  ``error_class`` is one of :data:`NVML_ERROR_CLASSES`."""

    ok: bool
    error_class: str
    error: str | None
    error_code: int | None
    driver_version: str | None
    cuda_driver_version: int | None
    nvml_version: str | None
    device_count: int | None
    gpus: tuple[GpuFacts, ...]
    child_reaped: bool | None = None
    elapsed_ms: int | None = None

    @property
    def failed(self) -> bool:
        return not self.ok


# --- packages -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NvidiaModule:
    """The NVIDIA module modprobe would load for one kernel (DKMS's ``updates/dkms`` first, as depmod searches).

    ``source``: ``dkms`` | ``package`` (the kernel's own tree: a precompiled package) | ``other`` | None (no
    module). ``signed``: the file ends with the kernel's signature magic (None: unreadable,
    or a ``.ko.zst`` the host has neither zstd nor modinfo to read).
    ``would_load``: the kernel would load it under the host's Secure Boot state (None: cannot be told).
    """

    present: bool
    version: str | None
    path: str | None
    source: str | None = None
    signed: bool | None = None
    would_load: bool | None = None

    @property
    def rejected_by_secure_boot(self) -> bool:
        """Present, and Secure Boot would refuse it (unsigned)."""
        return self.present and self.would_load is False


@dataclass(frozen=True)
class DkmsTreeEntry:
    """A DKMS tree entry for one kernel (from /var/lib/dkms): state ``installed``, ``built`` or ``added``."""

    module: str
    version: str
    state: str


@dataclass(frozen=True)
class KernelPackage:
    """One installed ``linux-image-<release>`` and whether an NVIDIA module exists for it."""

    release: str
    image_package: str
    image_version: str | None
    headers_installed: bool
    modules_installed: bool
    nvidia_module: NvidiaModule
    dkms: tuple[DkmsTreeEntry, ...] = ()
    flavour: str | None = None
    signed_module_packages: tuple[str, ...] = ()  # installed linux-modules-nvidia-<branch>-<release>

    @property
    def has_nvidia_module(self) -> bool:
        return self.nvidia_module.present

    @property
    def module_usable(self) -> bool | None:
        """A module exists and the kernel would load it (None: whether it loads cannot be told)."""
        if not self.nvidia_module.present:
            return False
        return self.nvidia_module.would_load


@dataclass(frozen=True)
class PackagesFacts:
    available: bool
    kernels: tuple[KernelPackage, ...] = ()
    kernel_meta: tuple[tuple[str, str], ...] = ()
    held: frozenset[str] = frozenset()
    nvidia: tuple[tuple[str, str], ...] = ()
    driver_package: str | None = None
    driver_package_version: str | None = None
    driver_branch: str | None = None
    error: str | None = None

    def kernel(self, release: str | None) -> KernelPackage | None:
        for kernel in self.kernels:
            if kernel.release == release:
                return kernel
        return None

    @property
    def kernel_meta_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.kernel_meta)

    @property
    def nvidia_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.nvidia)


# --- unattended-upgrades, lock, errors ----------------------------------------------------------------------


@dataclass(frozen=True)
class WouldUpgrade:
    """``unattended-upgrade --dry-run -d``, when the probe ran it (``--simulate-upgrades``)."""

    ran: bool
    upgrade: tuple[str, ...]
    blacklisted: tuple[str, ...]
    held: tuple[str, ...]
    error: str | None


@dataclass(frozen=True)
class UnattendedUpgradesFacts:
    """The effective apt configuration as ``apt-config dump`` prints it."""

    installed: bool
    enabled: bool
    package_blacklist: tuple[str, ...] = ()
    package_whitelist: tuple[str, ...] = ()
    origins_pattern: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    automatic_reboot: bool | None = None
    would_upgrade: WouldUpgrade | None = None
    error: str | None = None
    available: bool = True


@dataclass(frozen=True)
class DpkgLock:
    held: bool | None
    holder_pid: int | None
    holder_comm: str | None


@dataclass(frozen=True)
class DeviceUser:
    """A process holding NVIDIA device files open (``/dev/nvidia*``), read from ``/proc`` without NVML."""

    pid: int
    comm: str | None  # /proc/<pid>/comm: at most 15 characters ("nvidia-persiste")
    devices: tuple[str, ...]
    gpus: tuple[int, ...]
    service: bool  # a driver service (persistenced, fabric manager, DCGM) by its executable, not a workload
    exe: str | None = None  # basename of the executable (exe link, else argv[0]); None: unknown or an older probe

    @property
    def label(self) -> str:
        where = ", ".join(f"GPU {g}" for g in self.gpus) or ", ".join(self.devices)
        return f"pid {self.pid} ({self.comm or self.exe or '?'}) holds {where}"


@dataclass(frozen=True)
class DeviceUsers:
    users: tuple[DeviceUser, ...] = ()
    available: bool = False  # False: the probe did not read /proc (older probe, section failed)
    unreadable: int = 0  # processes whose descriptors the probe was not allowed to read (a probe without root)

    @property
    def workloads(self) -> tuple[DeviceUser, ...]:
        """The processes that are GPU work, not driver services."""
        return tuple(u for u in self.users if not u.service)


@dataclass(frozen=True)
class ProbeSectionError:
    section: str
    error: str


# --- the host -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    """Everything one probe run said about one host."""

    host: str
    schema: str
    probe_version: str | None
    collected_at: _dt.datetime | None
    duration_ms: int | None
    hostname: str | None
    system: SystemFacts
    nvml: NvmlFacts
    packages: PackagesFacts
    unattended_upgrades: UnattendedUpgradesFacts
    apt_history_text: str
    apt_history: AptHistory
    kernel_log_source: str | None
    kernel_log_lines: tuple[str, ...]
    kernel_log: KernelLog
    dkms_status: str | None
    dkms: Dkms | None
    dpkg_lock: DpkgLock
    errors: tuple[ProbeSectionError, ...]
    raw: Mapping[str, Any] = field(compare=False, hash=False, repr=False)
    device_users: DeviceUsers = DeviceUsers()
    secure_boot: SecureBootFacts = SecureBootFacts()
    euid: int | None = None  # who ran the probe (None: an older probe); not 0: it ran without privilege escalation

    @property
    def unprivileged(self) -> bool:
        """The probe ran as a user other than root (no ``sudo``): it could not read other users' processes."""
        return self.euid is not None and self.euid != 0

    @property
    def apt_transactions(self) -> tuple[AptTransaction, ...]:
        """The parsed history.log stanzas, oldest first (dry runs included; see ``AptTransaction.dry_run``)."""
        return self.apt_history.transactions

    @property
    def booted_kernel(self) -> KernelPackage | None:
        """The installed kernel package of the running kernel, or None (not a dpkg-installed kernel)."""
        return self.packages.kernel(self.system.kernel)


# --- parsing --------------------------------------------------------------------------------------------------

#: Integers beyond this are no counter, size or index a probe reports: a corrupt document, refused as a field error
#: (so a check's arithmetic never meets a number float() cannot hold).
_INT_LIMIT = 2**63
_SHOWN = 80  # characters of a bad value quoted in an error


def _shown(value: Any) -> str:
    """A short repr of an untrusted value for an error message (never raises, never floods the report)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print
        return f"<{type(value).__name__}>"
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _plain(value: Any) -> str:
    """``str(value)`` for a scalar of the document, bounded (huge ints and nested values never raise)."""
    return value if isinstance(value, str) else _shown(value)


class _Reader:
    """Typed access to one section of one host's document; errors name the host and the field."""

    def __init__(self, host: str, where: str, data: Any) -> None:
        if data is not None and not isinstance(data, Mapping):
            raise ProbeError(f"host {host}: facts field {where!r} must be an object, got {type(data).__name__}")
        self.host = host
        self.where = where
        self.data: Mapping[str, Any] = data or {}

    def _fail(self, key: str, expected: str, value: Any) -> ProbeError:
        return ProbeError(f"host {self.host}: facts field '{self.where}.{key}' must be {expected}, got {_shown(value)}")

    def opt_str(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None or isinstance(value, str):
            return value
        raise self._fail(key, "a string or null", value)

    def opt_int(self, key: str) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) < _INT_LIMIT:
                return int(value)
            raise self._fail(key, "an integer or null", value)
        if abs(value) >= _INT_LIMIT:
            raise self._fail(key, "an integer below 2**63", value)
        return value

    def opt_float(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, "a number or null", value)
        if abs(value) >= _INT_LIMIT if isinstance(value, int) else not math.isfinite(value):
            raise self._fail(key, "a finite number or null", value)
        return float(value)

    def opt_bool(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise self._fail(key, "true, false or null", value)

    def flag(self, key: str) -> bool:
        return bool(self.opt_bool(key))

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "a list of strings", value)
        return tuple(value)

    def objects(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._fail(key, "a list", value)
        return value

    def pairs(self, key: str) -> tuple[tuple[str, str], ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise self._fail(key, "an object of name: version", value)
        return tuple(sorted((str(k), "" if v is None else _plain(v)) for k, v in value.items()))

    def messages(self, key: str) -> tuple[tuple[str, str], ...]:
        """An object of ``name: message`` (``{}`` or null: none), sorted by name."""
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise self._fail(key, "an object of name: message", value)
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))

    def sub(self, key: str) -> _Reader:
        return _Reader(self.host, f"{self.where}.{key}", self.data.get(key))

    def present(self, key: str) -> bool:
        return self.data.get(key) is not None


def _iso(value: str | None) -> _dt.datetime | None:
    if not value:
        return None
    try:
        stamp = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.UTC)


def _schema_major(host: str, schema: Any) -> int:
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise ProbeError(f"host {host}: not a gpufleet facts document (schema {schema!r})")
    version = schema[len(SCHEMA_PREFIX) :]
    major = version.split(".", 1)[0]
    if not major.isdigit():
        raise ProbeError(f"host {host}: unreadable facts schema version {schema!r}")
    return int(major)


def _system(r: _Reader) -> SystemFacts:
    os_release = r.sub("os_release")
    return SystemFacts(
        kernel=r.opt_str("kernel"),
        boot_id=r.opt_str("boot_id"),
        boot_time=_iso(r.opt_str("boot_time")),
        os_id=os_release.opt_str("ID"),
        os_version_id=os_release.opt_str("VERSION_ID"),
        os_pretty_name=os_release.opt_str("PRETTY_NAME"),
        reboot_required=r.flag("reboot_required"),
        reboot_required_pkgs=r.strings("reboot_required_pkgs"),
        kernel_flavour=r.opt_str("kernel_flavour") or flavour_of(r.opt_str("kernel")),
    )


def _secure_boot(r: _Reader) -> SecureBootFacts:
    if not r.data:
        return SecureBootFacts(error="section missing (older probe, or the section failed)")
    return SecureBootFacts(enabled=r.opt_bool("enabled"), source=r.opt_str("source"), error=r.opt_str("error"))


def _clock_pairs(r: _Reader, key: str) -> tuple[tuple[str, int | None], ...]:
    sub = r.sub(key)
    return tuple((name, sub.opt_int(name)) for name in sorted(sub.data))


def _gpu(r: _Reader) -> GpuFacts:
    index = r.opt_int("index")
    if index is None:
        raise r._fail("index", "an integer", None)
    error_class = r.opt_str("error_class") or ("none" if r.flag("ok") else "other")
    if not r.flag("ok"):
        return GpuFacts(index=index, ok=False, error_class=error_class, error=r.opt_str("error"))
    mem = r.sub("memory")
    memory = (
        MemoryInfo(total=mem.opt_int("total") or 0, used=mem.opt_int("used") or 0, free=mem.opt_int("free") or 0)
        if r.present("memory")
        else None
    )
    th = r.sub("temperature_thresholds_c")
    util = r.sub("utilization")
    reasons = r.sub("clocks_event_reasons")
    ecc = r.sub("ecc")
    retired = r.sub("retired_pages")
    remap = r.sub("remapped_rows")
    processes = []
    for i, item in enumerate(r.objects("processes")):
        p = _Reader(r.host, f"{r.where}.processes[{i}]", item)
        pid = p.opt_int("pid")
        if pid is None:
            raise p._fail("pid", "an integer", None)
        processes.append(ProcessInfo(pid=pid, used_memory=p.opt_int("used_memory"), name=p.opt_str("name")))
    return GpuFacts(
        index=index,
        ok=True,
        error_class=error_class,
        error=r.opt_str("error"),
        name=r.opt_str("name"),
        uuid=r.opt_str("uuid"),
        pci_bus_id=r.opt_str("pci_bus_id"),
        serial=r.opt_str("serial"),
        memory=memory,
        temperature_c=r.opt_int("temperature_c"),
        thresholds=TemperatureThresholds(
            shutdown=th.opt_int("shutdown"),
            slowdown=th.opt_int("slowdown"),
            gpu_max=th.opt_int("gpu_max"),
            mem_max=th.opt_int("mem_max"),
        ),
        power_w=r.opt_float("power_w"),
        power_limit_w=r.opt_float("power_limit_w"),
        utilization_gpu=util.opt_int("gpu"),
        utilization_memory=util.opt_int("memory"),
        clocks_mhz=_clock_pairs(r, "clocks_mhz"),
        max_clocks_mhz=_clock_pairs(r, "max_clocks_mhz"),
        clocks_event_mask=reasons.opt_int("mask"),
        clocks_event_reasons=reasons.strings("active"),
        ecc_mode=ecc.opt_bool("mode"),
        ecc_volatile=EccCounts(ecc.sub("volatile").opt_int("corrected"), ecc.sub("volatile").opt_int("uncorrected")),
        ecc_aggregate=EccCounts(ecc.sub("aggregate").opt_int("corrected"), ecc.sub("aggregate").opt_int("uncorrected")),
        retired_pages=(
            RetiredPages(retired.opt_int("single_bit"), retired.opt_int("double_bit"), retired.opt_bool("pending"))
            if r.present("retired_pages")
            else None
        ),
        remapped_rows=(
            RemappedRows(
                correctable=remap.opt_int("correctable") or 0,
                uncorrectable=remap.opt_int("uncorrectable") or 0,
                pending=remap.flag("pending"),
                failure=remap.flag("failure"),
            )
            if r.present("remapped_rows")
            else None
        ),
        persistence_mode=r.opt_bool("persistence_mode"),
        pstate=r.opt_int("pstate"),
        processes=tuple(processes),
        field_errors=r.messages("field_errors"),
    )


def _nvml(r: _Reader) -> NvmlFacts:
    if not r.data:
        return NvmlFacts(False, "other", "NVML section missing from the probe output", None, None, None, None, None, ())
    ok = r.flag("ok")
    error_class = r.opt_str("error_class") or ("none" if ok else "other")
    if error_class not in NVML_ERROR_CLASSES:
        error_class = "other"
    if ok and error_class != "none":
        ok = False
    if not ok and error_class == "none":
        error_class = "other"
    gpus = tuple(_gpu(_Reader(r.host, f"nvml.gpus[{i}]", g)) for i, g in enumerate(r.objects("gpus")))
    return NvmlFacts(
        ok=ok,
        error_class=error_class,
        error=r.opt_str("error"),
        error_code=r.opt_int("error_code"),
        driver_version=r.opt_str("driver_version"),
        cuda_driver_version=r.opt_int("cuda_driver_version"),
        nvml_version=r.opt_str("nvml_version"),
        device_count=r.opt_int("device_count"),
        gpus=gpus,
        child_reaped=r.opt_bool("child_reaped"),
        elapsed_ms=r.opt_int("elapsed_ms"),
    )


def _kernel(r: _Reader) -> KernelPackage:
    release = r.opt_str("release")
    image_package = r.opt_str("image_package")
    if not release or not image_package:
        raise r._fail("release", "a kernel release with its image package", release)
    module = r.sub("nvidia_module")
    dkms = []
    for i, item in enumerate(r.objects("dkms")):
        d = _Reader(r.host, f"{r.where}.dkms[{i}]", item)
        dkms.append(DkmsTreeEntry(d.opt_str("module") or "", d.opt_str("version") or "", d.opt_str("state") or ""))
    return KernelPackage(
        release=release,
        image_package=image_package,
        image_version=r.opt_str("image_version"),
        headers_installed=r.flag("headers_installed"),
        modules_installed=r.flag("modules_installed"),
        nvidia_module=NvidiaModule(
            present=module.flag("present"),
            version=module.opt_str("version"),
            path=module.opt_str("path"),
            source=module.opt_str("source"),
            signed=module.opt_bool("signed"),
            would_load=(
                module.opt_bool("would_load") if "would_load" in module.data
                else (None if module.flag("present") else False)
            ),
        ),
        dkms=tuple(dkms),
        flavour=r.opt_str("flavour") or flavour_of(release),
        signed_module_packages=r.strings("signed_module_packages"),
    )


def _packages(r: _Reader) -> PackagesFacts:
    if not r.data or not r.flag("available"):
        return PackagesFacts(available=False, error=r.opt_str("error") or "package database not read")
    kernels = tuple(_kernel(_Reader(r.host, f"packages.kernels[{i}]", k)) for i, k in enumerate(r.objects("kernels")))
    return PackagesFacts(
        available=True,
        kernels=kernels,
        kernel_meta=r.pairs("kernel_meta"),
        held=frozenset(r.strings("held")),
        nvidia=r.pairs("nvidia"),
        driver_package=r.opt_str("driver_package"),
        driver_package_version=r.opt_str("driver_package_version"),
        driver_branch=r.opt_str("driver_branch"),
        error=r.opt_str("error"),
    )


def _unattended(r: _Reader) -> UnattendedUpgradesFacts:
    if not r.data:
        return UnattendedUpgradesFacts(installed=False, enabled=False, available=False, error="section missing")
    would = None
    if r.present("would_upgrade"):
        w = r.sub("would_upgrade")
        would = WouldUpgrade(
            ran=w.flag("ran"),
            upgrade=w.strings("upgrade"),
            blacklisted=w.strings("blacklisted"),
            held=w.strings("held"),
            error=w.opt_str("error"),
        )
    return UnattendedUpgradesFacts(
        installed=r.flag("installed"),
        enabled=r.flag("enabled"),
        package_blacklist=r.strings("package_blacklist"),
        package_whitelist=r.strings("package_whitelist"),
        origins_pattern=r.strings("origins_pattern"),
        allowed_origins=r.strings("allowed_origins"),
        automatic_reboot=r.opt_bool("automatic_reboot"),
        would_upgrade=would,
        error=r.opt_str("error"),
        available=r.opt_str("error") is None,
    )


def _device_users(r: _Reader, present: bool) -> DeviceUsers:
    users = []
    for i, item in enumerate(r.objects("users")):
        u = _Reader(r.host, f"{r.where}.users[{i}]", item)
        pid = u.opt_int("pid")
        if pid is None:
            continue
        users.append(
            DeviceUser(
                pid=pid,
                comm=u.opt_str("comm"),
                devices=u.strings("devices"),
                gpus=tuple(int(g) for g in u.objects("gpus") if isinstance(g, int) and not isinstance(g, bool)),
                service=bool(u.opt_bool("service")),
                exe=u.opt_str("exe"),
            )
        )
    unreadable = r.opt_int("unreadable")
    return DeviceUsers(tuple(users), available=present, unreadable=max(unreadable or 0, 0))


def _dpkg_lock(r: _Reader) -> DpkgLock:
    return DpkgLock(held=r.opt_bool("held"), holder_pid=r.opt_int("holder_pid"), holder_comm=r.opt_str("holder_comm"))


def _errors(host: str, value: Any) -> tuple[ProbeSectionError, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ProbeError(f"host {host}: facts field 'errors' must be a list, got {_shown(value)}")
    out = []
    for item in value:
        if isinstance(item, Mapping):
            out.append(ProbeSectionError(_plain(item.get("section", "?")), _plain(item.get("error", ""))))
        else:
            out.append(ProbeSectionError("?", _plain(item)))
    return tuple(out)


def facts_from_dict(d: Mapping[str, Any], host: str | None = None) -> HostFacts:
    """The probe's JSON document -> :class:`HostFacts`.

    ``host`` is the inventory name of the host (defaults to the document's ``hostname``); every finding is
    keyed by it.  Raises :class:`~remediation.core.errors.ProbeError` naming the host for a document that is not a
    facts document, whose schema major version is not :data:`SCHEMA_MAJOR`, or whose fields have the wrong
    types.  Newer minor versions (``gpufleet.facts/1.3``) are accepted: unknown fields are ignored.
    """
    if not isinstance(d, Mapping):
        raise ProbeError(f"host {host or '?'}: probe output is not a JSON object")
    hostname = d.get("hostname") if isinstance(d.get("hostname"), str) else None
    name = host or hostname or "?"
    major = _schema_major(name, d.get("schema"))
    if major != SCHEMA_MAJOR:
        raise ProbeError(
            f"host {name}: facts schema {d.get('schema')!r} is version {major}; this controller reads "
            f"{SCHEMA_PREFIX}{SCHEMA_MAJOR} (update the controller or the probe)"
        )
    top = _Reader(name, "$", d)
    kernel_log_section = top.sub("kernel_log")
    kernel_log_lines = kernel_log_section.strings("lines")
    history = top.sub("apt_history")
    history_text = history.opt_str("text") or ""
    dkms = d.get("dkms_status")
    dkms_text = top.sub("dkms_status").opt_str("output") if isinstance(dkms, Mapping) else top.opt_str("dkms_status")
    return HostFacts(
        host=name,
        schema=str(d["schema"]),
        probe_version=top.opt_str("probe_version"),
        collected_at=_iso(top.opt_str("collected_at")),
        duration_ms=top.opt_int("duration_ms"),
        hostname=hostname,
        system=_system(top.sub("system")),
        nvml=_nvml(top.sub("nvml")),
        packages=_packages(top.sub("packages")),
        unattended_upgrades=_unattended(top.sub("unattended_upgrades")),
        apt_history_text=history_text,
        apt_history=_apt_history.parse(history_text),
        kernel_log_source=kernel_log_section.opt_str("source"),
        kernel_log_lines=kernel_log_lines,
        kernel_log=_kernel_log.parse("\n".join(kernel_log_lines)),
        dkms_status=dkms_text,
        dkms=_dkms.parse(dkms_text) if dkms_text else None,
        dpkg_lock=_dpkg_lock(top.sub("dpkg_lock")),
        errors=_errors(name, d.get("errors")),
        raw=d,
        # An unprivileged probe sees only its own user's processes: which processes hold the GPU is unknown then.
        device_users=_device_users(top.sub("device_users"),
                                   isinstance(d.get("device_users"), Mapping) and top.opt_int("euid") in (None, 0)),
        euid=top.opt_int("euid"),
        secure_boot=_secure_boot(top.sub("secure_boot")),
    )
