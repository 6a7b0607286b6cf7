"""The one typed config layer: each section of ``invoke.yaml`` is a frozen dataclass.

Invoke merges, lowest first: the defaults that ``tasks.py`` registers with ``ns.configure`` (built here from the
dataclasses' own defaults, so a default is written once), the project's ``invoke.yaml``, the user's and system
config files, ``INVOKE_*`` variables. A task flag wins over all of them. The task edge turns the merged mapping of
a section into its dataclass with :func:`load_section`; the library only ever sees the dataclass, never Invoke's
context.

A section that is not right fails with one line that names the setting and the fix (an unknown key lists the known
ones; a value of the wrong type says which type). Each area keeps its own settings class in its own package
(``remediation.<area>``) and passes it to :func:`load_section` and :func:`defaults` the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from remediation.core.errors import UsageError
from remediation.core.exitcodes import ExitCode

__all__ = [
    "POSITIVE",
    "AnsibleSettings",
    "AuditSettings",
    "FleetSpec",
    "KernelUpdateSettings",
    "RemediateSettings",
    "RestoreSettings",
    "check_config_file",
    "defaults",
    "fleets_from_mapping",
    "load_section",
    "positive",
]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(value: Any, kind: Any, where: str) -> Any:
    """``value`` as ``kind`` (int, float, str, bool, Path, ``X | None``, ``tuple[X, ...]``, ``dict[str, X]``)."""
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, options[0], where)
    if origin is tuple:
        (item, *_rest) = typing.get_args(kind)
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list | tuple):
            raise UsageError(f"{where} must be a list, got {value!r}")
        return tuple(_coerce(v, item, where) for v in value)
    if origin is dict:
        if _is_proxy(value):  # a nested section as Invoke hands it over (its DataProxy is not a Mapping)
            value = _plain(value)
        if not isinstance(value, Mapping):
            raise UsageError(f"{where} must be a mapping, got {value!r}")
        return _plain(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise UsageError(f"{where} must be true or false, got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise UsageError(f"{where} must be a number, got {value!r}")
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise UsageError(f"{where} must be a number, got {value!r}") from None
    if kind is str:
        if isinstance(value, Mapping | list):
            raise UsageError(f"{where} must be a string, got {value!r}")
        return str(value)
    if kind is Path:
        return Path(str(value))
    return value


def _is_proxy(value: Any) -> bool:
    """Invoke's DataProxy (a config mapping that is not a :class:`Mapping`)."""
    keys = getattr(value, "keys", None)
    return callable(keys) and hasattr(value, "__getitem__") and not isinstance(value, str | bytes | Mapping)


def _plain(value: Any) -> Any:
    """``value`` with every nested mapping (Invoke's proxies included) a plain dict and every list a list."""
    if isinstance(value, Mapping) or _is_proxy(value):
        return {key: _plain(value[key]) for key in list(value.keys())}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


#: ``field(metadata=POSITIVE)``: :func:`load_section` refuses a value that is not a finite number above 0.
POSITIVE: Mapping[str, Any] = types.MappingProxyType({"positive": True})


def positive(value: Any, kind: type[int] | type[float], what: str) -> int | float:
    """``value`` as a finite ``kind`` above 0, or :class:`UsageError` naming ``what`` (a flag or a setting)."""
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{what} {value!r}: give a number above 0") from None
    if not math.isfinite(number) or number <= 0:
        raise UsageError(f"{what} {value!r}: give a number above 0")
    return number


def _mapping(data: Any, where: str, source: str) -> dict[str, Any]:
    """``data`` (a mapping, Invoke's config proxy, or nothing) as a dict; anything else is a wrong shape."""
    if data is None:
        return {}
    if isinstance(data, Mapping):
        return dict(data)
    keys = getattr(data, "keys", None)
    if callable(keys) and hasattr(data, "__getitem__") and not isinstance(data, str | bytes):  # Invoke's DataProxy
        return {key: data[key] for key in keys()}
    raise UsageError(f"setting {where} must be a mapping of settings (key: value), not {data!r} (in {source})")


def load_section(cls: type[T], data: Mapping[str, Any] | None, name: str, source: str = "invoke.yaml") -> T:
    """The ``name:`` section of the config as ``cls`` (a dataclass); missing keys take the dataclass defaults.

    Raises :class:`~remediation.core.errors.UsageError` naming ``name.key`` and ``source`` (the config file that set the
    section) for a section that is not a mapping, an unknown key, a value of the wrong type or, for a field marked
    :data:`POSITIVE`, a number not above 0.
    """
    data = _mapping(data, name, source)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UsageError(
            f"unknown setting {name}.{unknown[0]} in {source}; known {name} settings: {', '.join(sorted(fields))}"
        )
    values = {}
    for key, value in data.items():
        where = f"setting {name}.{key}"
        try:
            values[key] = _coerce(value, hints[key], where)
            if fields[key].metadata.get("positive") and values[key] is not None:  # ``X | None``: None stays
                kind = next(a for a in typing.get_args(hints[key]) or (hints[key],) if a is not type(None))
                values[key] = positive(values[key], kind, where)
        except UsageError as exc:
            raise UsageError(f"{exc} (in {source})") from None
    return cls(**values)


