"""The typed config layer (remediation.config) and the task modules that read it (commands/)."""

from __future__ import annotations

import pytest

from remediation.config import AuditSettings, RestoreSettings, defaults, fleets_from_mapping, load_section
from remediation.errors import UsageError


def test_missing_keys_take_the_dataclass_defaults() -> None:
    assert load_section(AuditSettings, None, "audit") == AuditSettings()
    assert load_section(AuditSettings, {"concurrency": "8"}, "audit").concurrency == 8


def test_values_are_coerced_to_their_declared_types() -> None:
    cfg = load_section(RestoreSettings, {"batch": "3", "lock_ttl_s": 60, "method": "apt"}, "driver_restore")
    assert (cfg.batch, cfg.lock_ttl_s, cfg.method) == (3, 60.0, "apt")
    assert isinstance(cfg.lock_ttl_s, float)


def test_an_unknown_key_names_the_setting_and_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"audit\.concurency .*known audit settings: .*concurrency"):
        load_section(AuditSettings, {"concurency": 8}, "audit")


@pytest.mark.parametrize(("key", "value"), [("concurrency", "many"), ("timeout", [1]), ("concurrency", True)])
def test_a_value_of_the_wrong_type_names_the_setting(key: str, value: object) -> None:
    with pytest.raises(UsageError, match=rf"setting audit\.{key} must be a number"):
        load_section(AuditSettings, {key: value}, "audit")


def test_defaults_round_trip_through_load_section() -> None:
    for cls, name in ((AuditSettings, "audit"), (RestoreSettings, "driver_restore")):
        assert load_section(cls, defaults(cls), name) == cls()


def test_fleets_take_their_name_as_the_default_group() -> None:
    fleets = fleets_from_mapping({"gpu": {"inventory": "inv.yml"}, "a100": {"inventory": "x.yml", "group": "nd"}})
    assert fleets["gpu"].group_name == "gpu"
    assert fleets["a100"].group_name == "nd"
    with pytest.raises(UsageError, match=r"fleets\.gpu must be a mapping"):
        fleets_from_mapping({"gpu": "inventories/lab/hosts.yml"})


def test_the_fault_help_lists_exactly_the_lab_faults() -> None:
    from commands.lab import FAULTS
    from lab.faults import FAULTS as LAB_FAULTS
    from lab.faults import LATENT, WORKLOADS

    assert tuple(FAULTS) == (*LAB_FAULTS, *WORKLOADS, *LATENT)
