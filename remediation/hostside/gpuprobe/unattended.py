"""unattended-upgrades: the effective apt configuration (``apt-config dump``) and its dry run."""

import re

from .common import (
    Options,  # noqa: F401 - type comments
    _which,
    run_command,
)

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Dict, List, Optional  # noqa: F401 - type comments

SIMULATE_TIMEOUT_S = 180.0

_APT_CONFIG_LINE = re.compile(r'^(?P<key>[^\s"]+?)(?P<list>::)?\s+"(?P<value>.*)";\s*$')


def parse_apt_config_dump(text):
    # type: (str) -> Dict[str, Any]
    """``apt-config dump`` -> {key: str | [str, ...]}.  ``Key:: "v";`` lines append to the list ``Key``;
    a bare ``Key "";`` line only declares the list (apt prints it before the items)."""
    values = {}  # type: Dict[str, Any]
    for raw in text.splitlines():
        line = raw.strip()
        match = _APT_CONFIG_LINE.match(line)
        if not match:
            continue
        key, value = match.group("key"), match.group("value")
        value = value.replace('\\"', '"')
        if match.group("list"):
            existing = values.get(key)
            if not isinstance(existing, list):
                existing = []
                values[key] = existing
            existing.append(value)
        elif key not in values or not isinstance(values[key], list):
            values[key] = value
    return values


def _as_list(value):
    # type: (Any) -> List[str]
    if isinstance(value, list):
        return [v for v in value if v != ""]
    if value in (None, ""):
        return []
    return [value]


def _truthy(value):
    # type: (Any) -> Optional[bool]
    if value is None or isinstance(value, list):
        return None
    return str(value).strip().lower() in ("1", "true", "yes", "on", "enable", "enabled")


def unattended_from_config(config, installed):
    # type: (Dict[str, Any], bool) -> Dict[str, Any]
    periodic = config.get("APT::Periodic::Unattended-Upgrade")
    periodic_enable = config.get("APT::Periodic::Enable")
    enabled = (
        installed
        and periodic is not None
        and not isinstance(periodic, list)
        and str(periodic).strip() not in ("", "0")
        and str(periodic_enable).strip() != "0"
    )
    return {
        "installed": installed,
        "enabled": bool(enabled),
        "periodic_unattended_upgrade": periodic if not isinstance(periodic, list) else None,
        "package_blacklist": _as_list(config.get("Unattended-Upgrade::Package-Blacklist")),
        "package_whitelist": _as_list(config.get("Unattended-Upgrade::Package-Whitelist")),
        "origins_pattern": _as_list(config.get("Unattended-Upgrade::Origins-Pattern")),
        "allowed_origins": _as_list(config.get("Unattended-Upgrade::Allowed-Origins")),
        "automatic_reboot": _truthy(config.get("Unattended-Upgrade::Automatic-Reboot")),
        "automatic_reboot_time": config.get("Unattended-Upgrade::Automatic-Reboot-Time"),
    }


def collect_unattended(options, installed_packages):
    # type: (Options, Dict[str, Any]) -> Dict[str, Any]
    installed = "unattended-upgrades" in installed_packages
    apt_config = _which("apt-config")
    if apt_config is None:
        result = unattended_from_config({}, installed)
        result["error"] = "apt-config not found"
        result["would_upgrade"] = None
        return result
    run = run_command([apt_config, "dump"], options.command_timeout)
    if run["error"] or run["rc"] != 0:
        result = unattended_from_config({}, installed)
        result["error"] = run["error"] or ("apt-config dump exited %s: %s" % (run["rc"], run["stderr"].strip()))
    else:
        result = unattended_from_config(parse_apt_config_dump(run["stdout"]), installed)
        result["error"] = None
    result["would_upgrade"] = simulate_upgrades(options) if options.simulate_upgrades else None
    return result


_UU_WILL_UPGRADE = re.compile(r"Packages that will be upgraded:\s*(.*)$")
_UU_BLACKLISTED = (
    re.compile(r"skipping blacklisted package '?([^\s']+)'?"),
    re.compile(r"Package (\S+) is blacklisted"),
)
_UU_HELD = (re.compile(r"pkg (\S+) is on hold"), re.compile(r"Package (\S+) is marked to be held back"))


def parse_unattended_dry_run(text):
    # type: (str) -> Dict[str, List[str]]
    upgrade, blacklisted, held = [], [], []  # type: List[str], List[str], List[str]
    for line in text.splitlines():
        match = _UU_WILL_UPGRADE.search(line)
        if match:
            upgrade.extend(p for p in match.group(1).split() if p not in upgrade)
            continue
        for regex, target in [(r, blacklisted) for r in _UU_BLACKLISTED] + [(r, held) for r in _UU_HELD]:
            found = regex.search(line)
            if found:
                name = found.group(1).rstrip(".")
                if name not in target:
                    target.append(name)
    return {"upgrade": upgrade, "blacklisted": blacklisted, "held": held}


def simulate_upgrades(options):
    # type: (Options) -> Dict[str, Any]
    binary = _which("unattended-upgrade")
    if binary is None:
        return {
            "ran": False,
            "rc": None,
            "error": "unattended-upgrade not found",
            "upgrade": [],
            "blacklisted": [],
            "held": [],
        }
    run = run_command([binary, "--dry-run", "-d"], SIMULATE_TIMEOUT_S)
    parsed = parse_unattended_dry_run(run["stdout"] + "\n" + run["stderr"])
    result = {"ran": True, "rc": run["rc"], "error": run["error"]}  # type: Dict[str, Any]
    result.update(parsed)
    return result