def check_config_file(path: Path, sections: Iterable[str] = ()) -> None:
    """A config file Invoke is about to load: valid YAML, a mapping at the top, each of ``sections`` a mapping.

    Raises :class:`UsageError` with one line naming the file, the place and the fix. A missing file is fine.
    """
    import yaml

    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"config file {path} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"config file {path} is not valid YAML ({_yaml_where(exc)}); fix its syntax") from None
    if data is None:
        return
    if not isinstance(data, Mapping):
        raise UsageError(f"config file {path} must be a mapping of sections (fleets:, audit:, ...), not {data!r:.60}")
    for name in sections:
        if name in data and not isinstance(data[name], Mapping):
            raise UsageError(
                f"setting {name} must be a mapping of settings (key: value), not {data[name]!r:.60} (in {path})"
            )


def _yaml_where(exc: Exception) -> str:
    """``line L, column C: problem`` of a YAML error, on one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def defaults(cls: type[Any]) -> dict[str, Any]:
    """The dataclass's defaults as a plain mapping, for ``ns.configure`` (paths and tuples made YAML-like)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


@dataclass(frozen=True)
class FleetSpec:
    """One entry of ``fleets:``: where its inventory is and which group in it is the fleet."""

    name: str
    inventory: str = "inventories/lab/hosts.yml"
    group: str = ""

    @property
    def group_name(self) -> str:
        return self.group or self.name


def fleets_from_mapping(data: Mapping[str, Any] | None, source: str = "invoke.yaml") -> dict[str, FleetSpec]:
    """``fleets:`` as ``{name: FleetSpec}``; a wrong shape is a :class:`UsageError` naming the key and ``source``."""
    out: dict[str, FleetSpec] = {}
    for name, spec in _mapping(data, "fleets", source).items():
        if spec is None:
            raise UsageError(f"setting fleets.{name} must be a mapping with inventory: and group: (in {source})")
        spec = _mapping(spec, f"fleets.{name}", source)
        fleet = load_section(FleetSpec, {"name": str(name), **spec}, f"fleets.{name}", source)
        out[str(name)] = fleet
    return out


@dataclass(frozen=True)
class AnsibleSettings:
    """``ansible:``: where the playbook runs (harden, driver-restore, kernel-update) find ``gpufleet.remediation``.

    ``collections_path``: collection directories (each holding ``ansible_collections/``), separated by ``:`` as in
    Ansible's own setting, searched before the user's collections path (``ANSIBLE_COLLECTIONS_PATH``, else
    ``~/.ansible/collections``, ``/usr/share/ansible/collections``); a relative one is under the project directory.
    The checkout's ``invoke.yaml`` names its own ``collections/`` (a link back to the working tree); an install
    leaves it empty.
    """

    collections_path: str = ""  # a string, not a list, so INVOKE_ANSIBLE_COLLECTIONS_PATH can set it too

    def directories(self) -> list[str]:
        return [part for part in self.collections_path.split(os.pathsep) if part.strip()]


@dataclass(frozen=True)
class AuditSettings:
    """``audit:``: the fan-out and the thresholds of the checks."""

    # hosts probed at once; None (the default, `concurrency: auto`): chosen from the machine and the fleet's size
    # (remediation.transport.fanout.auto_concurrency)
    concurrency: int | None = field(default=None, metadata=POSITIVE)
    connect_timeout: float = field(default=10.0, metadata=POSITIVE)
    timeout: float = field(default=60.0, metadata=POSITIVE)  # seconds for the whole probe on one host
    nvml_timeout: float = field(default=10.0, metadata=POSITIVE)  # seconds for NVML inside the probe
    fail_on: str = "critical"
    unreachable_exit: int = int(ExitCode.UNREACHABLE)  # a plain int: the defaults go into Invoke's config
    temp_alert_c: int = 78
    memory_full_pct: float = 95.0
    history_dir: str = ".audit"
    expected_driver_version: str | None = None


@dataclass(frozen=True)
class RestoreSettings:
    """``driver_restore:``: defaults of ``invoke driver-restore`` (every one also a flag)."""

    method: str = "auto"
    prefer: str = "rebuild"
    batch: int = 1
    max_failures: int = 1
    reboot_timeout: int = 600
    apt_lock_timeout: int = 60
    state_dir: str = ""  # default: audit.history_dir
    lock_ttl_s: float = 6 * 3600.0  # expiry of the local lock and of the leases on the hosts
    playbook_timeout: int = 0  # seconds one batch's playbook may run; 0: reboot_timeout + 1200
    module_source: str = "auto"  # auto (signed under Secure Boot, else DKMS) | dkms | signed

    def __post_init__(self) -> None:
        _check_lock_ttl(self.lock_ttl_s, "driver_restore")


