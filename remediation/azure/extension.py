"""The NVIDIA GPU driver VM extension (``NvidiaGpuDriverLinux``, publisher ``Microsoft.HpcCompute``) as a restore.

Runbook S1, option A (``az vm extension set ... --name NvidiaGpuDriverLinux --publisher Microsoft.HpcCompute
--version 1.9``), done through Microsoft.Compute 2024-11-01: ``VirtualMachines_Get`` (the VM exists; its region),
``VirtualMachineExtensions_List`` (the driver extension the VM has now, under whatever name), the write-ahead journal
on the host, ``VirtualMachineExtensions_Delete`` of that extension, ``VirtualMachineExtensions_CreateOrUpdate`` with
the configured ``typeHandlerVersion`` and settings, each waited for; then ``VirtualMachineExtensions_Get`` with
``$expand=instanceView`` for the provisioning state and the extension's own status messages. The extension installs
the driver for the running kernel and reboots the VM; the restore flow's NVML gate judges the host afterwards.

A host maps to its VM through inventory variables (``inventories/example/group_vars/gpu.yml``):
``azure_vm_resource_id``, or ``azure_resource_group`` + ``azure_vm_name`` (+ ``azure_subscription_id``, default the
``az`` subscription). The extension's ``typeHandlerVersion`` is never guessed (public documents disagree between
versions): it must be set as ``azure_nvidia_driver_extension_version``; its public settings are
``azure_nvidia_driver_extension_settings``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from remediation.azure.client import ArmClient
from remediation.azure.errors import ArmError, AzureInputError

__all__ = [
    "COMPUTE_API",
    "EXTENSION_TYPE",
    "PUBLISHER",
    "ExtensionConfig",
    "ExtensionState",
    "ReinstallResult",
    "VmRef",
    "extension_config",
    "extension_from_dict",
    "extension_state",
    "find_driver_extension",
    "packages_change",
    "reinstall",
    "vm_ref",
]

COMPUTE_API = "2024-11-01"
EXTENSION_TYPE = "NvidiaGpuDriverLinux"
PUBLISHER = "Microsoft.HpcCompute"
MAPPING_HELP = (
    "set azure_vm_resource_id, or azure_resource_group and azure_vm_name (azure_subscription_id optional), for the"
    " host in the inventory (see inventories/example/group_vars/gpu.yml)"
)
_VM_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/virtualMachines/"
    r"(?P<vm>[^/]+)/?$",
    re.IGNORECASE,
)
_NAME = re.compile(r"^[A-Za-z0-9._()-]{1,90}$")


@dataclass(frozen=True)
class VmRef:
    """Which VM a host is: subscription (None: the ``az`` one), resource group, VM name."""

    subscription: str | None
    resource_group: str
    name: str

    def path(self, default_subscription: str) -> str:
        sub = self.subscription or default_subscription
        return (f"/subscriptions/{sub}/resourceGroups/{self.resource_group}/providers/Microsoft.Compute/"
                f"virtualMachines/{self.name}")

    def describe(self) -> str:
        where = f" (subscription {self.subscription})" if self.subscription else ""
        return f"{self.resource_group}/{self.name}{where}"


def vm_ref(host: str, host_vars: Mapping[str, Any]) -> VmRef:
    """The VM of ``host`` from its inventory variables; :class:`AzureInputError` (one line) when it is not mapped."""
    rid = host_vars.get("azure_vm_resource_id")
    if rid:
        m = _VM_ID.match(str(rid).strip())
        if m is None:
            raise AzureInputError(
                f"host {host}: azure_vm_resource_id {rid!r} is not a VM resource ID (/subscriptions/SUB/resourceGroups/"
                "RG/providers/Microsoft.Compute/virtualMachines/NAME); fix the inventory variable"
            )
        return VmRef(m.group("sub"), m.group("rg"), m.group("vm"))
    rg, name = host_vars.get("azure_resource_group"), host_vars.get("azure_vm_name")
    if not rg or not name:
        raise AzureInputError(f"host {host} is not mapped to an Azure VM: {MAPPING_HELP}")
    for var, value in (("azure_resource_group", rg), ("azure_vm_name", name)):
        if not _NAME.match(str(value)):
            raise AzureInputError(f"host {host}: {var} {value!r} is not an Azure resource name; fix the inventory")
    sub = host_vars.get("azure_subscription_id")
    return VmRef(str(sub) if sub else None, str(rg), str(name))


@dataclass(frozen=True)
class ExtensionConfig:
    """What the extension is re-added with: ``typeHandlerVersion``, public settings, minor auto-upgrade."""

    type_handler_version: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    auto_upgrade_minor: bool = True

    def body(self, location: str) -> dict[str, Any]:
        """``VirtualMachineExtension`` for the PUT (Microsoft.Compute 2024-11-01)."""
        return {
            "location": location,
            "properties": {
                "publisher": PUBLISHER,
                "type": EXTENSION_TYPE,
                "typeHandlerVersion": self.type_handler_version,
                "autoUpgradeMinorVersion": self.auto_upgrade_minor,
                "settings": dict(self.settings),
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return {"typeHandlerVersion": self.type_handler_version, "settings": dict(self.settings),
                "autoUpgradeMinorVersion": self.auto_upgrade_minor}


def extension_config(host: str, host_vars: Mapping[str, Any]) -> ExtensionConfig:
    """The configured extension for ``host``; :class:`AzureInputError` when the version is not set (never guessed)."""
    version = host_vars.get("azure_nvidia_driver_extension_version")
    if version in (None, ""):
        raise AzureInputError(
            f"host {host}: azure_nvidia_driver_extension_version is not set: the NvidiaGpuDriverLinux"
            " typeHandlerVersion is never guessed; set it in the inventory (e.g. \"1.9\" as in the runbook; list"
            " versions: az vm extension image list-versions --publisher Microsoft.HpcCompute --name"
            " NvidiaGpuDriverLinux -l LOCATION)"
        )
    text = str(version).strip()
    if isinstance(version, float) or not re.fullmatch(r"\d+(\.\d+){1,3}", text):
        raise AzureInputError(
            f"host {host}: azure_nvidia_driver_extension_version {version!r} is not a version like 1.9; quote it in"
            " YAML so 1.10 stays 1.10"
        )
    settings = host_vars.get("azure_nvidia_driver_extension_settings") or {}
    if not isinstance(settings, Mapping):
        raise AzureInputError(
            f"host {host}: azure_nvidia_driver_extension_settings must be a mapping (the extension's public"
            f" settings), got {settings!r}"
        )
    auto = host_vars.get("azure_nvidia_driver_extension_auto_upgrade_minor", True)
    return ExtensionConfig(text, dict(settings), str(auto).lower() not in ("false", "no", "0"))


@dataclass(frozen=True)
class ExtensionState:
    """A VM extension as ARM shows it, with its instance view's status messages."""

    name: str
    id: str
    publisher: str
    type: str
    type_handler_version: str
    settings: Mapping[str, Any]
    auto_upgrade_minor: bool
    provisioning_state: str
    messages: tuple[str, ...] = ()

    def config(self) -> ExtensionConfig:
        return ExtensionConfig(self.type_handler_version, dict(self.settings), self.auto_upgrade_minor)


