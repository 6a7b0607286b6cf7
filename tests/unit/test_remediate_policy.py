"""The closed loop's policy (remediation.remediate.policy) and maintenance windows (remediation.remediate.windows):
the defaults, the refusals (one line naming the setting), groups over fleets, windows across midnight and zones."""

from __future__ import annotations

import datetime as _dt
from zoneinfo import ZoneInfo

import pytest

from remediation.config import RemediateSettings, defaults, load_section
from remediation.core import catalog
from remediation.core.errors import UsageError
from remediation.core.exitcodes import ExitCode
from remediation.host.harden import REMEDIES
from remediation.remediate.policy import Action, Level, action_for, default_level, parse_policy
from remediation.remediate.windows import parse_window

UTC = _dt.UTC


def test_defaults_harden_findings_and_driver_not_loaded_are_auto_hardware_is_not() -> None:
    assert set(REMEDIES) == {"GPU-KRN-002", "GPU-KRN-003", "GPU-KRN-004"}
    for finding in REMEDIES:
        assert default_level(finding) is Level.AUTO
        assert action_for(finding).action is Action.HARDEN and not action_for(finding).reboot
    assert default_level("GPU-DRV-001") is Level.AUTO
    assert action_for("GPU-DRV-001").action is Action.DRIVER_RESTORE and action_for("GPU-DRV-001").reboot
    hardware = [i for i in catalog.CATALOG if i.startswith("GPU-HW-")]
    assert len(hardware) == 8
    for finding in hardware:
        assert default_level(finding) is Level.PROPOSE and action_for(finding).action is Action.ESCALATE
    assert default_level("GPU-KRN-006") is Level.OBSERVE  # an info finding
    assert default_level("GPU-THM-001") is Level.PROPOSE and action_for("GPU-THM-001").action is Action.MANUAL
    assert default_level("GPU-DRV-002") is Level.PROPOSE  # a reboot nobody asked to automate


