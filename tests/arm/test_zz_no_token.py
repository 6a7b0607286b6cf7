"""No token, no secret in anything the product printed during the Azure tests (runs last in tests/arm).

Every ``invoke`` of these tests ran with ``--debug``, so the transcript also holds every library's debug log lines
(azure-cli-core, MSAL, urllib3, invoke): a token or client secret logged anywhere would be in it.
"""

from __future__ import annotations

from lab.services.arm import ArmService, QuotaScript, TlsFiles
from tests.arm.armtest import SECRETS, TRANSCRIPT, AzConfigs, invoke


def test_no_token_or_secret_in_any_output(arm: ArmService, az_configs: AzConfigs, tls: TlsFiles) -> None:
    # A fresh token (empty MSAL cache), a quota request through its long-running operation, a failure, a login error.
    (az_configs.logged_in / "msal_token_cache.json").unlink(missing_ok=True)
    arm.script_quota(QuotaScript("Failed", polls=0, code="ContactSupport", message="contact support"))
    runs = [
        invoke(["quota.show", "--location", "eastus"], az_configs.logged_in, tls),
        invoke(["quota.request", "--location", "eastus", "--family", "standardNDSv2Family", "--vcpus", "60",
                "--yes"], az_configs.logged_in, tls),
        invoke(["quota.request", "--location", "eastus", "--family", "standardNDSv2Family", "--vcpus", "60",
                "--check"], az_configs.logged_in, tls),
        invoke(["quota.show", "--location", "eastus"], az_configs.wrong_secret, tls),
    ]
    assert [r.rc for r in runs] == [1, 5, 0, 2]
    text = "\n".join(TRANSCRIPT)
    # The transcript is real: the tables, the errors, and the libraries' debug logs (token requests included).
    assert "standardNDSv2Family" in text and "open a support request" in text
    assert "oauth2/v2.0/token" in text and "msal" in text.lower()
    assert arm.token in SECRETS and arm.client_secret in SECRETS
    leaked = [s for s in SECRETS if s in text]
    assert leaked == [], "a test token or secret appears in the output"
    assert "gpulab-test-token-" not in text and "gpulab-test-secret-" not in text
