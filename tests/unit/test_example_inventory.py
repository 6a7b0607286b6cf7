"""inventories/example: the static inventory parses with Ansible's own tools, and every variable its group_vars sets
or shows is documented (a role's meta/argument_specs.yml option or a flow variable of
remediation.transport.fleetvars)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from remediation.transport.fleetvars import FLOW_VARIABLES
from remediation.transport.inventory import load

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventories" / "example"
GROUP_VARS = EXAMPLE / "group_vars" / "gpu.yml"
CONNECTION = {"ansible_host", "ansible_user", "ansible_become", "ansible_port", "ansible_python_interpreter",
              "ansible_ssh_common_args"}


def _role_options() -> set[str]:
    names: set[str] = set()
    for spec in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        for entry in (yaml.safe_load(spec.read_text()).get("argument_specs") or {}).values():
            names.update((entry.get("options") or {}).keys())
    return names


def test_the_example_inventory_parses_with_ansible_inventory() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(EXAMPLE / "hosts.yml"), "--list"],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[WARNING]" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data["gpu"]["children"]) == {"gpu_a100", "gpu_h100"}
    hostvars = data["_meta"]["hostvars"]
    assert set(hostvars) == {"gpu-vm-01", "gpu-vm-02", "gpu-vm-11"}
    assert hostvars["gpu-vm-01"]["nvidia_driver_expected_version"] == "535.183.01"  # group_vars/gpu.yml applies
    assert hostvars["gpu-vm-01"]["azure_vm_size"] == "Standard_NC24ads_A100_v4"
    assert hostvars["gpu-vm-11"]["gpufleet_cordoned"] is True
    hosts = load(str(EXAMPLE / "hosts.yml"), "gpu")  # the product's own loader reads it as a fleet
    assert sorted(h.name for h in hosts) == ["gpu-vm-01", "gpu-vm-02", "gpu-vm-11"]


def test_every_group_variable_is_a_documented_role_or_flow_variable() -> None:
    text = GROUP_VARS.read_text()
    live = set((yaml.safe_load(text) or {}).keys())
    shown = set(re.findall(r"^# ([a-z][a-z0-9_]+): ", text, re.M))
    documented = _role_options() | set(FLOW_VARIABLES)
    assert live, "group_vars/gpu.yml sets nothing"
    assert not (live | shown) - documented - CONNECTION, sorted((live | shown) - documented - CONNECTION)
    # The variables a fleet has to decide on are there, live or shown.
    for name in ("nvidia_driver_expected_version", "driver_restore_method", "gpu_kernel_update_module_source",
                 "nvidia_driver_restore_module_source", "kernel_update_batch", "harden_batch",
                 "gpu_kernel_hold_flavour", "azure_nvidia_driver_extension_version"):
        assert name in live | shown, name


def test_role_variables_in_the_example_have_values_their_specs_allow() -> None:
    live = yaml.safe_load(GROUP_VARS.read_text())
    for spec in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        options = yaml.safe_load(spec.read_text())["argument_specs"]["main"]["options"]
        for name, value in live.items():
            if name in options and "choices" in options[name]:
                assert value in options[name]["choices"], (name, value)


def test_every_role_default_is_in_its_argument_specs_and_back() -> None:
    for role in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        defaults = set((yaml.safe_load(role.read_text()) or {}).keys())
        spec = yaml.safe_load((role.parents[1] / "meta/argument_specs.yml").read_text())
        options = set(spec["argument_specs"]["main"]["options"])
        assert defaults == options, (role.parents[1].name, sorted(defaults ^ options))
