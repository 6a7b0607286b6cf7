"""A local Azure Resource Manager (and the Entra ID token endpoint in front of it), over TLS on loopback.

It serves exactly the operations the product calls, the way ARM does, so the product's real client (azure-cli-core's
login, MSAL, the azure-core pipeline of :mod:`remediation.azure.client`) runs against it unchanged; only the
credential is a test one (a service principal of a test tenant, a random token):

* Entra ID: ``GET /{tenant}/v2.0/.well-known/openid-configuration``, ``POST /{tenant}/oauth2/v2.0/token``
  (client credentials).
* Microsoft.Compute 2024-11-01: ``Usage_List``; ``VirtualMachines_Get``; ``VirtualMachineExtensions_List/Get/
  CreateOrUpdate/Delete``; the async operation status behind ``Azure-AsyncOperation``.
* Microsoft.Quota 2023-02-01 at the compute scope: ``Quota_Get``, ``Quota_CreateOrUpdate`` (202 + ``Location`` +
  ``Retry-After``), the operation status behind ``Location`` and ``QuotaRequestStatus_Get``.
* Microsoft.ContainerService 2024-09-01: ``ManagedClusters_Get``, ``AgentPools_List``.

Every request needs the bearer token and the operation's api-version; every request body is validated against the
REST spec (:mod:`lab.services.armspec`, strict: unknown or read-only properties are refused with ARM's 400 error
envelope), and every answer is built on the spec's own example for the operation and validated against the
response schema. Long-running operations move ``InProgress`` -> ``Succeeded | Failed`` over polls; throttling
(``429`` + ``Retry-After``) and transient ``5xx`` are scripted per test (:meth:`ArmService.throttle`,
:meth:`ArmService.fail_next`); quota requests follow a script (:meth:`ArmService.script_quota`). Every request is
recorded (:attr:`ArmService.requests`) without its token.

The VM-extension handler stands in for the Azure VM agent: a PUT of ``NvidiaGpuDriverLinux`` runs the configured
agent (:class:`LabDriverAgent`: installs the latest driver of the host's branch on the lab host mapped to that VM,
through the lab's own control API, and reboots it) while the operation is ``InProgress``. Before that it plays the
extension's documented limits (:func:`documented_failure`, from Microsoft Learn's "NVIDIA GPU Driver Extension for
Linux" and the driver list it links): on a Secure Boot (Trusted Launch) VM the install never finishes and ARM ends
the operation with ``VMExtensionProvisioningTimeout``; on a release its driver type does not support it exits 12
("Image offer not supported"); on a size that is not an NVIDIA N-series size it exits 13. The VM's Secure Boot and
release are the mapped lab host's (its SecureBoot EFI variable, its ``/etc/os-release``), else the VM record's.

For manual use and the README: ``python -m lab.services.arm --config-dir DIR`` starts it, registers a test cloud and
logs a test service principal in under ``DIR`` (an ``AZURE_CONFIG_DIR``), and prints the two variables to export.
Only loopback addresses are ever bound.
"""

from __future__ import annotations

import copy
import datetime as _dt
import ipaddress
import json
import re
import secrets
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from . import LoopbackService, require_loopback
from .armspec import SpecSet

if TYPE_CHECKING:
    from lab.control import Lab

__all__ = [
    "AgentResult",
    "ArmService",
    "Cluster",
    "Failure",
    "LabDriverAgent",
    "QuotaScript",
    "RequestRecord",
    "TlsFiles",
    "VirtualMachine",
    "documented_failure",
    "make_test_ca",
    "write_az_config",
]

DEFAULT_SPECS = Path(__file__).resolve().parent / "azure-specs"
QUOTA = "quota/resource-manager/Microsoft.Quota/stable/2023-02-01/quota.json"
QUOTA_EX = "quota/resource-manager/Microsoft.Quota/stable/2023-02-01/examples/"
COMPUTE = "compute/resource-manager/Microsoft.Compute/ComputeRP/stable/2024-11-01/computeRPCommon.json"
COMPUTE_EX = "compute/resource-manager/Microsoft.Compute/ComputeRP/stable/2024-11-01/examples/"
VM = "compute/resource-manager/Microsoft.Compute/ComputeRP/stable/2024-11-01/virtualMachine.json"
AKS = "containerservice/resource-manager/Microsoft.ContainerService/aks/stable/2024-09-01/managedClusters.json"
AKS_EX = "containerservice/resource-manager/Microsoft.ContainerService/aks/stable/2024-09-01/examples/"
TYPES_V5 = "common-types/resource-management/v5/types.json"
AUDIENCE = "https://management.core.windows.net/"
MAX_BODY = 1 << 20

_VM_T = (
    "/subscriptions/{subscriptionId}/resourceGroups/{resourceGroupName}/providers/Microsoft.Compute/"
    "virtualMachines/{vmName}"
)
_EXT_T = _VM_T + "/extensions/{vmExtensionName}"
_AKS_T = (
    "/subscriptions/{subscriptionId}/resourceGroups/{resourceGroupName}/providers/Microsoft.ContainerService/"
    "managedClusters/{resourceName}"
)


# -- TLS from a test CA ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # what clients trust (REQUESTS_CA_BUNDLE)
    cert: Path
    key: Path


