"""The ``gpufleet.remediation.gpu_facts`` Ansible module (plugins/modules/gpu_facts.py) on a 2-host lab of its own
(127.0.44.N).

It runs through the project's ansible.cfg (``collections_path = collections``: the checkout is the collection), over
SSH with host keys checked, exactly as AWX or ``ansible-playbook`` from the repository root would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.faults import inject
from remediation.core.skus import expected_gpu_count
from remediation.hostside import pynvml_packed
from tests.conftest import ROOT, make_lab, require_lab, ssh

BIN = Path(sys.executable).parent
MODULE = "gpufleet.remediation.gpu_facts"


def ansible_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "HOME": str(home),
            "ANSIBLE_HOME": str(home / ".ansible"),
            "ANSIBLE_NOCOLOR": "1",
        }
    )
    return env


def run_module(lab: Any, home: Path, *args: str, limit: str = "gpu") -> dict[str, dict[str, Any]]:
    """``ansible <limit> -m gpufleet.remediation.gpu_facts`` from the repository root; per-host results from the
    tree callback."""
    tree = home / f"tree-{len(list(home.glob('tree-*')))}"
    proc = subprocess.run(
        [str(BIN / "ansible"), limit, "-i", str(lab.cfg.inventory_path), "-m", MODULE, "-t", str(tree), *args],
        cwd=ROOT, env=ansible_env(home), capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {p.name: json.loads(p.read_text()) for p in tree.iterdir()}


@pytest.fixture(scope="module")
def facts_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_lab()
    # gpu-2 runs a stock Azure Ubuntu image: no pynvml, so the module uses the copy its action plugin sends.
    lab = make_lab(tmp_path_factory.mktemp("gpu-facts-lab"), "127.0.44", 2,
                   host_overrides={"gpu-2": {"pynvml": False}})
    try:
        yield lab
    finally:
        lab.down(purge=True)


@pytest.mark.lab
def test_facts_of_healthy_hosts(facts_lab: Any, tmp_path: Path) -> None:
    results = run_module(facts_lab, tmp_path, "-a", "nvml_timeout=5")
    assert sorted(results) == ["gpu-1", "gpu-2"]
    for host, result in results.items():
        assert result["changed"] is False
        facts = result["ansible_facts"]["gpufleet"]
        booted = facts_lab.host_path(host, "/run/gpulab/kernel").read_text().strip()
        assert facts["schema"] == "gpufleet.facts/1"
        assert facts["hostname"] == host
        assert facts["system"]["kernel"] == booted
        assert booted in [k["release"] for k in facts["packages"]["kernels"]]
        nvml = facts["nvml"]
        assert nvml["ok"] is True, nvml
        assert nvml["error_class"] == "none"
        assert nvml["device_count"] == 2 == expected_gpu_count(facts_lab.cfg.sku)
        assert [g["index"] for g in nvml["gpus"]] == [0, 1]
        assert facts["errors"] == []
    # gpu-2 has no pynvml of its own: NVML answered above through the controller's copy, which no result shows.
    own = ssh(facts_lab, "gpu-2", "python3 -c 'import pynvml'")
    assert own.returncode != 0 and "No module named 'pynvml'" in own.stderr
    assert ssh(facts_lab, "gpu-1", "python3 -c 'import pynvml'").returncode == 0
    packed = pynvml_packed()
    assert packed is not None and packed not in json.dumps(results)


@pytest.mark.lab
def test_check_mode_collects_the_same_facts_read_only(facts_lab: Any, tmp_path: Path) -> None:
    results = run_module(facts_lab, tmp_path, "--check", "--limit", "gpu-1")
    assert list(results) == ["gpu-1"]
    assert results["gpu-1"]["changed"] is False
    assert results["gpu-1"]["ansible_facts"]["gpufleet"]["nvml"]["ok"] is True


@pytest.mark.lab
def test_thermal_fault_shows_in_the_facts(facts_lab: Any, tmp_path: Path) -> None:
    inject(facts_lab, "gpu-2", "thermal")
    try:
        results = run_module(facts_lab, tmp_path)
        hot = results["gpu-2"]["ansible_facts"]["gpufleet"]["nvml"]["gpus"]
        assert hot[0]["temperature_c"] == 86
        assert "hw_thermal_slowdown" in hot[0]["clocks_event_reasons"]["active"]
        cool = results["gpu-1"]["ansible_facts"]["gpufleet"]["nvml"]["gpus"]
        assert cool[0]["temperature_c"] < 86  # the fault is gpu-2's alone
    finally:
        facts_lab.clear("gpu-2")


@pytest.mark.lab
def test_bad_option_fails_before_probing(facts_lab: Any, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(BIN / "ansible"), "gpu-1", "-i", str(facts_lab.cfg.inventory_path), "-m", MODULE,
         "-a", "nvml_timeout=0"],
        cwd=ROOT, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode != 0
    assert "nvml_timeout must be a positive number" in proc.stdout + proc.stderr


def test_module_ships_the_probe_package_itself_as_module_utils(tmp_path: Path) -> None:
    """The collection's module_utils is what Ansible packs: the payload's gpuprobe/ IS the probe package, every
    module of it (the link plugins/module_utils/gpuprobe -> remediation/hostside/gpuprobe; the package's modules
    import each other relatively, which AnsiballZ follows)."""
    remote_tmp = tmp_path / "remote"
    env = ansible_env(tmp_path) | {"ANSIBLE_KEEP_REMOTE_FILES": "1", "ANSIBLE_PIPELINING": "0"}
    proc = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-c", "local", "-m", MODULE, "-a", "nvml_timeout=2",
         "-e", f"ansible_remote_tmp={remote_tmp}", "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wrapper,) = remote_tmp.glob("*/AnsiballZ_gpu_facts.py")
    subprocess.run([sys.executable, str(wrapper), "explode"], cwd=wrapper.parent, check=True, capture_output=True)
    utils = wrapper.parent / "debug_dir" / "ansible_collections" / "gpufleet" / "remediation" / "plugins"
    utils = utils / "module_utils"
    probe = ROOT / "remediation" / "hostside" / "gpuprobe"
    # Every module the import of the package reaches (__main__ is the command line's alone).
    wanted = sorted(p.name for p in probe.glob("*.py") if p.name != "__main__.py")
    assert sorted(p.name for p in (utils / "gpuprobe").glob("*.py")) == wanted
    for name in wanted:
        assert (utils / "gpuprobe" / name).read_bytes() == (probe / name).read_bytes(), name
