"""Lab hosts for Molecule scenarios: ``python -m lab.molecule up|down --scenario NAME [--hosts N]``.

Molecule's default (delegated) driver leaves provisioning to the scenario's ``create.yml``/``destroy.yml``; the
common ones in ``molecule/common/`` call this CLI. Each scenario gets a lab of its own:

* state in ``<repo>/.lab/molecule/<scenario>`` (hosts, SSH keys, known_hosts, inventory), so scenarios never
  share a host or a key, and the paths are fixed: ``molecule.yml`` can name the known_hosts file;
* an address prefix from ``SCENARIO_PREFIXES`` (fixed, for scenarios that often run side by side) or else a
  stable hash of the name into the free slots of 127.0.50 .. 127.0.59, checked against every other scenario's
  recorded prefix and against listeners;
* the cached base image from ``GPULAB_CACHE_DIR`` or ``<repo>/.lab/cache`` (shared with the test suite).

``up`` always starts from fresh hosts (a leftover lab of the same scenario is purged first) and writes Molecule's
instance config (``$MOLECULE_INSTANCE_CONFIG``: a YAML list of ``{instance, address, user, port,
identity_file}``). Host keys stay verified: the scenario's ``driver.ssh_connection_options`` point at this lab's
known_hosts with ``StrictHostKeyChecking=yes``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from .config import LOGIN_USER, LabConfig, test_prefix
from .control import PROJECT_ROOT, Lab
from .errors import LabError

SLOTS = tuple(test_prefix(f"127.0.{n}") for n in range(50, 60))
# Fixed prefixes for scenarios that run side by side in CI; the others hash into the remaining slots.
SCENARIO_PREFIXES = {
    "gpu_probe_timer": test_prefix("127.0.50"),
}
SCENARIO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PREFIX_FILE = "address_prefix"


def state_root(root: Path = PROJECT_ROOT) -> Path:
    return root / ".lab" / "molecule"


def state_dir(scenario: str, root: Path = PROJECT_ROOT) -> Path:
    if not SCENARIO_RE.match(scenario):
        raise LabError(f"scenario name {scenario!r} is not a plain name (letters, digits, _ . -)")
    return state_root(root) / scenario


def known_hosts(scenario: str, root: Path = PROJECT_ROOT) -> Path:
    """The known_hosts file of a scenario's lab (what ``molecule.yml`` names in its SSH options)."""
    return state_dir(scenario, root) / "ssh" / "known_hosts"


def _claimed(root: Path, scenario: str) -> dict[str, str]:
    """prefix -> scenario, for every other scenario whose lab state records one."""
    claims: dict[str, str] = {}
    base = state_root(root)
    if not base.is_dir():
        return claims
    for path in base.glob(f"*/{PREFIX_FILE}"):
        other = path.parent.name
        if other == scenario or not (path.parent / "hosts").is_dir():
            continue
        claims[path.read_text().strip()] = other
    return claims


def _listening(prefix: str) -> bool:
    try:
        with socket.create_connection((f"{prefix}.1", 22), timeout=0.2):
            return True
    except OSError:
        return False


def address_prefix(scenario: str, root: Path = PROJECT_ROOT) -> str:
    """The scenario's prefix: its recorded one, its fixed one, or the first free slot from its hash."""
    recorded = state_dir(scenario, root) / PREFIX_FILE
    claims = _claimed(root, scenario)
    if scenario in SCENARIO_PREFIXES:
        prefix = SCENARIO_PREFIXES[scenario]
        if prefix in claims:
            raise LabError(
                f"address prefix {prefix} of scenario {scenario} is held by scenario {claims[prefix]}:"
                f" run `python -m lab.molecule down --scenario {claims[prefix]}`"
            )
        return prefix
    if recorded.exists() and (recorded.parent / "hosts").is_dir():
        return recorded.read_text().strip()
    free = [s for s in SLOTS if s not in SCENARIO_PREFIXES.values()]
    start = int(hashlib.sha256(scenario.encode()).hexdigest(), 16) % len(free)
    for prefix in free[start:] + free[:start]:
        if prefix not in claims and not _listening(prefix):
            return prefix
    raise LabError(
        f"no free lab address prefix for scenario {scenario} in {SLOTS[0]}..{SLOTS[-1]}: taken by"
        f" {', '.join(sorted(set(claims.values())))}; destroy one of them"
    )