@dataclass(frozen=True)
class KernelUpdateSettings:
    """``kernel_update:``: defaults of ``invoke kernel-update`` (every one also a flag but the lock's)."""

    module_source: str = "auto"  # auto (signed under Secure Boot, else DKMS) | dkms | signed
    batch: int = 1
    max_failures: int = 1
    reboot_timeout: int = 600
    apt_lock_timeout: int = 60
    state_dir: str = ""  # default: audit.history_dir
    lock_ttl_s: float = 6 * 3600.0
    playbook_timeout: int = 0  # seconds one batch's playbook may run; 0: 2 x reboot_timeout + 1200

    def __post_init__(self) -> None:
        _check_lock_ttl(self.lock_ttl_s, "kernel_update")


@dataclass(frozen=True)
class RemediateSettings:
    """``remediate:``: the closed loop's guards and its policy (:mod:`remediation.remediate.policy` reads ``policy``).

    ``policy`` maps a fleet name to ``levels`` (finding ID -> observe | propose | auto, over the built-in defaults),
    ``windows`` (weekly maintenance windows: ``days``, ``start``, ``end``, ``zone``) and ``groups`` (an inventory group
    -> its own ``levels`` and ``windows``).
    """

    state_dir: str = ""  # default: audit.history_dir; the state is <state_dir>/remediate/<fleet>.json
    attempts: int = field(default=3, metadata=POSITIVE)  # actions per host within attempts_window_h
    attempts_window_h: float = field(default=24.0, metadata=POSITIVE)
    finding_ttl_s: float = field(default=3600.0, metadata=POSITIVE)  # older findings are ignored
    max_in_flight: int = field(default=1, metadata=POSITIVE)  # hosts changed at once: the smaller of this ...
    max_in_flight_pct: float = field(default=10.0, metadata=POSITIVE)  # ... and this share of the fleet (at least 1)
    breaker_pct: float = field(default=50.0, metadata=POSITIVE)  # trips above this unhealthy share of the fleet ...
    breaker_window_s: float = field(default=3600.0, metadata=POSITIVE)  # ... seen within this many seconds ...
    breaker_min_hosts: int = field(default=2, metadata=POSITIVE)  # ... and at least this many unhealthy hosts
    # Acting: the IMDS Scheduled Events URL each host asks before it is changed ("": hosts not on Azure, not asked)
    imds_endpoint: str = "http://169.254.169.254/metadata/scheduledevents"
    webhook_url: str = ""  # Alertmanager-compatible receiver of the escalation pages ("": no page, packets only)
    webhook_token: str = ""  # bearer token for webhook_url (sent over https or to loopback only)
    # Blockers: firing alerts at this Alertmanager ("": not checked) whose label (one of alert_labels) names the host
    alertmanager_url: str = ""
    alert_labels: tuple[str, ...] = ("instance", "host", "node")
    alertmanager_timeout_s: float = field(default=5.0, metadata=POSITIVE)  # unreachable or slower: blocked
    # AKS hosts (inventory k8s_node_name): the cluster for the node's cordon and AKS node auto-repair
    kubeconfig: str = ""  # "": $KUBECONFIG, else ~/.kube/config
    kube_context: str = ""
    kube_timeout_s: float = field(default=10.0, metadata=POSITIVE)
    auto_repair_window_s: float = field(default=3600.0, metadata=POSITIVE)  # a recent auto-repair step blocks
    # The gate under load after each action (remediation.remediate.loadgate): required | when-available | off
    load_gate: str = "when-available"
    load_gate_seconds: float = field(default=5.0, metadata=POSITIVE)  # the load's length (at most 30 s)
    policy: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if str(self.load_gate).strip().lower() not in ("required", "when-available", "off"):
            raise UsageError(f"setting remediate.load_gate {self.load_gate!r}: give required, when-available or off;"
                             " fix it in invoke.yaml")
        if self.load_gate_seconds > 30:
            raise UsageError(f"setting remediate.load_gate_seconds {self.load_gate_seconds:g}: at most 30 seconds;"
                             " fix it in invoke.yaml")


def _check_lock_ttl(ttl_s: float, section: str) -> None:
    """The lock/lease TTL of ``section`` must be sane (>= 30 s): refused at config load with one line."""
    from remediation.rollout.lock import check_ttl

    if (bad := check_ttl(ttl_s, f"setting {section}.lock_ttl_s")) is not None:
        raise UsageError(f"{bad}; fix it in invoke.yaml")
