"""The fan-out's concurrency chosen from the machine and the fleet (issue 25), and the cipher order it offers."""

from __future__ import annotations

from typing import Any

import paramiko
import pytest

from remediation.config import AuditSettings, load_section
from remediation.core.errors import FanoutError, UsageError
from remediation.transport import fanout
from remediation.transport.fanout import auto_concurrency, fan_out


def test_a_small_fleet_gets_one_connection_per_host() -> None:
    assert auto_concurrency(10, cpus=2, fd_limit=1024) == 10


def test_a_large_fleet_is_bounded_by_the_cpus() -> None:
    assert auto_concurrency(1000, cpus=2, fd_limit=1 << 20) == 2 * fanout.HOSTS_PER_CPU


def test_the_open_file_limit_bounds_it() -> None:
    assert auto_concurrency(1000, cpus=16, fd_limit=256) == (256 - fanout.FDS_RESERVED) // fanout.FDS_PER_HOST


def test_never_above_the_cap_and_never_below_one() -> None:
    assert auto_concurrency(100_000, cpus=64, fd_limit=1 << 20) == fanout.MAX_CONCURRENCY
    assert auto_concurrency(0, cpus=2, fd_limit=1024) == 1
    assert auto_concurrency(1000, cpus=2, fd_limit=10) == 1


def test_this_machine_gives_a_bounded_number() -> None:
    assert 1 <= auto_concurrency(3) <= 3
    assert 1 <= auto_concurrency(10_000) <= fanout.MAX_CONCURRENCY


def test_audit_concurrency_defaults_to_chosen_and_a_number_overrides() -> None:
    assert AuditSettings().concurrency is None
    assert load_section(AuditSettings, {"concurrency": None}, "audit").concurrency is None
    assert load_section(AuditSettings, {"concurrency": "8"}, "audit").concurrency == 8
    with pytest.raises(UsageError, match=r"setting audit\.concurrency .*above 0"):
        load_section(AuditSettings, {"concurrency": 0}, "audit")


def test_fan_out_takes_none_as_chosen_and_refuses_zero() -> None:
    assert fan_out([], "true", concurrency=None).runs == {}
    with pytest.raises(FanoutError, match="at least 1"):
        fan_out([], "true", concurrency=0)


def test_aead_ciphers_are_offered_first_and_nothing_is_dropped() -> None:
    transport: Any = fanout._transport_class()
    offered = transport._preferred_ciphers
    assert offered[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    assert sorted(offered) == sorted(paramiko.Transport._preferred_ciphers)
    assert paramiko.Transport._preferred_ciphers[0] == "aes128-ctr", "paramiko's own order is left alone"


def test_each_pool_thread_has_its_own_fabric_config() -> None:
    """A Fabric Config re-merges every layer when a Connection writes into it: shared, 13 of 1,000 lab hosts failed
    with "No attribute or config key found for 'gateway'". One per thread, reused within it."""
    import threading

    from remediation.transport import fanout

    seen: list[object] = []

    def grab() -> None:
        first = fanout._fabric_config()
        assert fanout._fabric_config() is first
        seen.append(first)

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 4 and len({id(c) for c in seen}) == 4
    assert all(c.run.warn is True and c.load_ssh_configs is False for c in seen)  # type: ignore[attr-defined]


def test_building_a_connection_leaves_the_threads_config_alone() -> None:
    """Fabric's own Connection writes inline_ssh_env into its Config (no class attribute for it), and the Config then
    re-merges every layer: a tenth of the controller's CPU per host. The fan-out's Connection keeps it an attribute,
    so building connections modifies nothing that the thread's next connection reads."""
    from fabric import Connection

    fanout._THREAD.__dict__.pop("fabric_config", None)  # this thread's own, fresh
    config = fanout._fabric_config()
    FleetConnection = fanout._connection_class()
    first = FleetConnection("10.0.0.4", user="azureuser", port=22, config=config, connect_timeout=5)
    second = FleetConnection("10.0.0.5", user="ubuntu", port=2222, config=config, connect_timeout=5)
    assert config._modifications == {}  # type: ignore[attr-defined]
    assert (first.host, first.user, first.port) == ("10.0.0.4", "azureuser", 22)
    assert (second.host, second.user, second.port, second.connect_timeout) == ("10.0.0.5", "ubuntu", 2222, 5)
    assert second.inline_ssh_env is config.inline_ssh_env is True  # type: ignore[attr-defined]
    assert second.gateway is None and second.config is config
    # What the subclass avoids: Fabric's own class leaves a modification behind in the same kind of Config.
    stock = fanout._fabric_config().clone()
    Connection("10.0.0.6", user="azureuser", port=22, config=stock)
    assert "inline_ssh_env" in stock._modifications  # type: ignore[attr-defined]
