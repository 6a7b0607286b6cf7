"""Fixtures of the Azure tests: one local ARM service per session (TLS from a throw-away CA, a test principal)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.services.arm import ArmService, TlsFiles, make_test_ca, write_az_config
from tests.arm.armtest import GPU_USAGES, SECRETS, SUB, SUB2, AzConfigs


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_test_ca(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def arm_service(tls: TlsFiles) -> Iterator[ArmService]:
    service = ArmService(tls, retry_after=0).start()
    SECRETS.update({service.token, service.client_secret})
    service.add_subscription(SUB, "gpu-fleet-test")
    service.add_subscription(SUB2, "gpu-fleet-other")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
        yield service
    service.stop()


@pytest.fixture
def arm(arm_service: ArmService) -> ArmService:
    """The session's service with this test's state: the usages reset, no scripts, no recorded requests."""
    s = arm_service
    with s.lock:
        s.quota_scripts.clear()
        s._throttles.clear()
        s._faults.clear()
        s.page_size = 0
        s.retry_after = 0
        s.clusters.clear()
        s.vms.clear()
    s.set_usages(SUB, "eastus", GPU_USAGES)
    s.clear_requests()
    return s


@pytest.fixture(scope="session")
def az_configs(arm_service: ArmService, tmp_path_factory: pytest.TempPathFactory) -> AzConfigs:
    base = tmp_path_factory.mktemp("azconfig")
    subs = [(SUB, "gpu-fleet-test"), (SUB2, "gpu-fleet-other")]
    configs = AzConfigs(
        write_az_config(base / "in", arm_service, subscriptions=subs, default=SUB),
        write_az_config(base / "out", arm_service, subscriptions=subs, logged_in=False),
        write_az_config(base / "nosub", arm_service, subscriptions=subs, default=None),
        write_az_config(base / "wrong", arm_service, subscriptions=subs, default=SUB),
    )
    wrong = configs.wrong_secret / "service_principal_entries.json"
    wrong.write_text(wrong.read_text().replace(arm_service.client_secret, "not-the-secret"))
    return configs


