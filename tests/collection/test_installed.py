"""The project as users install it, run from an empty directory: the built wheel in a fresh virtualenv (``gpufleet``,
the library, its templates as package data) and the built collection installed with ``ansible-galaxy`` under a
temporary directory. No lab, no root, no network.

The fresh virtualenv gets the wheel only (``--no-deps --no-index``); the dependencies (Invoke, ansible-core, ...) are
this environment's, reached through a ``.pth`` line naming this environment's site-packages directory, which puts
that directory on the path without running the ``.pth`` files in it (so the checkout's editable install of the
project stays out). Each test checks that the library, the tasks and the templates come from the virtualenv, not
from the checkout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.collection.conftest import BIN, FQCN, Built, clean_env, install_collection, run
from tests.conftest import ROOT

#: The tasks the issue names: what `gpufleet --list` must show (with their namespaces' default task).
FLEET_TASKS = ("audit", "harden", "driver-restore", "kernel-update")


@dataclass(frozen=True)
class Installed:
    venv: Path
    site: Path  # the virtualenv's site-packages, where the wheel went
    collections: Path
    work: Path  # the working directory of every run: empty
    env: dict[str, str]

    def gpufleet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run([str(self.venv / "bin" / "gpufleet"), *args], self.work, self.env, timeout=300)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return run([str(self.venv / "bin" / "python"), "-c", code], self.work, self.env, timeout=300)


@pytest.fixture(scope="module")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("installed")
    venv, home, work, collections = tmp / "venv", tmp / "home", tmp / "work", tmp / "collections"
    work.mkdir()
    proc = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, clean_env(home, Path("/usr/bin")))
    assert proc.returncode == 0, proc.stderr
    # This environment's pip installs the wheel into the new virtualenv, with nothing else and no index.
    proc = run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
                "--no-index", str(built.wheel)], tmp, clean_env(home, BIN))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "gpufleet-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install_collection(built.tarball, collections, work, clean_env(home, BIN), BIN / "ansible-galaxy")
    env = clean_env(home, venv / "bin", ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_HOME=str(home / ".ansible"))
    return Installed(venv, site, collections, work, env)


def test_the_library_tasks_and_templates_come_from_the_install(installed: Installed) -> None:
    assert not any(str(ROOT) in value for value in installed.env.values())
    proc = installed.python(
        "import json, sys, commands.namespace, remediation, commands.cli\n"
        "from remediation.k8s.render import TEMPLATES\n"
        "from remediation.aoai.templates import TEMPLATES as AZURE\n"
        "print(json.dumps({'path': sys.path, 'lib': remediation.__file__, 'tasks': commands.namespace.__file__,\n"
        "                  'k8s': str(TEMPLATES), 'azure': str(AZURE)}))"
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    # This environment's site-packages may sit inside the checkout (CI's `.venv`): it is on the path for the
    # dependencies only (its .pth files, the editable install among them, are not run). Nothing else of the checkout is.
    deps = sysconfig.get_paths()["purelib"]
    assert not [p for p in seen["path"] if p.startswith(str(ROOT)) and p != deps], seen["path"]
    for key in ("lib", "tasks", "k8s", "azure"):
        assert seen[key].startswith(str(installed.site)), (key, seen[key])
    assert (Path(seen["k8s"]) / "training-job.yaml.j2").is_file()
    assert (Path(seen["k8s"]) / "examples" / "inference.yaml").is_file()
    assert (Path(seen["azure"]) / "aoai-metric-alerts.json").is_file()
    assert list(installed.work.iterdir()) == []


def test_gpufleet_lists_the_tasks_from_an_empty_directory(installed: Installed) -> None:
    proc = installed.gpufleet("--list")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Available tasks"), proc.stdout[:200]
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")}
    for name in FLEET_TASKS:
        assert f"{name}.run" in listed and f"({name})" in proc.stdout, name
    # The same tasks as `invoke --list` in the checkout.
    repo = run([str(BIN / "invoke"), "--list"], ROOT, {**clean_env(Path(installed.env["HOME"]), BIN),
                                                       "PYTHONPATH": str(ROOT)})
    assert repo.returncode == 0, repo.stderr
    assert listed == {line.split()[0] for line in repo.stdout.splitlines() if line.startswith("  ")}
    for name in FLEET_TASKS:
        helped = installed.gpufleet(name, "--help")
        assert helped.returncode == 0 and f"gpufleet [--core-opts] {name}" in helped.stdout, helped.stdout[:300]


def test_gpufleet_renders_a_template_from_the_package(installed: Installed) -> None:
    examples = installed.site / "remediation" / "templates" / "k8s" / "examples"
    proc = installed.gpufleet("k8s.render", "training-job", "--values", str(examples / "training-job.yaml"),
                              "--set", "gpu.count=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job,) = yaml.safe_load_all(proc.stdout)
    assert job["kind"] == "Job" and job["metadata"]["name"] == "training-job-7b"
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 2
    # Outside a project, a relative config path is under the working directory: a k8s.templates_dir of one's own.
    mine = run([str(installed.venv / "bin" / "gpufleet"), "k8s.render", "training-job"], installed.work,
               {**installed.env, "INVOKE_K8S_TEMPLATES_DIR": "my-templates"})
    assert mine.returncode == 2 and f"no template 'training-job' in {installed.work / 'my-templates'}" in mine.stderr


def test_the_collections_playbooks_resolve_by_fqcn_from_the_install(installed: Installed) -> None:
    for name in ("driver_restore", "harden", "kernel_update", "remediate_timer"):
        proc = run([str(BIN / "ansible-playbook"), "--syntax-check", f"{FQCN}.{name}"], installed.work, installed.env,
                   timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # The runner, as installed, finds the same playbooks where ansible-playbook does: the installed collection.
    proc = installed.python(
        "from remediation.transport.runner import _find_collection_playbook, collections_path, playbook_target\n"
        "for old in ('driver_restore', 'playbooks/harden.yml', 'playbooks/kernel_update.yml'):\n"
        "    print(_find_collection_playbook(playbook_target(old), collections_path()))"
    )
    assert proc.returncode == 0, proc.stderr
    base = installed.collections / "ansible_collections" / "gpufleet" / "remediation" / "playbooks"
    assert proc.stdout.split() == [str(base / f"{n}.yml") for n in ("driver_restore", "harden", "kernel_update")]
