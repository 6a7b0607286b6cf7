"""What ``ansible-galaxy collection build`` puts in the tarball, what the README's lines do, and the execution
environment's build context from ``ansible-builder create`` (no lab, no container)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.collection.conftest import BIN, FQCN, NAME, NAMESPACE, VERSION, Built, clean_env, install_collection, run
from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEPENDENCIES = {Requirement(d).name: Requirement(d) for d in PYPROJECT["project"]["dependencies"]}
EE = yaml.safe_load((ROOT / "execution-environment.yml").read_text())
HOSTSIDE = ROOT / "remediation" / "hostside"
PROBE = HOSTSIDE / "gpuprobe"  # the probe: a package
PROBE_FILES = sorted(p.name for p in PROBE.glob("*.py"))
# The collection, and nothing else of the project, at the top of the tarball.
TOP_LEVEL = {"MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.md", "SECURITY.md", "requirements.txt",
             "bindep.txt", "meta", "roles", "playbooks", "plugins", "docs", "remediation"}


def same_specifiers(a: str, b: str) -> bool:
    """``>=2.17,<2.20`` and ``>=2.17.0,<2.20.0`` are the same range."""
    def norm(spec: str) -> set[tuple[str, Version]]:
        return {(s.operator, Version(s.version)) for s in SpecifierSet(spec)}

    return norm(a) == norm(b)


def test_tarball_holds_the_collection_and_no_project_files(built: Built) -> None:
    members = built.members()
    assert {name.split("/", 1)[0] for name in members} == TOP_LEVEL
    # Every role and playbook of the checkout, picked up by the build without a list to keep up to date.
    roles = {p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").is_file()}
    assert roles and {f"roles/{r}/tasks/main.yml" for r in roles} <= set(members)
    assert {f"roles/{r}/meta/argument_specs.yml" for r in roles} <= set(members)
    playbooks = {p.name for p in (ROOT / "playbooks").glob("*.yml")}
    assert {n.split("/", 1)[1] for n in members if n.startswith("playbooks/")} == playbooks
    # Of the Python library, only the probe package that plugins/module_utils/gpuprobe links to: its modules.
    assert {n for n in members if n.startswith("remediation")} == {
        "remediation", "remediation/hostside", "remediation/hostside/gpuprobe"} | {
        f"remediation/hostside/gpuprobe/{name}" for name in PROBE_FILES}
    assert {n for n in members if n.startswith("plugins/")} >= {
        "plugins/modules/gpu_facts.py", "plugins/modules/nvidia_module.py", "plugins/modules/dpkg_idle.py",
        "plugins/modules/dpkg_hold.py", "plugins/module_utils/gpuprobe", "plugins/filter/package_patterns.py",
        "plugins/filter/restore.py", "plugins/lookup/host_program.py", "plugins/action/gpu_facts.py"}
    # No role carries plugins of its own any more: one copy of each, in plugins/.
    assert not [n for n in members if re.match(r"roles/[^/]+/(filter_plugins|library|module_utils|lookup_plugins)", n)]
    assert not [n for n in members if "__pycache__" in n or n.endswith((".pyc", ".tar.gz"))]
    manifest = yaml.safe_load(built.read("MANIFEST.json"))["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == (NAMESPACE, NAME, VERSION)


def test_the_probe_ships_once_as_the_module_utils_link(built: Built) -> None:
    members = built.members()
    link = members["plugins/module_utils/gpuprobe"]
    assert link.issym() and link.linkname == "../../remediation/hostside/gpuprobe"
    assert not [n for n in members if n.startswith("plugins/module_utils/gpuprobe/")]  # the link, not a copy
    for name in PROBE_FILES:
        assert built.read(f"remediation/hostside/gpuprobe/{name}") == (PROBE / name).read_bytes(), name
    # No second copy anywhere in the tarball: no other file defines the probe's collect().
    python_files = [name for name, m in members.items() if m.isfile() and name.endswith(".py")]
    defining_collect = [name for name in python_files if b"\ndef collect(" in built.read(name)]
    assert defining_collect == ["remediation/hostside/gpuprobe/collect.py"]


def test_the_wheel_carries_the_probe_package(built: Built) -> None:
    """What the host_program lookup and the SSH bundle read from an installed package: every module of the probe."""
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
    assert {f"remediation/hostside/gpuprobe/{name}" for name in PROBE_FILES} <= names
    assert "remediation/hostside/gpuprobe.py" not in names


def test_installed_collection_keeps_the_link_and_the_modules_find_the_probe(built: Built, tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "work"
    cwd.mkdir()
    installed = install_collection(built.tarball, tmp_path / "collections", cwd, clean_env(home, BIN),
                                   BIN / "ansible-galaxy")
    utils = installed / "plugins" / "module_utils" / "gpuprobe"
    assert utils.is_symlink() and utils.resolve() == (installed / "remediation" / "hostside" / "gpuprobe").resolve()
    assert sorted(p.name for p in utils.glob("*.py")) == PROBE_FILES
    for name in PROBE_FILES:
        assert (utils / name).read_bytes() == (PROBE / name).read_bytes(), name
    env = clean_env(home, BIN, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"))
    doc = run([str(BIN / "ansible-doc"), "--json", f"{FQCN}.gpu_facts", f"{FQCN}.nvidia_module", f"{FQCN}.dpkg_idle",
               f"{FQCN}.dpkg_hold"],
              cwd, env)
    assert doc.returncode == 0, doc.stderr
    docs = json.loads(doc.stdout)
    for module in ("gpu_facts", "nvidia_module", "dpkg_idle", "dpkg_hold"):
        entry = docs[f"{FQCN}.{module}"]
        assert entry["doc"]["filename"].startswith(str(tmp_path)), entry["doc"]["filename"]
        assert entry["examples"] and entry["return"] and entry["doc"]["short_description"]
    # The module runs from the install, with the probe packed from the link (localhost, check mode: read-only).
    facts = run([str(BIN / "ansible"), "localhost", "-c", "local", "-m", f"{FQCN}.gpu_facts", "-a", "nvml_timeout=2",
                 "--check", "-e", f"ansible_python_interpreter={sys.executable}"], cwd, env, timeout=120)
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert '"schema": "gpufleet.facts/1"' in facts.stdout


def test_versions_and_ranges_agree_with_pyproject() -> None:
    version = PYPROJECT["project"]["version"]
    assert version == VERSION  # collection and package released together
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    assert same_specifiers(runtime["requires_ansible"], str(DEPENDENCIES["ansible-core"].specifier))
    reqs = [Requirement(line) for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert [r.name for r in reqs] == [PYPROJECT["project"]["name"]] and version in reqs[0].specifier
    deps = EE["dependencies"]
    assert same_specifiers(str(Requirement(deps["ansible_core"]["package_pip"]).specifier),
                           str(DEPENDENCIES["ansible-core"].specifier))
    assert same_specifiers(str(Requirement(deps["ansible_runner"]["package_pip"]).specifier),
                           str(DEPENDENCIES["ansible-runner"].specifier))
    assert deps["python"] == [f"{PYPROJECT['project']['name']}=={version}"]
    assert [c["name"] for c in deps["galaxy"]["collections"]] == [
        f"/build/collections/{NAMESPACE}-{NAME}-{version}.tar.gz"]
    assert {f["src"] for f in EE["additional_build_files"]} == {f"dist/{NAMESPACE}-{NAME}-{version}.tar.gz",
                                                                  "dist/wheels"}


def readme_lines(prefix: str) -> list[str]:
    """The README's shell lines that start with ``prefix``, without their trailing comments."""
    text = (ROOT / "README.md").read_text()
    return [re.sub(r"\s+#.*$", "", line) for line in text.splitlines() if line.startswith(prefix)]


