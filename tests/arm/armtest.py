"""Helpers of the Azure tests (tests/arm): the test credential, the client, ``invoke`` as on-call runs it.

In-process tests use the product's client with a test credential (the only thing that is not the product's own);
subprocess tests run ``invoke`` exactly as on-call does, with ``AZURE_CONFIG_DIR`` holding what ``az cloud register``
+ ``az login --service-principal`` leave there, so azure-cli-core, MSAL and the token endpoint are the real path.
Everything the product prints in these tests is kept in :data:`TRANSCRIPT` for the token grep
(``test_zz_no_token.py``); every token and secret the services handed out is in :data:`SECRETS`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.services.arm import AUDIENCE, ArmService, TlsFiles

ROOT = Path(__file__).resolve().parents[2]
SUB = "5d9b7c1e-3f2a-4b6c-8d7e-9f0a1b2c3d4e"
SUB2 = "7e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b"
TRANSCRIPT: list[str] = []
SECRETS: set[str] = set()

GPU_USAGES = [
    ("cores", "Total Regional vCPUs", 200, 350),
    ("standardDSv5Family", "Standard DSv5 Family vCPUs", 12, 100),
    ("standardNCADSA100v4Family", "Standard NCADS_A100_v4 Family vCPUs", 72, 96),
    ("standardNDSv2Family", "Standard NDSv2 Family vCPUs", 40, 48),
    ("standardNCASv3_T4Family", "Standard NCASv3_T4 Family vCPUs", 16, 100),
]


class StaticTokenCredential:
    """A credential that hands out the service's test token (azure-core's ``get_token`` protocol)."""

    def __init__(self, token: str) -> None:
        self._token = token
        self.calls = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        assert scopes == (AUDIENCE + "/.default",), scopes
        self.calls += 1
        return AccessToken(self._token, int(time.time()) + 3600)


def make_client(arm: ArmService, **settings: Any) -> Any:
    from remediation.azure.client import ArmClient
    from remediation.azure.session import ArmSession
    from remediation.azure.settings import AzureSettings

    defaults = {"poll_interval_s": 0.05, "retry_backoff_s": 0.05, "retry_total": 3}
    session = ArmSession(arm.endpoint, AUDIENCE + "/.default", SUB, arm.tenant, "GpuLabLocal",
                         StaticTokenCredential(arm.token))
    return ArmClient(session, AzureSettings(**{**defaults, **settings}))


@dataclass
class AzConfigs:
    logged_in: Path
    not_logged_in: Path
    no_subscription: Path
    wrong_secret: Path


@dataclass(frozen=True)
class Run:
    rc: int
    out: str
    err: str

    @property
    def errors(self) -> list[str]:
        """The product's own error lines (invoke --debug adds logger lines around them)."""
        return [line for line in self.err.splitlines() if line.startswith("error: ")]


def invoke(args: list[str], config: Path, tls: TlsFiles, *, stdin: str = "", cwd: Path = ROOT,
           timeout: float = 120) -> Run:
    """``invoke --debug ARGS`` as on-call runs it (debug: every library's log lines end up in the transcript)."""
    env = {**os.environ, "AZURE_CONFIG_DIR": str(config), "REQUESTS_CA_BUNDLE": str(tls.ca)}
    proc = subprocess.run([sys.executable, "-m", "invoke", "--debug", *args], input=stdin, capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout, check=False)
    TRANSCRIPT.append(f"$ invoke {' '.join(args)}\n{proc.stdout}\n{proc.stderr}")
    return Run(proc.returncode, proc.stdout, proc.stderr)