def extension_from_dict(d: Mapping[str, Any]) -> ExtensionState:
    props = d.get("properties") if isinstance(d.get("properties"), Mapping) else {}
    assert isinstance(props, Mapping)
    view = props.get("instanceView") if isinstance(props.get("instanceView"), Mapping) else {}
    messages: list[str] = []
    for key in ("statuses", "substatuses"):
        for s in (view or {}).get(key) or []:
            if not isinstance(s, Mapping):
                continue
            text = " ".join(str(s.get(k)) for k in ("displayStatus", "message") if s.get(k))
            if text:
                messages.append(f"[{s.get('level') or 'Info'}] {text}")
    return ExtensionState(
        name=str(d.get("name") or ""),
        id=str(d.get("id") or ""),
        publisher=str(props.get("publisher") or ""),
        type=str(props.get("type") or ""),
        type_handler_version=str(props.get("typeHandlerVersion") or ""),
        settings=dict(props.get("settings") or {}),
        auto_upgrade_minor=bool(props.get("autoUpgradeMinorVersion", True)),
        provisioning_state=str(props.get("provisioningState") or ""),
        messages=tuple(messages),
    )


def find_driver_extension(client: ArmClient, vm_path: str) -> ExtensionState | None:
    """The VM's NvidiaGpuDriverLinux extension (matched by publisher and type, whatever its name), or None."""
    body = client.get(vm_path + "/extensions", COMPUTE_API) or {}
    for item in body.get("value") or []:
        ext = extension_from_dict(item)
        if ext.publisher.lower() == PUBLISHER.lower() and ext.type.lower() == EXTENSION_TYPE.lower():
            return ext
    return None


@dataclass(frozen=True)
class ReinstallResult:
    vm: VmRef
    location: str
    extension_id: str
    before: ExtensionState | None
    after: ExtensionState | None
    ok: bool
    steps: tuple[str, ...]
    error: str | None = None

    @property
    def messages(self) -> tuple[str, ...]:
        return self.after.messages if self.after is not None else ()


#: Called before anything changes with (extension id, config before or None, config after); raising aborts.
JournalHook = Callable[[str, Mapping[str, Any] | None, Mapping[str, Any]], None]