def test_readme_lines_build_install_and_make_the_ee_build_context(tmp_path: Path) -> None:
    """The README's build, install and ``ansible-builder create`` lines, as written, from the repository root."""
    (build,) = readme_lines("ansible-galaxy collection build")
    (wheel,) = readme_lines("pip wheel")
    (install,) = readme_lines("ansible-galaxy collection install")
    (create,) = readme_lines("ansible-builder create")
    home = tmp_path / "home"
    env = clean_env(home, BIN)
    context = ROOT / "context"
    shutil.rmtree(context, ignore_errors=True)
    try:
        for line in (build, wheel, install, create):
            proc = subprocess.run(["bash", "-ec", line], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=300, check=False)
            assert proc.returncode == 0, f"{line}\n{proc.stdout}{proc.stderr}"
        tarball = ROOT / "dist" / f"{NAMESPACE}-{NAME}-{VERSION}.tar.gz"
        installed = home / ".ansible" / "collections" / "ansible_collections" / NAMESPACE / NAME
        assert (installed / "MANIFEST.json").is_file() and (installed / "playbooks" / "harden.yml").is_file()
        # The install went where an ansible-playbook run outside the checkout looks (default collections path).
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        listing = run([str(BIN / "ansible-galaxy"), "collection", "list", FQCN], outside, env)
        assert str(installed.parent.parent) in listing.stdout and VERSION in listing.stdout, listing.stdout

        # The build context: the base image, the tarball as built, the wheel, the requirements, bindep.
        containerfile = (context / "Containerfile").read_text()
        assert f'ARG EE_BASE_IMAGE="{EE["images"]["base_image"]["name"]}"' in containerfile
        assert "ansible-galaxy collection install" in containerfile and "ARG PIP_FIND_LINKS" in containerfile
        build_dir = context / "_build"
        assert (build_dir / "collections" / tarball.name).read_bytes() == tarball.read_bytes()
        wheel = f"gpu_fleet_remediation-{VERSION}-py3-none-any.whl"
        assert [p.name for p in (build_dir / "wheels").iterdir()] == [wheel]
        assert yaml.safe_load((build_dir / "requirements.yml").read_text()) == {
            "collections": [{"name": f"/build/collections/{tarball.name}", "type": "file"}]}
        assert (build_dir / "requirements.txt").read_text().split() == [f"gpu-fleet-remediation=={VERSION}"]
        # ansible-builder's own introspection (what the image build runs) over the installed collection: it finds
        # the collection's Python and system needs through meta/execution-environment.yml.
        intro = run([sys.executable, str(build_dir / "scripts" / "introspect.py"), "introspect",
                     str(installed.parent.parent.parent)], outside, env)
        assert intro.returncode == 0, intro.stderr
        found = yaml.safe_load(intro.stdout)
        assert f"gpu-fleet-remediation>=0.1.0,<0.2  # from collection {FQCN}" in found["python"]
        assert f"openssh-clients [platform:rpm]  # from collection {FQCN}" in found["system"]
    finally:
        shutil.rmtree(context, ignore_errors=True)