def make_lab(
    scenario: str, root: Path = PROJECT_ROOT, prefix: str | None = None, without_pynvml: Sequence[str] = ()
) -> Lab:
    state = state_dir(scenario, root)
    cache = os.environ.get("GPULAB_CACHE_DIR") or str(root / ".lab" / "cache")
    cfg = LabConfig.from_mapping(
        {
            "state_dir": str(state),
            "cache_dir": cache,
            "address_prefix": prefix or address_prefix(scenario, root),
            "boot_delay": 0.3,
            "inventory_path": str(state / "inventory" / "hosts.yml"),
            "flavour": "generic",
            "host_overrides": {name: {"pynvml": False} for name in without_pynvml},
        },
        root=root,
    )
    return Lab(cfg)


def instance_config(lab: Lab) -> list[dict[str, object]]:
    return [
        {
            "instance": host.name,
            "address": host.address,
            "user": LOGIN_USER,
            "port": 22,
            "identity_file": str(lab.paths.client_key),
        }
        for host in lab.lab_hosts()
    ]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def up(
    scenario: str,
    hosts: int,
    instance_config_path: Path | None,
    root: Path = PROJECT_ROOT,
    without_pynvml: Sequence[str] = (),
) -> Lab:
    names = [f"gpu-{i}" for i in range(1, hosts + 1)]
    strays = sorted(set(without_pynvml) - set(names))
    if strays:
        raise LabError(
            f"--without-pynvml {', '.join(strays)}: not one of this scenario's hosts ({names[0]} .. {names[-1]})"
        )
    prefix = address_prefix(scenario, root)
    lab = make_lab(scenario, root, prefix, without_pynvml)
    if lab.existing_hosts():  # Molecule scenarios start from fresh hosts: purge what a failed run left
        lab.down(purge=True)
    lab.paths.state.mkdir(parents=True, exist_ok=True)
    _write(lab.paths.state / PREFIX_FILE, prefix + "\n")
    lab.up(hosts)
    if instance_config_path is not None:
        _write(instance_config_path, yaml.safe_dump(instance_config(lab), sort_keys=False))
    return lab


def down(scenario: str, instance_config_path: Path | None, root: Path = PROJECT_ROOT) -> list[str]:
    state = state_dir(scenario, root)
    stopped: list[str] = []
    prefix_file = state / PREFIX_FILE
    if state.is_dir():
        prefix = prefix_file.read_text().strip() if prefix_file.exists() else SLOTS[0]
        stopped = make_lab(scenario, root, prefix).down(purge=True)
        prefix_file.unlink(missing_ok=True)
    if instance_config_path is not None:
        _write(instance_config_path, "[]\n")
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.molecule", description=__doc__.split("\n")[0])
    parser.add_argument("verb", choices=["up", "down", "prefix", "known-hosts"])
    parser.add_argument("--scenario", required=True, help="Molecule scenario name (one lab per scenario)")
    parser.add_argument("--hosts", type=int, default=2, help="hosts gpu-1 .. gpu-N (up)")
    parser.add_argument(
        "--without-pynvml",
        action="append",
        default=[],
        metavar="HOST",
        help="a host whose image has no pynvml, as a stock Azure Ubuntu image (up; repeatable)",
    )
    parser.add_argument(
        "--instance-config",
        default=os.environ.get("MOLECULE_INSTANCE_CONFIG"),
        help="Molecule instance config to write (default: $MOLECULE_INSTANCE_CONFIG)",
    )
    args = parser.parse_args(argv)
    path = Path(args.instance_config) if args.instance_config else None
    try:
        if args.verb == "up":
            lab = up(args.scenario, args.hosts, path, without_pynvml=args.without_pynvml)
            print(f"{args.scenario}: {args.hosts} host(s) on {lab.cfg.address_prefix}.N,"
                  f" known_hosts {lab.paths.known_hosts}")
        elif args.verb == "down":
            stopped = down(args.scenario, path)
            print(f"{args.scenario}: stopped {len(stopped)} host(s)")
        elif args.verb == "prefix":
            print(address_prefix(args.scenario))
        else:
            print(known_hosts(args.scenario))
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