def reinstall(
    client: ArmClient,
    vm: VmRef,
    config: ExtensionConfig,
    *,
    journal: JournalHook | None = None,
    timeout_s: float | None = None,
) -> ReinstallResult:
    """Remove and re-add the driver extension on ``vm``, waiting for each; the extension's messages reported."""
    vm_path = vm.path(client.session.subscription_id)
    machine = client.get(vm_path, COMPUTE_API) or {}
    location = str(machine.get("location") or "")
    if not location:
        raise ArmError(f"VM {vm.describe()}: ARM returned no location for it")
    prior = find_driver_extension(client, vm_path)
    name = prior.name if prior is not None else EXTENSION_TYPE
    ext_path = f"{vm_path}/extensions/{name}"
    ext_id = prior.id if prior is not None and prior.id else ext_path
    if journal is not None:
        journal(ext_id, prior.config().to_dict() if prior is not None else None, config.to_dict())
    steps: list[str] = []
    if prior is not None:
        first = client.send("DELETE", client.url(ext_path, COMPUTE_API), ok=(404,))
        if first.status != 404:
            removed = client.wait(first, f"remove {name} from {vm.describe()}", timeout_s=timeout_s)
            if not removed.succeeded:
                return ReinstallResult(vm, location, ext_id, prior, None, False, tuple(steps),
                                       f"removing {name} ended {removed.state}: {removed.error_code}"
                                       f" {removed.error_message}".strip())
        steps.append(f"removed {name} (typeHandlerVersion {prior.type_handler_version})")
    first = client.send("PUT", client.url(ext_path, COMPUTE_API), config.body(location))
    added = client.wait(first, f"add {name} to {vm.describe()}", timeout_s=timeout_s)
    final = client.get(ext_path, COMPUTE_API, **{"$expand": "instanceView"}) or {}
    after = extension_from_dict(final)
    state = after.provisioning_state or added.state
    steps.append(f"added {name} {PUBLISHER} typeHandlerVersion {config.type_handler_version}: provisioning {state}")
    if not added.succeeded or state.lower() != "succeeded":
        detail = added.error_message or "; ".join(after.messages) or state
        return ReinstallResult(vm, location, ext_id, prior, after, False, tuple(steps),
                               f"{name} provisioning {state}: {added.error_code + ': ' if added.error_code else ''}"
                               f"{detail}")
    return ReinstallResult(vm, location, ext_id, prior, after, True, tuple(steps))


def extension_state(client: ArmClient, extension_path: str) -> ExtensionState | None:
    """The extension at ``extension_path`` with its instance view, or None when the VM has none by that name."""
    path = extension_path if extension_path.startswith("/") else "/" + extension_path
    first = client.send("GET", client.url(path, COMPUTE_API, **{"$expand": "instanceView"}), ok=(404,))
    if first.status == 404:
        return None
    return extension_from_dict(first.body or {})


def journal_change(extension_id: str, before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, Any]:
    """The restore journal's record of this change (kind ``azure_extension``; before/after as JSON text)."""
    return {
        "kind": "azure_extension",
        "path": extension_id,
        "packages": [],
        "before": None if before is None else json.dumps(dict(before), sort_keys=True),
        "after": json.dumps(dict(after), sort_keys=True),
    }


def packages_change(packages: Mapping[str, str]) -> dict[str, Any]:
    """The journal's record of the host's NVIDIA packages before the extension ran (kind ``driver_packages``)."""
    return {"kind": "driver_packages", "path": None, "packages": [],
            "before": json.dumps(dict(packages), sort_keys=True), "after": None}


def summary(config_json: str | None) -> str:
    """``typeHandlerVersion 1.9`` from a journal's before/after text."""
    if not config_json:
        return "none"
    try:
        data = json.loads(config_json)
    except ValueError:
        return "unreadable"
    return f"typeHandlerVersion {data.get('typeHandlerVersion', '?')}"


def packages_summary(packages_json: str | None) -> str:
    """``nvidia-driver-535 535.183.01-0ubuntu1`` from a ``driver_packages`` record (its driver metapackages)."""
    try:
        data = json.loads(packages_json or "{}")
    except ValueError:
        return "unreadable"
    if not isinstance(data, dict):
        return "unreadable"
    names = sorted(str(n) for n in data if str(n).startswith("nvidia-driver-"))
    return ", ".join(f"{n} {data[n]}" for n in names) or "no NVIDIA driver package"


def status_messages(config_json: str | None) -> str:
    """``: <the extension's status messages>`` from a journal's after text (empty when there are none), with the
    driver version they name."""
    if not config_json:
        return ""
    try:
        data = json.loads(config_json)
        messages = data.get("statusMessages") or []
        reported = data.get("reportedDriverVersion")
    except (ValueError, AttributeError):
        return ""
    text = (": " + "; ".join(str(m) for m in messages)) if messages else ""
    return text + (f" (driver {reported} reported)" if reported else "")
