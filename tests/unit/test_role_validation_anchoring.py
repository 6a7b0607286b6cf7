"""Issue 20, item 9: the roles' regex checks are anchored at the very end (``\\Z``), so a value with a newline
(apt preferences / apt.conf injection) is refused before anything is written.

The real role runs with ansible-playbook on the controller itself (connection local, the project's ansible.cfg):
the nvidia_driver_pin role with its pin file in a temporary directory, and the gpu_kernel_hold checks (its
``validate`` entry point: the role's other tasks change dpkg's holds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def play(
    tmp_path: Path, role: str, variables: dict[str, Any], tasks_from: str = "main"
) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False, "connection": "local",
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": [{"ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from}}],
    }]))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", "localhost,", str(playbook), "-e", json.dumps(variables)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"nvidia_driver_pin_version": "535.183.01\n"},
        {"nvidia_driver_pin_version": "535.183.01\nPackage: *\nPin: release a=evil\nPin-Priority: 1001"},
        {"nvidia_driver_pin_packages": ["nvidia-*\n"]},
        {"nvidia_driver_pin_packages": ["/nvidia\nPackage: *\nPin: version 1*/"]},
    ],
    ids=["version-trailing-newline", "version-stanza", "package-trailing-newline", "regex-package-stanza"],
)
def test_driver_pin_refuses_a_newline_before_writing(tmp_path: Path, bad: dict[str, Any]) -> None:
    pin = tmp_path / "gpufleet-nvidia-driver"
    variables = {"nvidia_driver_pin_enabled": True, "nvidia_driver_pin_version": "535.183.01",
                 "nvidia_driver_pin_path": str(pin), **bad}
    proc = play(tmp_path, "nvidia_driver_pin", variables)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-2000:]
    assert "nvidia_driver_pin_version must be an NVIDIA driver version" in " ".join(output.split()), output[-2000:]
    assert not pin.exists()


def test_driver_pin_accepts_plain_values(tmp_path: Path) -> None:
    variables = {"nvidia_driver_pin_enabled": True, "nvidia_driver_pin_version": "535.183.01",
                 "nvidia_driver_pin_packages": ["nvidia-*", "/^libnvidia-/"]}
    proc = play(tmp_path, "nvidia_driver_pin", variables, tasks_from="validate")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"gpu_kernel_hold_kernel_release": "6.5.0-44-generic\n"}, "is not a kernel release"),
        ({"gpu_kernel_hold_kernel_release": "\n"}, "is not a kernel release"),
        ({"gpu_kernel_hold_flavour": "generic\n"}, "is not a kernel flavour"),
        ({"gpu_kernel_hold_flavour": "\n"}, "is not a kernel flavour"),
        ({"gpu_kernel_hold_extra_packages": ["linux-tools-azure\n"]}, "not a dpkg package name"),
        ({"gpu_kernel_hold_extra_packages": ["libnvidia-gl-535:i386"]}, "not a dpkg package name"),
    ],
)
def test_kernel_hold_refuses_a_newline(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    proc = play(tmp_path, "gpu_kernel_hold", bad, tasks_from="validate")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and message in " ".join(output.split()), output[-2000:]


def test_kernel_hold_accepts_plain_and_empty_values(tmp_path: Path) -> None:
    for variables in ({"gpu_kernel_hold_kernel_release": "6.5.0-44-generic", "gpu_kernel_hold_flavour": "generic",
                       "gpu_kernel_hold_extra_packages": ["linux-tools-azure", "libstdc++6", "g++-12"]},
                      {"gpu_kernel_hold_kernel_release": "", "gpu_kernel_hold_flavour": ""}):
        proc = play(tmp_path, "gpu_kernel_hold", variables, tasks_from="validate")
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