def make_test_ca(directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """A throw-away CA and a server certificate for ``hosts`` signed by it (ECDSA P-256, valid 2 days)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpulab test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    files.key.chmod(0o600)
    return files


# -- state -----------------------------------------------------------------------------------------------------------
@dataclass
class Usage:
    name: str
    localized: str
    current: int
    limit: int


@dataclass
class QuotaScript:
    """How the next quota request goes: ``polls`` answers InProgress, then ``final`` (with ``code``/``message``)."""

    final: str = "Succeeded"  # Succeeded | Failed | Invalid
    polls: int = 1
    code: str = ""
    message: str = ""


@dataclass
class QuotaRequest:
    id: str
    sub: str
    location: str
    family: str
    limit: int
    script: QuotaScript
    state: str = "InProgress"
    polls_left: int = 0
    submitted: str = ""


@dataclass
class Cluster:
    location: str
    pools: list[dict[str, Any]]  # AgentPool properties (count, vmSize, maxCount, ...) plus "name"
    kubernetes_version: str = "1.29.7"


@dataclass
class Extension:
    name: str
    publisher: str
    type: str
    version: str
    settings: dict[str, Any]
    auto_upgrade: bool
    state: str = "Succeeded"
    statuses: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class VirtualMachine:
    location: str
    size: str = "Standard_NC24ads_A100_v4"
    lab_host: str | None = None  # the lab host the agent acts on
    extensions: dict[str, Extension] = field(default_factory=dict)
    secure_boot: bool = False  # a Trusted Launch VM with Secure Boot on (securityProfile.uefiSettings)
    os_id: str = "ubuntu"  # the guest's /etc/os-release ID and VERSION_ID (a mapped lab host's own win)
    os_version: str = "22.04"


@dataclass(frozen=True)
class Failure:
    """How a documented limit ends the extension's provisioning: ARM's error code, the instance view's messages."""

    code: str
    message: str
    statuses: tuple[str, ...]
    transitioning: bool = False  # the install never reported an end (ARM timed it out)


# The extension's documented support (Microsoft Learn hpccompute-gpu-linux, 2025-06-30: CUDA on Ubuntu 20.04, GRID on
# 22.04 and 24.04; the driver list it links, azhpc-extensions Nvidia-GPU-Linux-Resources.json 20240829: CUDA 12.2 on
# 22.04, CUDA 12.1 on 18.x/20.x, GRID 535.161.08 on 22.04/20.04/18.04). This stand-in's own copy, as the service's.
EXTENSION_UBUNTU = {"CUDA": ("18.04", "20.04", "22.04"), "GRID": ("18.04", "20.04", "22.04", "24.04")}


def extension_driver_type(size: str, settings: Mapping[str, Any]) -> str | None:
    """CUDA for NC/ND sizes (GRID with installGridNC/installGridND), GRID for NV sizes; None: not an NVIDIA size."""
    s = size.lower()
    if (s.endswith("as_v4") and s.startswith("standard_nv")) or "mi300x" in s:  # AMD GPUs (NVv4, ND MI300X v5)
        return None
    if s.startswith("standard_nv"):
        return "GRID"
    for prefix, grid in (("standard_nc", "installGridNC"), ("standard_nd", "installGridND")):
        if s.startswith(prefix):
            return "GRID" if str(settings.get(grid, False)).lower() in ("true", "1") else "CUDA"
    return None


def documented_failure(vm: VirtualMachine, ext: Extension, secure_boot: bool, os_id: str,
                       os_version: str) -> Failure | None:
    """The failure the real extension reports on this VM, or None when its documented limits let it install."""
    if secure_boot:
        # Secure Boot is not supported by the extension: its DKMS module needs a MOK enrolled, the install waits on
        # mokutil's password prompt, and the VM agent never hears back (Azure/azure-linux-extensions#1754).
        return Failure(
            "VMExtensionProvisioningTimeout",
            f"Provisioning of VM extension {ext.name} has timed out. Extension provisioning has taken too long to"
            " complete. The extension last reported \"Enable in progress\".",
            ("Enable in progress",), transitioning=True,
        )
    kind = extension_driver_type(vm.size, ext.settings)
    if kind is None:
        return Failure("VMExtensionProvisioningError", "", (f"Enable failed with exit code 13: VM size not supported"
                                                              f" ({vm.size} is not an NVIDIA N-series size)",))
    if os_id.lower() != "ubuntu" or os_version not in EXTENSION_UBUNTU[kind]:
        return Failure("VMExtensionProvisioningError", "", (
            f"Enable failed with exit code 12: Image offer not supported ({os_id} {os_version} is not supported for"
            f" {kind} drivers)",))
    return None


@dataclass
class Operation:
    id: str
    sub: str
    location: str
    status: str = "InProgress"
    error: dict[str, str] | None = None
    started: str = ""
    ended: str = ""
    polls_min: int = 1  # polls answered InProgress at least
    polls: int = 0
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: Mapping[str, str]
    body: Any
    status: int
    at: float
    authorized: bool


@dataclass(frozen=True)
class AgentResult:
    ok: bool
    messages: tuple[str, ...]


Agent = Callable[[VirtualMachine, Extension], AgentResult]


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _rid() -> str:
    return str(uuid.uuid4())


class _Reply(Exception):
    def __init__(self, status: int, body: Any = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


def _arm_error(status: int, code: str, message: str) -> _Reply:
    return _Reply(status, {"error": {"code": code, "message": message}})


# -- the service -----------------------------------------------------------------------------------------------------
class ArmService(LoopbackService):
    """The server and its state; start with :meth:`start`, stop with :meth:`stop` (or use it as a context manager)."""

    scheme = "https"
    thread_name = "arm-service"

    def __init__(
        self,
        tls: TlsFiles,
        *,
        specs: Path = DEFAULT_SPECS,
        host: str = "127.0.0.1",
        port: int = 0,
        tenant: str = "00000000-0000-4000-8000-00000000c0de",
        client_id: str = "00000000-0000-4000-8000-0000000c11e7",
        retry_after: int = 1,
        agent: Agent | None = None,
    ) -> None:
        require_loopback(host, "local ARM service")
        self.specs = SpecSet(specs)
        for f in (QUOTA, COMPUTE, VM, AKS):
            self.specs.file(f)  # fail early, naming the missing spec file
        self.tls = tls
        self.host = host
        self._port = port
        self.tenant = tenant
        self.client_id = client_id
        self.client_secret = "gpulab-test-secret-" + secrets.token_hex(12)
        self.token = "gpulab-test-token-" + secrets.token_hex(16)
        self.retry_after = retry_after
        self.agent = agent
        self.lock = threading.RLock()
        self.subscriptions: dict[str, str] = {}  # id -> name
        self.usages: dict[tuple[str, str], dict[str, Usage]] = {}
        self.clusters: dict[tuple[str, str, str], Cluster] = {}
        self.vms: dict[tuple[str, str, str], VirtualMachine] = {}
        self.quota_scripts: list[QuotaScript] = []
        self.quota_requests: dict[str, QuotaRequest] = {}
        self.operations: dict[str, Operation] = {}
        self.requests: list[RequestRecord] = []
        self.tokens_issued = 0
        self.page_size = 0  # > 0: list answers paged with nextLink
        self._throttles: list[tuple[str, re.Pattern[str], int, int]] = []
        self._faults: list[tuple[str, re.Pattern[str], int, int]] = []
        self._agents: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"https://{self.host}:{self.port}"

    def _make_server(self) -> ThreadingHTTPServer:
        service = self

        class Handler(_Handler):
            arm = service

        server = ThreadingHTTPServer((self.host, self._port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        return server

    def stop(self) -> None:
        super().stop()
        self._server = None
        for t in self._agents:
            t.join(timeout=5)

    # -- scenario set-up ---------------------------------------------------------------------------------------
    def add_subscription(self, sub: str, name: str = "gpulab-test") -> None:
        with self.lock:
            self.subscriptions[sub.lower()] = name

    def set_usages(self, sub: str, location: str, usages: Sequence[tuple[str, str, int, int]]) -> None:
        """``(name, localizedValue, currentValue, limit)`` per quota of a region."""
        with self.lock:
            self.usages[(sub.lower(), location.lower())] = {
                n.lower(): Usage(n, loc, cur, lim) for n, loc, cur, lim in usages
            }

    def usage(self, sub: str, location: str, name: str) -> Usage:
        return self.usages[(sub.lower(), location.lower())][name.lower()]

    def add_cluster(self, sub: str, rg: str, name: str, cluster: Cluster) -> None:
        with self.lock:
            self.clusters[(sub.lower(), rg.lower(), name.lower())] = cluster

    def add_vm(self, sub: str, rg: str, name: str, vm: VirtualMachine) -> None:
        with self.lock:
            self.vms[(sub.lower(), rg.lower(), name.lower())] = vm

    def vm(self, sub: str, rg: str, name: str) -> VirtualMachine:
        return self.vms[(sub.lower(), rg.lower(), name.lower())]

    def script_quota(self, *scripts: QuotaScript) -> None:
        with self.lock:
            self.quota_scripts.extend(scripts)

    def throttle(self, method: str, path_regex: str, times: int = 1, retry_after: int = 1) -> None:
        """The next ``times`` matching requests get ``429`` with ``Retry-After``."""
        with self.lock:
            self._throttles.append((method.upper(), re.compile(path_regex, re.IGNORECASE), times, retry_after))

    def fail_next(self, method: str, path_regex: str, times: int = 1, status: int = 503) -> None:
        """The next ``times`` matching requests get a transient ``status`` (ARM's error envelope)."""
        with self.lock:
            self._faults.append((method.upper(), re.compile(path_regex, re.IGNORECASE), times, status))

    def clear_requests(self) -> None:
        with self.lock:
            self.requests.clear()

    def arm_requests(self) -> list[RequestRecord]:
        """Requests to ARM (token requests to the identity endpoint left out)."""
        return [r for r in self.requests if r.path.lower().startswith("/subscriptions/")]

    def wait_agents(self, timeout: float = 600) -> None:
        for t in list(self._agents):
            t.join(timeout)

    # -- answers -------------------------------------------------------------------------------------------------
    def check_body(self, relative: str, template: str, method: str, body: Any) -> None:
        schema = self.specs.body_schema(relative, template, method)
        if schema is None:
            return
        if body is None:
            raise _arm_error(400, "InvalidRequestContent", "The request content was invalid: the body is missing.")
        errors = self.specs.validate(body, schema[0], schema[1], request=True)
        if errors:
            raise _arm_error(400, "InvalidRequestContent",
                             "The request content was invalid and could not be deserialized: " + "; ".join(errors))

    def checked(self, relative: str, template: str, method: str, status: int, body: Any) -> Any:
        """``body`` after checking it against the operation's response schema (a server bug fails loudly)."""
        schema = self.specs.response_schema(relative, template, method, status)
        if schema is not None and body is not None:
            errors = self.specs.validate(body, schema[0], schema[1], request=False, where="response")
            if errors:
                raise AssertionError(f"local ARM answer breaks the spec ({template} {status}): {errors}")
        return body

    def checked_definition(self, relative: str, name: str, body: Any) -> Any:
        schema, base = self.specs.definition(relative, name)
        errors = self.specs.validate(body, schema, base, request=False, where="response")
        if errors:
            raise AssertionError(f"local ARM answer breaks {name}: {errors}")
        return body

    def example(self, relative: str, status: str = "200") -> Any:
        return copy.deepcopy(self.specs.example(relative)["responses"][status].get("body"))

    def _page(self, items: list[Any], query: Mapping[str, str], path: str) -> dict[str, Any]:
        if self.page_size <= 0:
            return {"value": items}
        start = int(query.get("$skiptoken", "0") or 0)
        page = items[start : start + self.page_size]
        out: dict[str, Any] = {"value": page}
        if start + self.page_size < len(items):
            api = query.get("api-version", "")
            out["nextLink"] = f"{self.endpoint}{path}?api-version={api}&$skiptoken={start + self.page_size}"
        return out

    def _api(self, relative: str, query: Mapping[str, str]) -> None:
        want = self.specs.api_version(relative)
        got = query.get("api-version")
        if not got:
            raise _arm_error(400, "MissingApiVersionParameter",
                             "The api-version query parameter (?api-version=) is required for all requests.")
        if got != want:
            raise _arm_error(400, "InvalidApiVersionParameter",
                             f"The api-version '{got}' is invalid. The supported versions are '{want}'.")

    def _sub(self, sub: str) -> str:
        if sub.lower() not in self.subscriptions:
            raise _arm_error(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        return sub

    # -- routes --------------------------------------------------------------------------------------------------
    def route(self, method: str, path: str, query: Mapping[str, str], body: Any) -> _Reply:
        m = re.fullmatch(r"/subscriptions/([^/]+)/providers/Microsoft\.Compute/locations/([^/]+)/usages", path, re.I)
        if m and method == "GET":
            return self.get_usages(self._sub(m[1]), m[2], query, path)
        m = re.fullmatch(r"/subscriptions/([^/]+)/providers/Microsoft\.Compute/locations/([^/]+)/operations/([^/]+)",
                         path, re.I)
        if m and method == "GET":
            return self.get_operation(m[3])
        m = re.fullmatch(r"/subscriptions/([^/]+)/providers/Microsoft\.Compute/locations/([^/]+)/providers/"
                         r"Microsoft\.Quota/(quotas|operationsStatus|quotaRequests)/([^/]+)", path, re.I)
        if m:
            self._sub(m[1])
            self._api(QUOTA, query)
            kind = m[3].lower()
            if kind == "quotas" and method == "PUT":
                return self.put_quota(m[1], m[2], m[4], body)
            if kind == "quotas" and method == "GET":
                return self.get_quota(m[1], m[2], m[4])
            if kind in ("operationsstatus", "quotarequests") and method == "GET":
                return self.get_quota_request(m[4], location_poll=kind == "operationsstatus")
        m = re.fullmatch(r"/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.ContainerService/"
                         r"managedClusters/([^/]+)(/agentPools)?", path, re.I)
        if m and method == "GET":
            self._sub(m[1])
            self._api(AKS, query)
            return self.get_cluster(m[1], m[2], m[3], pools=bool(m[4]), query=query, path=path)
        m = re.fullmatch(r"/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/"
                         r"virtualMachines/([^/]+)(/extensions(?:/([^/]+))?)?", path, re.I)
        if m:
            self._sub(m[1])
            self._api(VM, query)
            vm = self.vms.get((m[1].lower(), m[2].lower(), m[3].lower()))
            if vm is None:
                raise _arm_error(404, "ResourceNotFound", f"The Resource 'Microsoft.Compute/virtualMachines/{m[3]}'"
                                 f" under resource group '{m[2]}' was not found.")
            ids = (m[1], m[2], m[3])
            if not m[4] and method == "GET":
                return self.get_vm(ids, vm)
            if m[4] and not m[5] and method == "GET":
                return self.list_extensions(ids, vm)
            if m[5]:
                if method == "GET":
                    return self.get_extension(ids, vm, m[5], expand=query.get("$expand", ""))
                if method == "PUT":
                    return self.put_extension(ids, vm, m[5], body)
                if method == "DELETE":
                    return self.delete_extension(ids, vm, m[5])
        if path.lower().startswith("/subscriptions/"):
            raise _arm_error(404, "InvalidResourceType" if method == "GET" else "NoRegisteredProviderFound",
                             f"The resource type or operation '{method} {path}' is not served here.")
        raise _arm_error(404, "NotFound", f"No route for {method} {path}.")

    # Microsoft.Compute usages
    def get_usages(self, sub: str, location: str, query: Mapping[str, str], path: str) -> _Reply:
        self._api(COMPUTE, query)
        if not re.fullmatch(r"[-\w._]+", location):
            raise _arm_error(400, "InvalidParameter", f"The value of parameter location '{location}' is invalid.")
        table = self.usages.get((sub.lower(), location.lower()))
        if table is None:
            raise _arm_error(400, "NoRegisteredProviderFound",
                             f"No registered resource provider found for location '{location}' and API version"
                             f" '{query.get('api-version')}' for type 'locations/usages'.")
        template = self.example(COMPUTE_EX + "computeRPCommonExamples/Usage_List_MaximumSet_Gen.json")["value"][0]
        items = []
        for u in table.values():
            item = copy.deepcopy(template)
            item.update({"unit": "Count", "currentValue": u.current, "limit": u.limit,
                         "name": {"value": u.name, "localizedValue": u.localized}})
            items.append(item)
        body = self._page(items, query, path)
        return _Reply(200, self.checked(COMPUTE, "/subscriptions/{subscriptionId}/providers/Microsoft.Compute/"
                                        "locations/{location}/usages", "get", 200, body))

    # Microsoft.Quota
    def _quota_body(self, sub: str, location: str, usage: Usage) -> dict[str, Any]:
        return {
            "id": f"/subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}/providers/Microsoft.Quota/"
                  f"quotas/{usage.name}",
            "type": "Microsoft.Quota/Quotas",
            "name": usage.name,
            "properties": {"limit": {"limitObjectType": "LimitValue", "value": usage.limit}, "unit": "Count",
                           "name": {"value": usage.name, "localizedValue": usage.localized},
                           "isQuotaApplicable": True, "properties": {}},
        }

    def get_quota(self, sub: str, location: str, family: str) -> _Reply:
        usage = self.usages.get((sub.lower(), location.lower()), {}).get(family.lower())
        if usage is None:
            raise _arm_error(404, "ResourceNotFound", f"Quota resource '{family}' was not found in '{location}'.")
        return _Reply(200, self.checked(QUOTA, "/{scope}/providers/Microsoft.Quota/quotas/{resourceName}", "get", 200,
                                        self._quota_body(sub, location, usage)))

    def put_quota(self, sub: str, location: str, family: str, body: Any) -> _Reply:
        self.check_body(QUOTA, "/{scope}/providers/Microsoft.Quota/quotas/{resourceName}", "put", body)
        props = body.get("properties") or {}
        name = (props.get("name") or {}).get("value")
        if name is None or str(name).lower() != family.lower():
            raise _arm_error(400, "InvalidResourceName",
                             f"properties.name.value '{name}' does not match the resource name '{family}' of the URI.")
        usage = self.usages.get((sub.lower(), location.lower()), {}).get(family.lower())
        if usage is None:
            raise _arm_error(400, "InvalidResourceName", f"'{family}' is not a quota resource of '{location}'.")
        limit = int((props.get("limit") or {}).get("value") or 0)
        with self.lock:
            script = self.quota_scripts.pop(0) if self.quota_scripts else QuotaScript()
            rid = str(uuid.uuid4()).upper()
            self.quota_requests[rid] = QuotaRequest(rid, sub, location, usage.name, limit, script,
                                                    polls_left=script.polls, submitted=_now())
        example = self.specs.example(QUOTA_EX + "putMachineLearningServicesQuotaRequestLowPriority.json")
        status_url = (f"{self.endpoint}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}/providers/"
                      f"Microsoft.Quota/operationsStatus/{rid}?api-version={self.specs.api_version(QUOTA)}")
        headers = {k: v for k, v in example["responses"]["202"]["headers"].items()}
        headers["location"] = status_url
        headers["Retry-After"] = str(self.retry_after)
        return _Reply(202, None, headers)

    def get_quota_request(self, rid: str, *, location_poll: bool) -> _Reply:
        with self.lock:
            req = self.quota_requests.get(rid.upper())
            if req is None:
                raise _arm_error(404, "ResourceNotFound", f"Quota request '{rid}' was not found.")
            if location_poll and req.state == "InProgress":
                if req.polls_left > 0:
                    req.polls_left -= 1
                else:
                    req.state = req.script.final
                    if req.state == "Succeeded":
                        self.usage(req.sub, req.location, req.family).limit = req.limit
        body = self._quota_request_body(req)
        body = self.checked_definition(QUOTA, "QuotaRequestDetails", body)
        if location_poll and req.state == "InProgress":
            status_url = (f"{self.endpoint}/subscriptions/{req.sub}/providers/Microsoft.Compute/locations/"
                          f"{req.location}/providers/Microsoft.Quota/operationsStatus/{req.id}"
                          f"?api-version={self.specs.api_version(QUOTA)}")
            return _Reply(202, body, {"Location": status_url, "Retry-After": str(self.retry_after)})
        return _Reply(200, body)

    def _quota_request_body(self, req: QuotaRequest) -> dict[str, Any]:
        failed = req.state in ("Failed", "Invalid")
        name = "getQuotaRequestStatusFailed.json" if failed else "getQuotaRequestStatusInProgress.json"
        body = self.example(QUOTA_EX + name)
        body["id"] = (f"/subscriptions/{req.sub}/providers/Microsoft.Compute/locations/{req.location}/providers/"
                      f"Microsoft.Quota/quotaRequests/{req.id}")
        body["name"] = req.id
        props = body["properties"]
        props["requestSubmitTime"] = req.submitted
        usage = self.usage(req.sub, req.location, req.family)
        sub_message = {"InProgress": "Request processing", "Succeeded": "Request completed"}.get(req.state)
        message = req.script.message or props.get("message") or ""
        if req.state == "Succeeded":
            message = "Request completed"
        elif req.state == "InProgress":
            message = "Request processing"
        props["message"] = message
        props["provisioningState"] = req.state
        item = props["value"][-1]
        item.update({"limit": {"limitObjectType": "LimitValue", "value": req.limit},
                     "name": {"value": usage.name, "localizedValue": usage.localized},
                     "message": sub_message or message, "provisioningState": req.state})
        props["value"] = [item]
        if failed:
            props["error"] = {"code": req.script.code or "ContactSupport", "message": message}
        else:
            props.pop("error", None)
        return dict(body)

    # Microsoft.ContainerService
    def get_cluster(self, sub: str, rg: str, name: str, *, pools: bool, query: Mapping[str, str],
                    path: str) -> _Reply:
        cluster = self.clusters.get((sub.lower(), rg.lower(), name.lower()))
        if cluster is None:
            raise _arm_error(404, "ResourceNotFound", "The Resource 'Microsoft.ContainerService/managedClusters/"
                             f"{name}' under resource group '{rg}' was not found.")
        base = f"/subscriptions/{sub}/resourcegroups/{rg}/providers/Microsoft.ContainerService/managedClusters/{name}"
        if not pools:
            body = {"id": base, "name": name, "type": "Microsoft.ContainerService/ManagedClusters",
                    "location": cluster.location,
                    "properties": {"provisioningState": "Succeeded", "kubernetesVersion": cluster.kubernetes_version,
                                   "dnsPrefix": f"{name}-dns", "powerState": {"code": "Running"}}}
            return _Reply(200, self.checked(AKS, _AKS_T, "get", 200, body))
        template = self.example(AKS_EX + "AgentPoolsList.json")["value"][0]
        items = []
        for p in cluster.pools:
            item = copy.deepcopy(template)
            props = {k: v for k, v in p.items() if k != "name"}
            item["id"] = f"{base}/agentPools/{p['name']}"
            item["name"] = p["name"]
            item["properties"].update({"orchestratorVersion": cluster.kubernetes_version,
                                       "currentOrchestratorVersion": cluster.kubernetes_version,
                                       "powerState": {"code": "Running"}, "mode": "User", **props})
            items.append(item)
        body = self._page(items, query, path)
        return _Reply(200, self.checked(AKS, _AKS_T + "/agentPools", "get", 200, body))

    # Microsoft.Compute virtual machines and extensions
    def _vm_path(self, ids: tuple[str, str, str]) -> str:
        return f"/subscriptions/{ids[0]}/resourceGroups/{ids[1]}/providers/Microsoft.Compute/virtualMachines/{ids[2]}"

    def get_vm(self, ids: tuple[str, str, str], vm: VirtualMachine) -> _Reply:
        body: dict[str, Any] = {
            "id": self._vm_path(ids), "name": ids[2], "type": "Microsoft.Compute/virtualMachines",
            "location": vm.location,
            "properties": {"vmId": str(uuid.uuid5(uuid.NAMESPACE_URL, self._vm_path(ids).lower())),
                           "hardwareProfile": {"vmSize": vm.size}, "provisioningState": "Succeeded"},
        }
        if vm.secure_boot:
            body["properties"]["securityProfile"] = {
                "securityType": "TrustedLaunch", "uefiSettings": {"secureBootEnabled": True, "vTpmEnabled": True}}
        return _Reply(200, self.checked(VM, _VM_T, "get", 200, body))

    def _extension_body(self, ids: tuple[str, str, str], vm: VirtualMachine, ext: Extension,
                        instance_view: bool) -> dict[str, Any]:
        body = self.example(COMPUTE_EX + "virtualMachineExamples/VirtualMachineExtension_Get_MaximumSet_Gen.json")
        body.pop("tags", None)
        body["name"] = ext.name
        body["id"] = f"{self._vm_path(ids)}/extensions/{ext.name}"
        body["location"] = vm.location
        props = body["properties"]
        props.pop("protectedSettings", None)  # never returned by ARM
        props.pop("forceUpdateTag", None)
        props.update({"publisher": ext.publisher, "type": ext.type, "typeHandlerVersion": ext.version,
                      "autoUpgradeMinorVersion": ext.auto_upgrade, "settings": ext.settings,
                      "provisioningState": ext.state, "suppressFailures": False, "enableAutomaticUpgrade": False})
        if instance_view:
            props["instanceView"] = {"name": ext.name, "type": f"{ext.publisher}.{ext.type}",
                                     "typeHandlerVersion": ext.version, "statuses": list(ext.statuses)}
        else:
            props.pop("instanceView", None)
        return dict(body)

    def list_extensions(self, ids: tuple[str, str, str], vm: VirtualMachine) -> _Reply:
        with self.lock:
            value = [self._extension_body(ids, vm, e, False) for e in vm.extensions.values()]
        return _Reply(200, self.checked(VM, _VM_T + "/extensions", "get", 200, {"value": value}))

    def get_extension(self, ids: tuple[str, str, str], vm: VirtualMachine, name: str, expand: str) -> _Reply:
        with self.lock:
            ext = vm.extensions.get(name.lower())
            if ext is None:
                raise _arm_error(404, "NotFound", "The entity was not found in this Azure location.")
            body = self._extension_body(ids, vm, ext, expand.lower() == "instanceview")
        return _Reply(200, self.checked(VM, _EXT_T, "get", 200, body))

    def _operation(self, sub: str, location: str, polls_min: int = 1) -> tuple[Operation, dict[str, str]]:
        op = Operation(_rid(), sub, location, started=_now(), polls_min=polls_min)
        self.operations[op.id] = op
        url = (f"{self.endpoint}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}/operations/"
               f"{op.id}?api-version={self.specs.api_version(VM)}")
        return op, {"Azure-AsyncOperation": url, "Retry-After": str(self.retry_after)}

    def get_operation(self, opid: str) -> _Reply:
        with self.lock:
            op = self.operations.get(opid)
            if op is None:
                raise _arm_error(404, "NotFound", f"Operation '{opid}' was not found.")
            op.polls += 1
            status = op.status if (op.done.is_set() and op.polls > op.polls_min) else "InProgress"
            body: dict[str, Any] = {"id": opid, "name": opid, "status": status, "startTime": op.started}
            if status != "InProgress":
                body["endTime"] = op.ended or _now()
                if op.error:
                    body["error"] = dict(op.error)
        body = self.checked_definition(TYPES_V5, "OperationStatusResult", body)
        headers = {"Retry-After": str(self.retry_after)} if status == "InProgress" else {}
        return _Reply(200, body, headers)

    def put_extension(self, ids: tuple[str, str, str], vm: VirtualMachine, name: str, body: Any) -> _Reply:
        self.check_body(VM, _EXT_T, "put", body)
        props = body.get("properties") or {}
        for key in ("publisher", "type", "typeHandlerVersion"):
            if not props.get(key):
                raise _arm_error(400, "InvalidParameter", f"Required parameter 'properties.{key}' is missing (null).")
        if body.get("location") and str(body["location"]).lower() != vm.location.lower():
            raise _arm_error(400, "LocationNotAvailableForResourceType",
                             f"The extension location '{body['location']}' differs from the VM's '{vm.location}'.")
        with self.lock:
            existed = name.lower() in vm.extensions
            ext = Extension(name, str(props["publisher"]), str(props["type"]), str(props["typeHandlerVersion"]),
                            dict(props.get("settings") or {}), bool(props.get("autoUpgradeMinorVersion", False)),
                            state="Updating" if existed else "Creating",
                            statuses=[{"code": "ProvisioningState/transitioning", "level": "Info",
                                       "displayStatus": "Transitioning", "message": "Enable in progress",
                                       "time": _now()}])
            vm.extensions[name.lower()] = ext
            op, headers = self._operation(ids[0], vm.location)
        thread = threading.Thread(target=self._run_agent, args=(vm, ext, op), name=f"agent-{name}", daemon=True)
        self._agents.append(thread)
        thread.start()
        status = 200 if existed else 201
        answer = self._extension_body(ids, vm, ext, False)
        return _Reply(status, self.checked(VM, _EXT_T, "put", status, answer), headers)

    def _guest(self, vm: VirtualMachine) -> tuple[bool, str, str]:
        """(Secure Boot on, os ID, VERSION_ID) of the VM's guest: the agent's lab host when it can tell, else the
        VM record's."""
        guest = getattr(self.agent, "guest", None)
        if callable(guest):
            found = guest(vm)
            if found is not None:
                return found  # type: ignore[no-any-return]
        return vm.secure_boot, vm.os_id, vm.os_version

    def _run_agent(self, vm: VirtualMachine, ext: Extension, op: Operation) -> None:
        failure = None
        try:
            if ext.type.lower() == "nvidiagpudriverlinux":
                failure = documented_failure(vm, ext, *self._guest(vm))
            if failure is not None:
                result = AgentResult(False, failure.statuses)
            elif self.agent is not None and ext.type.lower() == "nvidiagpudriverlinux":
                result = self.agent(vm, ext)
            else:
                result = AgentResult(True, (f"Enable succeeded: {ext.type} {ext.version}",))
        except Exception as exc:  # the agent's own crash is the extension's failure, as on a VM
            result = AgentResult(False, (f"Enable failed: {type(exc).__name__}: {exc}",))
        with self.lock:
            ext.state = "Succeeded" if result.ok else "Failed"
            if failure is not None and failure.transitioning:  # the extension itself never reported an end
                ext.statuses = [{"code": "ProvisioningState/transitioning", "level": "Info",
                                 "displayStatus": "Transitioning", "message": m, "time": _now()}
                                for m in result.messages]
            else:
                ext.statuses = [{"code": f"ProvisioningState/{ext.state.lower()}",
                                 "level": "Info" if result.ok else "Error",
                                 "displayStatus": "Provisioning succeeded" if result.ok else "Provisioning failed",
                                 "message": m, "time": _now()} for m in result.messages]
            op.status = ext.state
            op.ended = _now()
            if failure is not None and failure.message:
                op.error = {"code": failure.code, "message": failure.message}
            elif not result.ok:
                op.error = {"code": "VMExtensionProvisioningError",
                            "message": f"VM has reported a failure when processing extension '{ext.name}'"
                                       f" (publisher '{ext.publisher}' and type '{ext.type}'). Error message: "
                                       + " ".join(result.messages)}
            op.done.set()

    def delete_extension(self, ids: tuple[str, str, str], vm: VirtualMachine, name: str) -> _Reply:
        with self.lock:
            ext = vm.extensions.get(name.lower())
            if ext is None:
                return _Reply(204)
            ext.state = "Deleting"
            op, headers = self._operation(ids[0], vm.location)
            del vm.extensions[name.lower()]
            op.status = "Succeeded"
            op.ended = _now()
            op.done.set()
        return _Reply(202, None, headers)

    # -- the identity endpoint ---------------------------------------------------------------------------------
    def identity(self, method: str, path: str, form: Mapping[str, str]) -> _Reply:
        m = re.fullmatch(r"/([^/]+)/v2\.0/\.well-known/openid-configuration", path)
        if m and method == "GET":
            base = f"{self.endpoint}/{m[1]}"
            return _Reply(200, {
                "issuer": f"{base}/v2.0",
                "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                "token_endpoint": f"{base}/oauth2/v2.0/token",
                "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
                "jwks_uri": f"{base}/discovery/v2.0/keys",
                "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
                "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt"],
                "tenant_region_scope": "NA",
            })
        m = re.fullmatch(r"/([^/]+)/oauth2/v2\.0/token", path)
        if m and method == "POST":
            if m[1] != self.tenant:
                return _Reply(400, {"error": "invalid_request",
                                    "error_description": f"AADSTS90002: Tenant '{m[1]}' not found."})
            if form.get("grant_type") != "client_credentials":
                return _Reply(400, {"error": "unsupported_grant_type",
                                    "error_description": "AADSTS70003: only client_credentials is served here."})
            if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
                return _Reply(401, {"error": "invalid_client",
                                    "error_description": "AADSTS7000215: Invalid client secret provided."})
            if form.get("scope", "").split() != [AUDIENCE + "/.default"]:
                return _Reply(400, {"error": "invalid_scope",
                                    "error_description": f"AADSTS70011: scope {form.get('scope')!r} is not valid."})
            with self.lock:
                self.tokens_issued += 1
            return _Reply(200, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599,
                                "access_token": self.token})
        return _Reply(404, {"error": "not_found", "error_description": f"No identity route {method} {path}."})

    # -- the request pipeline ----------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers: Mapping[str, str], raw_body: bytes) -> _Reply:
        parts = urlsplit(raw_path)
        path = parts.path
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        is_arm = path.lower().startswith("/subscriptions/")
        body: Any = None
        authorized = False
        try:
            if not is_arm:
                form = {k: v[-1] for k, v in parse_qs(raw_body.decode("utf-8", "replace")).items()}
                reply = self.identity(method, path, form)
                self._record(method, path, query, None, reply.status, False)
                return reply
            auth = headers.get("authorization", "")
            authorized = auth == f"Bearer {self.token}"
            if raw_body:
                try:
                    body = json.loads(raw_body)
                except ValueError:
                    raise _arm_error(400, "InvalidRequestContent", "The request content is not valid JSON.") from None
            if not auth:
                raise _arm_error(401, "AuthenticationFailed",
                                 "Authentication failed. The 'Authorization' header is missing.")
            if not authorized:
                raise _arm_error(401, "InvalidAuthenticationToken", "The access token is invalid.")
            scripted = self._scripted(method, path)
            if scripted is not None:
                raise scripted
            reply = self.route(method, path, query, body)
        except _Reply as r:
            reply = r
        self._record(method, path, query, body, reply.status, authorized)
        return reply

    def _scripted(self, method: str, path: str) -> _Reply | None:
        with self.lock:
            for i, (m, rx, times, retry_after) in enumerate(self._throttles):
                if m == method and rx.search(path) and times > 0:
                    self._throttles[i] = (m, rx, times - 1, retry_after)
                    r = _arm_error(429, "TooManyRequests", "The request is being throttled as the limit has been"
                                   " reached for operation type - Write_ObservationWindow_00:01:00.")
                    r.headers["Retry-After"] = str(retry_after)
                    return r
            for i, (m, rx, times, status) in enumerate(self._faults):
                if m == method and rx.search(path) and times > 0:
                    self._faults[i] = (m, rx, times - 1, status)
                    return _arm_error(status, "ServiceUnavailable" if status == 503 else "InternalServerError",
                                      "The service is temporarily unavailable; retry the request.")
        return None

    def _record(self, method: str, path: str, query: Mapping[str, str], body: Any, status: int,
                authorized: bool) -> None:
        with self.lock:
            self.requests.append(RequestRecord(method, path, dict(query), body, status, time.monotonic(), authorized))


class _Handler(BaseHTTPRequestHandler):
    arm: ArmService
    protocol_version = "HTTP/1.1"
    server_version = "gpulab-arm/1"

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.send_error(413)
            return
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            reply = self.arm.handle(self.command, self.path, headers, raw)
        except AssertionError as exc:  # the stand-in broke its own spec: loud, never silent
            reply = _arm_error(500, "LocalServiceSpecViolation", str(exc))
        data = b"" if reply.body is None else json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-ms-request-id", _rid())
        self.send_header("x-ms-correlation-request-id", _rid())
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:  # no access log (it would show paths only; still quiet)
        return


# -- azure-cli's configuration for a test cloud ----------------------------------------------------------------------
def write_az_config(
    config_dir: Path,
    service: ArmService,
    *,
    subscriptions: Sequence[tuple[str, str]] = (),
    default: str | None = None,
    cloud: str = "GpuLabLocal",
    logged_in: bool = True,
) -> Path:
    """What ``az cloud register`` + ``az cloud set`` + ``az login --service-principal`` leave in ``config_dir``.

    The cloud's Resource Manager and identity endpoints are ``service``'s; ``core.instance_discovery`` is off (as for
    Azure Stack), so MSAL asks the local identity endpoint itself. ``logged_in=False`` leaves no account (``az
    login`` never ran); ``default=None`` with subscriptions leaves none selected (``az account set`` needed).
    """
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config").write_text(
        f"[cloud]\nname = {cloud}\n\n[core]\ninstance_discovery = false\ncollect_telemetry = false\n"
        "only_show_errors = true\n"
    )
    (config_dir / "clouds.config").write_text(
        f"[{cloud}]\nendpoint_resource_manager = {service.endpoint}/\n"
        f"endpoint_active_directory = {service.endpoint}\n"
        f"endpoint_active_directory_resource_id = {AUDIENCE}\nendpoint_management = {AUDIENCE}\nprofile = latest\n"
    )
    accounts = []
    if logged_in:
        for sub, name in subscriptions:
            accounts.append({
                "id": sub, "name": name, "state": "Enabled", "tenantId": service.tenant,
                "homeTenantId": service.tenant, "managedByTenants": [], "environmentName": cloud,
                "isDefault": sub == default,
                "user": {"name": service.client_id, "type": "servicePrincipal"},
            })
        (config_dir / "service_principal_entries.json").write_text(json.dumps(
            [{"client_id": service.client_id, "tenant": service.tenant, "client_secret": service.client_secret}]
        ))
        (config_dir / "service_principal_entries.json").chmod(0o600)
    (config_dir / "azureProfile.json").write_text(json.dumps({"installationId": _rid(), "subscriptions": accounts}))
    return config_dir


# -- the VM agent's stand-in -----------------------------------------------------------------------------------------
class LabDriverAgent:
    """What NvidiaGpuDriverLinux does on the VM, done on the mapped lab host: the latest driver of the host's branch
    for the running kernel (the extension installs the latest supported driver unless told otherwise), reboot, and
    the installed driver version in its status."""

    def __init__(self, lab: Lab, reboot_timeout: float = 120.0) -> None:
        self.lab = lab
        self.reboot_timeout = reboot_timeout

    def guest(self, vm: VirtualMachine) -> tuple[bool, str, str] | None:
        """(Secure Boot on, os ID, VERSION_ID) as the mapped lab host shows them, or None (no host mapped)."""
        host = vm.lab_host
        if host is None:
            return None
        efivar = self.lab.host_path(host, "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c")
        try:
            data = efivar.read_bytes()
            secure = len(data) >= 5 and data[4] == 1
        except OSError:
            secure = False
        fields: dict[str, str] = {}
        try:
            for line in self.lab.host_path(host, "/etc/os-release").read_text().splitlines():
                key, _, value = line.partition("=")
                fields[key.strip()] = value.strip().strip('"')
        except OSError:
            pass
        return secure, fields.get("ID", vm.os_id), fields.get("VERSION_ID", vm.os_version)

    def __call__(self, vm: VirtualMachine, ext: Extension) -> AgentResult:
        host = vm.lab_host
        if host is None:
            return AgentResult(False, ("no lab host is mapped to this VM",))
        run = self.lab.run_in_host
        kernel = run(host, ["uname", "-r"]).stdout.strip()
        installed = run(host, ["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\\n", "nvidia-driver-*"],
                        check=False).stdout
        driver = next((line.split()[:2] for line in installed.splitlines() if line.endswith("installed")), None)
        headers = run(host, ["apt-get", "install", "-y", "-q", f"linux-headers-{kernel}"], check=False)
        if headers.returncode != 0:
            return AgentResult(False, (f"Enable failed: linux-headers-{kernel}: {_last(headers)}",))
        target = driver[0] if driver is not None else "nvidia-driver-535"
        # The candidate version: the newest the host's sources have (an upgrade), else a reinstall that makes DKMS
        # build the module for the running kernel.
        # The DKMS package's scripts build the module (the driver metapackage has none): both are reinstalled.
        dkms = "nvidia-dkms-" + target.removeprefix("nvidia-driver-")
        step = run(host, ["apt-get", "install", "--reinstall", "-y", "-q", target, dkms], check=False)
        if step.returncode != 0:
            return AgentResult(False, (f"Enable failed: installing {target}: {_last(step)}",))
        module = self.lab.host_path(host, f"/lib/modules/{kernel}/updates/dkms/nvidia.ko")
        if not module.exists():
            return AgentResult(False, (f"Enable failed: the NVIDIA module was not built for kernel {kernel}",))
        version = run(host, ["dpkg-query", "-W", "-f", "${Version}", target], check=False).stdout.strip()
        upstream = version.split(":", 1)[-1].rsplit("-", 1)[0]
        self.lab.reboot(host, wait=True, timeout=self.reboot_timeout)
        return AgentResult(True, (f"Enable succeeded: NVIDIA driver {upstream} installed for kernel {kernel}"
                                  f" ({target} {version})", "The VM was restarted to load the driver"))


def _last(proc: Any) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


# -- the demo's data (also what `python -m lab.services.arm` serves) ------------------------------------------------
DEMO_SUBSCRIPTION = "6b3c9f4e-1d2a-4c5b-9e8f-0a1b2c3d4e5f"

# The usage row every region's Microsoft.Compute usage list carries for Spot VMs: the regional low-priority vCPUs,
# shared by the Spot VMs of every family (an AKS pool with scaleSetPriority Spot draws here, not on its family).
LOW_PRIORITY_USAGE = ("lowPriorityCores", "Total Regional Low-priority vCPUs")


def spot_pool(name: str, vm_size: str, count: int, max_count: int, **props: Any) -> dict[str, Any]:
    """An autoscaling AgentPool on Spot VMs (2024-09-01: ``scaleSetPriority``, ``scaleSetEvictionPolicy``,
    ``spotMaxPrice``; AKS adds the ``kubernetes.azure.com/scalesetpriority=spot:NoSchedule`` taint)."""
    return {"name": name, "vmSize": vm_size, "count": count, "minCount": 0, "maxCount": max_count,
            "enableAutoScaling": True, "scaleSetPriority": "Spot", "scaleSetEvictionPolicy": "Delete",
            "spotMaxPrice": -1, "nodeTaints": ["kubernetes.azure.com/scalesetpriority=spot:NoSchedule"], **props}


def seed_spot(service: ArmService, sub: str, location: str, *, low_priority: tuple[int, int],
              regular: Sequence[tuple[str, str, int, int]] = ()) -> None:
    """A region whose usage list has the ``lowPriorityCores`` row (``(currentValue, limit)``) beside ``regular``."""
    service.set_usages(sub, location, [*regular, (*LOW_PRIORITY_USAGE, *low_priority)])


def seed_demo(service: ArmService) -> None:
    """Runbook S3 in one region: a busy GPU quota, a full regional total, an AKS cluster whose GPU pools can't grow."""
    sub = DEMO_SUBSCRIPTION
    service.add_subscription(sub, "gpu-fleet-prod")
    service.set_usages(sub, "eastus", [
        ("cores", "Total Regional vCPUs", 310, 350),
        ("standardDSv5Family", "Standard DSv5 Family vCPUs", 12, 100),
        ("standardNCADSA100v4Family", "Standard NCADS_A100_v4 Family vCPUs", 72, 96),
        ("standardNDSv2Family", "Standard NDSv2 Family vCPUs", 40, 48),
        ("standardNCASv3_T4Family", "Standard NCASv3_T4 Family vCPUs", 16, 100),
        ("StandardNCadsH100v5Family", "Standard NCadsH100v5 Family vCPUs", 0, 0),
        (*LOW_PRIORITY_USAGE, 0, 100),
    ])
    service.add_cluster(sub, "myRG", "myAKS", Cluster("eastus", [
        {"name": "system", "vmSize": "Standard_D4s_v5", "count": 3, "minCount": 3, "maxCount": 5,
         "enableAutoScaling": True, "mode": "System"},
        {"name": "gpunp", "vmSize": "Standard_NC24ads_A100_v4", "count": 3, "minCount": 1, "maxCount": 3,
         "enableAutoScaling": True, "nodeTaints": ["sku=gpu:NoSchedule"]},
        {"name": "gpunp2", "vmSize": "Standard_NC24ads_A100_v4", "count": 0, "minCount": 0, "maxCount": 4,
         "enableAutoScaling": True},
    ]))


# -- manual use --------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.services.arm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-dir", type=Path, default=Path(".lab/azure"),
                        help="the AZURE_CONFIG_DIR to write (test cloud registered, test principal logged in)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--specs", type=Path, default=DEFAULT_SPECS)
    parser.add_argument("--scene", default="demo", help="the data it serves: demo (see demo/azure.py)")
    args = parser.parse_args(argv)
    tls = make_test_ca(args.config_dir / "tls")
    service = ArmService(tls, specs=args.specs, port=args.port)
    service.start()
    seed_demo(service)
    write_az_config(args.config_dir, service, subscriptions=[(sub, name) for sub, name in
                                                             service.subscriptions.items()],
                    default=next(iter(service.subscriptions), None))
    print(f"local ARM at {service.endpoint} (Ctrl-C stops it); in another shell:")
    print(f"  export AZURE_CONFIG_DIR={args.config_dir.resolve()} REQUESTS_CA_BUNDLE={tls.ca.resolve()}")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        service.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
