"""The typed config layer (remediation.config) and the task modules that read it (commands/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.config import (
    AuditSettings,
    RestoreSettings,
    check_config_file,
    defaults,
    fleets_from_mapping,
    load_section,
    positive,
)
from remediation.core.errors import UsageError


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


@pytest.mark.parametrize("value", [5, "gpu", ["gpu"], True])
def test_a_section_of_the_wrong_shape_names_the_key_and_the_file(value: object) -> None:
    with pytest.raises(UsageError, match=r"setting audit must be a mapping .*\(in /etc/site\.yaml\)"):
        load_section(AuditSettings, value, "audit", "/etc/site.yaml")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"setting fleets must be a mapping .*\(in site\.yaml\)"):
        fleets_from_mapping(value, "site.yaml")  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["concurrency", "timeout", "nvml_timeout", "connect_timeout"])
@pytest.mark.parametrize("value", [0, -5, "0", "nan", "inf"])
def test_audit_numbers_must_be_above_zero(key: str, value: object) -> None:
    with pytest.raises(UsageError, match=rf"setting audit\.{key} .*(above 0|must be a number).* \(in invoke\.yaml\)"):
        load_section(AuditSettings, {key: value}, "audit")


def test_positive_takes_numbers_above_zero_only() -> None:
    assert positive("2.5", float, "--timeout") == 2.5 and positive(3, int, "--concurrency") == 3
    for bad in ("0", "-1", "x", None, True, "1e999", "2.5"):
        with pytest.raises(UsageError, match=r"^--concurrency .*above 0$"):
            positive(bad, int, "--concurrency")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (b"a: [1\n", "not valid YAML (line 2, column 1"),
        (b"- 1\n", "must be a mapping of sections"),
        (b"audit: 5\n", "setting audit must be a mapping"),
        (b"audit:\n", "setting audit must be a mapping"),
        (b"audit:\n  x: \xff\n", "not UTF-8"),
    ],
)
def test_check_config_file_refuses_what_invoke_cannot_load(text: bytes, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "invoke.yaml"
    path.write_bytes(text)
    with pytest.raises(UsageError) as err:
        check_config_file(path, ("audit", "fleets"))
    assert needle in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_check_config_file_accepts_the_projects_own_and_a_missing_one(tmp_path: Path) -> None:
    from commands import SECTIONS

    check_config_file(Path(__file__).resolve().parents[2] / "invoke.yaml", SECTIONS)
    check_config_file(tmp_path / "absent.yaml", SECTIONS)


def test_the_checkouts_config_puts_its_own_collection_first_and_paths_under_the_project(tmp_path: Path) -> None:
    """In the checkout (Invoke's project location), ``ansible.collections_path: collections`` is the checkout's link
    to itself, first on the runs' collections path; outside a project, relative paths are under the working dir."""
    from invoke import Config, Context

    from commands import project_dir, under_project, with_collections
    from commands.namespace import ns
    from remediation.transport import runner

    root = Path(__file__).resolve().parents[2]
    config = Config(project_location=str(root))
    config.load_collection(ns.configuration())
    config.load_project()
    seen: list[Path] = []

    @with_collections
    def task(c: Context) -> None:
        seen.extend(runner.collections_path({"ANSIBLE_COLLECTIONS_PATH": str(tmp_path)}))

    task(Context(config))
    assert seen[0] == root / "collections" and seen[-1] == tmp_path
    assert (seen[0] / "ansible_collections" / "gpufleet" / "remediation").resolve() == root
    assert under_project(Context(config), ".audit") == root / ".audit"
    outside = Config()
    assert project_dir(Context(outside)) == Path.cwd()
    assert under_project(Context(outside), "/srv/inventory.yml") == Path("/srv/inventory.yml")