@pytest.mark.parametrize("finding", ["GPU-HW-001", "GPU-HW-002", "GPU-HW-003", "GPU-HW-004", "GPU-HW-005"])
def test_auto_for_a_hardware_finding_is_refused_with_one_line(finding: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_policy({"gpu": {"levels": {finding: "auto"}}}, "gpu", "/etc/site.yaml")
    text = str(err.value)
    assert text.startswith(f"setting remediate.policy.gpu.levels.{finding}: auto is refused for a hardware finding")
    assert "set propose or observe" in text and text.endswith("(in /etc/site.yaml)") and "\n" not in text
    assert err.value.exit_code == ExitCode.BAD_INPUT


def test_auto_for_a_hardware_finding_is_refused_in_a_group_too() -> None:
    with pytest.raises(UsageError, match=r"remediate\.policy\.gpu\.groups\.canary\.levels\.GPU-HW-003: auto"):
        parse_policy({"gpu": {"groups": {"canary": {"levels": {"GPU-HW-003": "auto"}}}}}, "gpu")


@pytest.mark.parametrize(
    ("policy", "needle"),
    [
        ({"gpu": {"levels": {"GPU-NOPE-001": "auto"}}}, "levels.GPU-NOPE-001: 'GPU-NOPE-001' is not a finding ID"),
        ({"gpu": {"levels": {"GPU-KRN-002": "sometimes"}}}, "levels.GPU-KRN-002 'sometimes' must be observe, propose"),
        ({"gpu": {"levels": {"GPU-THM-001": "auto"}}}, "auto is refused: the loop has no action for GPU-THM-001"),
        ({"gpu": {"level": {}}}, "unknown setting remediate.policy.gpu.level; known: levels, windows, groups"),
        ({"gpu": ["auto"]}, "setting remediate.policy.gpu must be a mapping"),
        ({"gpu": {"levels": ["GPU-KRN-002"]}}, "setting remediate.policy.gpu.levels must map finding IDs"),
        ({"gpu": {"groups": {"a": {"windows": {}}}}}, "remediate.policy.gpu.groups.a.windows must be a list"),
        ({"gpu": {"windows": [{"days": ["sat"], "start": "02:00"}]}}, "windows[0] has no end"),
        ({"gpu": {"windows": [{"days": ["sat"], "start": "02:00", "end": "4", "zone": "UTC"}]}},
         "windows[0].end '4' is not a time of day"),
    ],
)
def test_bad_policy_is_one_line_naming_the_setting(policy: dict[str, object], needle: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_policy(policy, "gpu")
    assert needle in str(err.value) and "\n" not in str(err.value) and str(err.value).endswith("(in invoke.yaml)")


def test_fleet_levels_override_defaults_and_groups_override_the_fleet() -> None:
    policy = parse_policy(
        {"gpu": {"levels": {"GPU-DRV-002": "auto", "gpu-krn-003": "propose"},
                 "groups": {"canary": {"levels": {"GPU-KRN-002": "observe"}},
                            "prod": {"levels": {"GPU-KRN-002": "propose", "GPU-DRV-002": "propose"}}}},
         "other": {"levels": {"GPU-KRN-002": "observe"}}},
        "gpu",
    )
    assert policy.level("GPU-DRV-002") == (Level.AUTO, "policy gpu")
    assert policy.level("GPU-KRN-003") == (Level.PROPOSE, "policy gpu")  # IDs are matched in any case
    assert policy.level("GPU-KRN-004") == (Level.AUTO, "default")
    assert policy.level("GPU-KRN-002", ["prod"]) == (Level.PROPOSE, "policy gpu, group prod")
    # two groups disagree: the most cautious wins
    assert policy.level("GPU-KRN-002", ["prod", "canary"]) == (Level.OBSERVE, "policy gpu, group canary")
    assert policy.level("GPU-KRN-002", ["elsewhere"]) == (Level.AUTO, "default")
    assert parse_policy(None, "gpu").level("GPU-KRN-002") == (Level.AUTO, "default")
    assert parse_policy({"other": {}}, "gpu").levels == {}


def test_group_windows_replace_the_fleets() -> None:
    fleet_w = {"days": "daily", "start": "01:00", "end": "02:00"}
    group_w = {"days": ["sun"], "start": "03:00", "end": "04:00", "zone": "Asia/Tokyo"}
    policy = parse_policy({"gpu": {"windows": [fleet_w], "groups": {"tokyo": {"windows": [group_w]}}}}, "gpu")
    assert [w.describe() for w in policy.windows_for(["other"])] == ["daily 01:00-02:00 UTC"]
    assert [w.describe() for w in policy.windows_for(["tokyo", "other"])] == ["sun 03:00-04:00 Asia/Tokyo"]


def test_a_window_within_one_day() -> None:
    w = parse_window({"days": ["sat", "Sunday"], "start": "02:00", "end": "06:00"}, "w")
    sat = _dt.datetime(2025, 6, 7, tzinfo=UTC)  # a Saturday
    assert sat.weekday() == 5
    assert w.contains(sat.replace(hour=2)) and w.contains(sat.replace(hour=5, minute=59))
    assert not w.contains(sat.replace(hour=6)) and not w.contains(sat.replace(hour=1, minute=59))
    assert w.contains(sat.replace(day=8, hour=3)) and not w.contains(sat.replace(day=9, hour=3))  # Sun yes, Mon no
    assert w.next_start(sat.replace(hour=7)) == sat.replace(day=8, hour=2)
    assert w.describe() == "sat,sun 02:00-06:00 UTC"


def test_a_window_across_midnight_belongs_to_the_day_it_opens() -> None:
    w = parse_window({"days": ["fri"], "start": "22:00", "end": "04:00"}, "w")
    fri = _dt.datetime(2025, 6, 6, tzinfo=UTC)
    assert fri.weekday() == 4 and w.crosses_midnight
    assert w.contains(fri.replace(hour=22)) and w.contains(fri.replace(hour=23, minute=59))
    assert w.contains(fri.replace(day=7, hour=0)) and w.contains(fri.replace(day=7, hour=3, minute=59))
    assert not w.contains(fri.replace(day=7, hour=4)) and not w.contains(fri.replace(day=7, hour=22))  # not Sat
    assert not w.contains(fri.replace(hour=3))  # Friday early morning belongs to Thursday's night
    assert not w.contains(fri.replace(hour=21, minute=59))


def test_a_window_in_a_named_zone_follows_its_clock_and_daylight_saving() -> None:
    w = parse_window({"days": ["sun"], "start": "02:00", "end": "03:00", "zone": "America/New_York"}, "w")
    winter = _dt.datetime(2025, 1, 12, 7, 30, tzinfo=UTC)  # Sun 02:30 EST (UTC-5)
    summer = _dt.datetime(2025, 7, 13, 6, 30, tzinfo=UTC)  # Sun 02:30 EDT (UTC-4)
    assert w.contains(winter) and w.contains(summer)
    assert not w.contains(winter.replace(hour=6, minute=30)) and not w.contains(summer.replace(hour=7, minute=30))
    berlin = _dt.datetime(2025, 7, 13, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"))  # 00:30 UTC, 20:30 Sat New York
    assert not w.contains(berlin)
    with pytest.raises(ValueError, match="aware"):
        w.contains(_dt.datetime(2025, 7, 13, 2, 30))


@pytest.mark.parametrize(
    ("window", "needle"),
    [
        ({"days": ["sat"], "start": 120, "end": "06:00"}, "w.start 120 is a number: quote the time"),
        ({"days": ["sat"], "start": "25:00", "end": "06:00"}, "w.start '25:00' is not a time of day"),
        ({"days": ["someday"], "start": "01:00", "end": "06:00"}, "w.days: 'someday' is not a weekday"),
        ({"days": [], "start": "01:00", "end": "06:00"}, "w.days must list weekdays"),
        ({"days": ["sat"], "start": "01:00", "end": "06:00", "zone": "Mars/Olympus"},
         "w.zone 'Mars/Olympus' is not a time zone: write UTC or an IANA name"),
        ({"days": ["sat"], "start": "01:00", "end": "06:00", "zone": "../../etc/passwd"}, "is not a time zone"),
        ({"days": ["sat"], "start": "01:00", "end": "06:00", "tz": "UTC"}, "unknown setting w.tz"),
    ],
)
def test_a_bad_window_is_one_line(window: dict[str, object], needle: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_window(window, "w")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_settings_section_round_trips_and_takes_nested_invoke_config() -> None:
    assert load_section(RemediateSettings, defaults(RemediateSettings), "remediate") == RemediateSettings()
    from invoke import Config

    config = Config(overrides={"remediate": {"attempts": "5", "policy": {"gpu": {"levels": {"GPU-DRV-001": "propose"},
                                                                                 "windows": [{"days": "sat"}]}}}})
    cfg = load_section(RemediateSettings, config.get("remediate"), "remediate")
    assert cfg.attempts == 5
    assert cfg.policy == {"gpu": {"levels": {"GPU-DRV-001": "propose"}, "windows": [{"days": "sat"}]}}
    assert type(cfg.policy["gpu"]) is dict
    with pytest.raises(UsageError, match=r"setting remediate\.attempts 0: give a number above 0"):
        load_section(RemediateSettings, {"attempts": 0}, "remediate")
