"""Who calls ARM, in which subscription, at which endpoint: azure-cli-core's profile, as ``az`` itself reads it.

:func:`cli_session` reads the account ``az login`` left in ``AZURE_CONFIG_DIR`` (default ``~/.azure``): a user, a
service principal (``az login --service-principal``) or a managed identity (``az login --identity``, for scheduled
runs on an Azure VM), the selected subscription (``az account set``), and the active cloud (``az cloud set``): its
Resource Manager endpoint and token audience. Sovereign clouds and a test cloud registered with ``az cloud register``
work the same way. Nothing here sends a request; a token is first asked for by the first ARM call.

Everything that can be wrong with the login is one :class:`~.errors.AzureLoginError` line that says which ``az``
command fixes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from remediation.azure.errors import AzureLoginError

__all__ = ["ArmSession", "cli_session", "config_dir"]


@dataclass(frozen=True)
class ArmSession:
    """An ARM endpoint, the token scope for it, a credential (``get_token``) and the selected subscription."""

    endpoint: str  # e.g. https://management.azure.com (no trailing slash)
    scope: str  # e.g. https://management.core.windows.net//.default
    subscription_id: str
    tenant_id: str = ""
    cloud: str = ""
    credential: Any = field(default=None, repr=False, compare=False)  # never printed


def config_dir() -> str:
    """Where azure-cli keeps its login (``AZURE_CONFIG_DIR``, default ``~/.azure``)."""
    return os.environ.get("AZURE_CONFIG_DIR") or os.path.expanduser(os.path.join("~", ".azure"))


def _login_error(exc: Exception) -> AzureLoginError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    where = f"AZURE_CONFIG_DIR={config_dir()}"
    low = text.lower()
    if "az login" in low or "no active account" in low:
        return AzureLoginError(
            f"not logged in to Azure ({where} has no account for the active cloud): run `az login` "
            "(scheduled runs: `az login --service-principal ...` or `az login --identity`)"
        )
    if "az account set" in low or "no subscription" in low:
        return AzureLoginError(
            f"no Azure subscription selected ({where}): run `az account set --subscription <id or name>`"
        )
    if "not found" in low and "subscription" in low:
        return AzureLoginError(f"{text} ({where}): run `az account list -o table` and `az account set`")
    return AzureLoginError(f"Azure login unusable ({where}): {text}; run `az login` again")


def cli_session(subscription: str | None = None) -> ArmSession:
    """The session ``az`` would use now (``subscription``: id or name instead of the selected one)."""
    try:
        from azure.cli.core import get_default_cli
        from azure.cli.core._profile import Profile
        from azure.cli.core.auth.util import resource_to_scopes
        from knack.util import CLIError
    except ImportError:  # pragma: no cover - the azure extra is part of ./run's install
        raise AzureLoginError(
            "azure-cli-core is not installed: install the project with its azure extra (pip install -e '.[azure]';"
            " ./run setup does)"
        ) from None
    cli = get_default_cli()
    profile = Profile(cli_ctx=cli)
    try:
        account = profile.get_subscription(subscription)
        credential, subscription_id, tenant_id = profile.get_login_credentials(subscription_id=account["id"])
    except CLIError as exc:
        raise _login_error(exc) from None
    cloud = cli.cloud
    endpoint = str(cloud.endpoints.resource_manager or "").rstrip("/")
    audience = cloud.endpoints.active_directory_resource_id or cloud.endpoints.management
    if not endpoint.startswith("https://"):
        raise AzureLoginError(
            f"the active Azure cloud {cloud.name!r} has Resource Manager endpoint {endpoint!r}: tokens are only sent"
            " over https; fix it with `az cloud update` or `az cloud set`"
        )
    return ArmSession(
        endpoint=endpoint,
        scope=resource_to_scopes(audience)[0],
        subscription_id=str(subscription_id),
        tenant_id=str(tenant_id),
        cloud=str(cloud.name),
        credential=credential,
    )