@pytest.mark.parametrize("name", ["gpuprobe", "gpumemlog", "rolloutlease"])
def test_host_program_lookup_finds_the_installed_packages_program(name: str) -> None:
    sys.path.insert(0, str(ROOT / "plugins" / "lookup"))
    try:
        import host_program  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    expected = {"gpuprobe": PROBE, "gpumemlog": HOSTSIDE / "sampler.py", "rolloutlease": HOSTSIDE / "hostlease.py"}
    assert Path(host_program.program_path(name)) == expected[name].resolve()
    with pytest.raises(Exception, match="unknown host program 'probe'; known: gpumemlog, gpuprobe, rolloutlease"):
        host_program.program_path("probe")


def collection_names() -> tuple[set[str], set[str]]:
    """The collection's module names and filter names."""
    modules = {p.stem for p in (ROOT / "plugins" / "modules").glob("*.py")}
    filters: set[str] = set()
    for path in (ROOT / "plugins" / "filter").glob("*.py"):
        spec = importlib.util.spec_from_file_location(f"gpufleet_filter_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        plugin = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plugin)
        filters |= set(plugin.FilterModule().filters())
    return modules, filters


def test_roles_playbooks_and_scenarios_use_the_collection_by_fqcn() -> None:
    """Modules and filters by FQCN, programs from the installed package: what works in the checkout then works
    from an installed collection too (a bare name resolves only through paths into a checkout)."""
    modules, filters = collection_names()
    assert {"gpu_facts", "nvidia_module", "dpkg_idle", "dpkg_hold"} <= modules
    assert {"package_pattern_problems", "gpufleet_restore_decision"} <= filters
    bare_module = re.compile(rf"^\s*(?:-\s+)?({'|'.join(sorted(modules))}):\s*$", re.M)
    bare_filter = re.compile(rf"\|\s*({'|'.join(sorted(filters))})\b")
    offenders = []
    for path in sorted([*ROOT.glob("roles/*/*/*.yml"), *ROOT.glob("playbooks/*.yml"), *ROOT.glob("molecule/*/*.yml")]):
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: module {m}" for m in bare_module.findall(text)]
        offenders += [f"{path.relative_to(ROOT)}: filter {m}" for m in bare_filter.findall(text)]
        if "role_path }}/../.." in text:
            offenders.append(f"{path.relative_to(ROOT)}: a path from role_path into the checkout")
    offenders += [f"{p.relative_to(ROOT)}: plugins of a role's own" for p in ROOT.glob("roles/*/*_plugins")]
    offenders += [f"{p.relative_to(ROOT)}: plugins of a role's own" for p in ROOT.glob("roles/*/library")]
    offenders += [f"{p.relative_to(ROOT)}: changes sys.path" for p in ROOT.glob("plugins/**/*.py")
                  if "sys.path" in p.read_text()]
    assert not offenders, "\n".join(offenders)
    assert not (ROOT / "library").exists(), "modules live in plugins/modules (FQCN gpufleet.remediation.NAME)"
