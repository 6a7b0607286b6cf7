"""playbooks/harden.yml on lab hosts: the S1 prevention proven with the real unattended-upgrade, and the fleet
safety controls (check mode, idempotence, variable checks, busy and lost hosts).

ansible-playbook runs as a subprocess with the project's ansible.cfg against a 4-host lab of its own (127.0.48.N);
OpenSSH verifies the lab's host keys. Each test starts from fresh hosts (``lab.clear``).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.faults import inject
from remediation.host.audit import AuditOptions, run_audit
from remediation.host.harden import audit_answers
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

HOSTS = ("gpu-1", "gpu-2", "gpu-3", "gpu-4")
BOOT_KERNEL = "6.5.0-44-generic"
NEW_KERNEL = "6.5.0-45-generic"
AGENT_NEW = "2.11.1.4-0ubuntu0.22.04.1"
# What a hardened lab host must show (the effective apt configuration and dpkg's holds, not our files).
BLACKLIST = ("^linux-image-", "^linux-headers-", "^linux-modules-", "^linux-generic$", "^nvidia-", "^libnvidia-")
HELD = (
    f"linux-image-{BOOT_KERNEL}",
    f"linux-headers-{BOOT_KERNEL}",
    f"linux-modules-{BOOT_KERNEL}",
    "linux-image-generic",
    "nvidia-driver-535",
    "nvidia-utils-535",
    "libnvidia-compute-535",
)
# Everything a run could change on a host: dpkg's database, apt's effective configuration, the /etc/apt tree.
SNAPSHOT = (
    "sha256sum /var/lib/dpkg/status; apt-config dump | sha256sum; apt-mark showhold;"
    " find /etc/apt -printf '%p %y %m %s\\n' | sort;"
    " find /etc/apt -type f -print0 | sort -z | xargs -0 sha256sum"
)
RECAP = re.compile(
    r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
    re.MULTILINE,
)
# One batch for the whole lab and room for one bad host in it: the tests of busy and lost hosts show that the
# other hosts of the batch are hardened (with the defaults, 25% batches of one host, the first failure stops the run).
ONE_BATCH = {"harden_batch": "100%", "harden_max_fail_percentage": 50}


@dataclass(frozen=True)
class Run:
    rc: int
    output: str
    recap: dict[str, dict[str, int]]

    def changed(self, host: str) -> int:
        return self.recap[host]["changed"]

    def task(self, name: str) -> str:
        """The output of the task whose name contains ``name`` (its header to the next task's)."""
        sections = [s for s in self.output.split("\nTASK [")[1:] if name in s.split("\n", 1)[0]]
        assert len(sections) == 1, (name, len(sections))
        return sections[0]

    def hold_report(self, host: str) -> Any:
        """gpu_kernel_hold_report as the role's debug task printed it for ``host`` (YAML: callback_result_format)."""
        lines = iter(self.task("Report the holds").splitlines())
        next(line for line in lines if line.startswith(f"ok: [{host}] =>"))
        block = list(itertools.takewhile(lambda line: line.startswith(" "), lines))
        return yaml.safe_load(textwrap.dedent("\n".join(block)))["gpu_kernel_hold_report"]


@pytest.fixture(scope="module")
def hlab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_lab()
    the_lab = make_lab(tmp_path_factory.mktemp("harden"), "127.0.48", len(HOSTS))
    try:
        yield the_lab
    finally:
        the_lab.down(purge=True)


@pytest.fixture
def lab(hlab) -> object:  # type: ignore[no-untyped-def]
    """The module's lab with every host returned to its freshly built state."""
    for host in HOSTS:
        hlab.clear(host)
    return hlab


def harden(lab, *args: str, extra: dict[str, object] | None = None) -> Run:  # type: ignore[no-untyped-def]
    """Run playbooks/harden.yml as an operator would, with the project's ansible.cfg."""
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_HOME": str(Path(lab.cfg.inventory_path).parent / "ansible-home"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
        }
    )
    argv = [str(Path(venv_bin) / "ansible-playbook"), "-i", str(lab.cfg.inventory_path), "playbooks/harden.yml"]
    if extra:
        argv += ["-e", json.dumps(extra)]
    proc = subprocess.run([*argv, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    output = proc.stdout + proc.stderr
    recap = {
        m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"} for m in RECAP.finditer(proc.stdout)
    }
    return Run(proc.returncode, output, recap)


def snapshot(lab, hosts: Sequence[str] = HOSTS) -> dict[str, str]:  # type: ignore[no-untyped-def]
    out = {}
    for host in hosts:
        r = ssh(lab, host, SNAPSHOT)
        assert r.returncode == 0, r.stderr
        out[host] = r.stdout
    return out


def effective_blacklist(lab, host: str) -> list[str]:  # type: ignore[no-untyped-def]
    r = ssh(lab, host, "apt-config dump --no-empty --format '%v%n' Unattended-Upgrade::Package-Blacklist")
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def holds(lab, host: str) -> list[str]:  # type: ignore[no-untyped-def]
    return ssh(lab, host, "apt-mark showhold").stdout.split()


def assert_hardened(lab, host: str) -> None:  # type: ignore[no-untyped-def]
    assert set(BLACKLIST) <= set(effective_blacklist(lab, host)), host
    assert set(HELD) <= set(holds(lab, host)), host
    # The whole file, not a part of it: the last entry and the closing brace are there.
    text = ssh(lab, host, "cat /etc/apt/apt.conf.d/51gpufleet-package-blacklist").stdout
    assert text.rstrip().endswith('"^xserver-xorg-video-nvidia-";\n};'), text
    assert ssh(lab, host, "ls -A /etc/apt/apt.conf.d").stdout.split() == [
        "01autoremove",
        "20auto-upgrades",
        "50unattended-upgrades",
        "51gpufleet-package-blacklist",
        "70debconf",
    ]


def assert_untouched(lab, host: str) -> None:  # type: ignore[no-untyped-def]
    assert not any(e.startswith("^") for e in effective_blacklist(lab, host)), host
    assert holds(lab, host) == [], host
    assert ssh(lab, host, "test -e /etc/apt/apt.conf.d/51gpufleet-package-blacklist").returncode == 1


def nvml_init(lab, host: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return ssh(lab, host, "python3 -c 'import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlSystemGetDriverVersion())'")


def test_hardened_host_survives_unattended_upgrade_and_reboot(lab) -> None:  # type: ignore[no-untyped-def]
    """THE PROOF: the real unattended-upgrade skips the kernel, still upgrades walinuxagent, and the host boots
    the same kernel with a working driver; the same fault on an unhardened host breaks it (runbook S1)."""
    run = harden(lab, "--limit", "gpu-1,gpu-2,gpu-3", extra=ONE_BATCH)
    assert run.rc == 0, run.output[-3000:]

    result = inject(lab, "gpu-1", "kernel-upgrade")
    assert result.detail.endswith(f"rebooted into {BOOT_KERNEL}")
    assert ssh(lab, "gpu-1", "uname -r").stdout.strip() == BOOT_KERNEL
    versions = ssh(lab, "gpu-1", "dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n'").stdout
    installed = dict(line.split()[:2] for line in versions.splitlines() if line.endswith(" installed"))
    assert installed["walinuxagent"] == AGENT_NEW  # the ordinary upgrade kept flowing
    assert installed["linux-image-generic"] == "6.5.0.44.44"
    assert f"linux-image-{NEW_KERNEL}" not in installed
    assert installed["nvidia-driver-535"] == "535.183.01-0ubuntu0.22.04.1"
    history = ssh(lab, "gpu-1", "cat /var/log/apt/history.log").stdout
    real_runs = [
        s for s in history.split("\n\n") if "Commandline: /usr/bin/unattended-upgrade" in s and "--dry-run" not in s
    ]
    assert len(real_runs) == 1
    assert f"Upgrade: walinuxagent:amd64 (2.9.1.1-0ubuntu0.22.04.1, {AGENT_NEW})" in real_runs[0]
    assert "linux-" not in real_runs[0] and "nvidia" not in real_runs[0]
    log = ssh(lab, "gpu-1", "cat /var/log/unattended-upgrades/unattended-upgrades.log").stdout
    assert "Packages that will be upgraded: walinuxagent\n" in log
    nvml = nvml_init(lab, "gpu-1")
    assert nvml.returncode == 0, nvml.stderr
    assert nvml.stdout.strip() == "535.183.01"

    # gpu-4 was left out of the run: the same fault breaks it.
    assert_untouched(lab, "gpu-4")
    inject(lab, "gpu-4", "kernel-upgrade")
    assert ssh(lab, "gpu-4", "uname -r").stdout.strip() == NEW_KERNEL
    broken = nvml_init(lab, "gpu-4")
    assert broken.returncode == 1
    assert "NVMLError_DriverNotLoaded" in broken.stderr


def test_check_mode_changes_nothing(lab) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(lab)
    run = harden(lab, "--check", "--diff", extra=ONE_BATCH)
    assert run.rc == 0, run.output[-3000:]
    assert set(run.recap) == set(HOSTS)
    assert all(run.changed(h) > 0 for h in HOSTS)  # it shows what it would change ...
    assert "+Unattended-Upgrade::Package-Blacklist {" in run.output  # ... with the diff
    assert snapshot(lab) == before  # ... and changes nothing


def test_second_run_changes_nothing(lab) -> None:  # type: ignore[no-untyped-def]
    first = harden(lab, extra=ONE_BATCH)
    assert first.rc == 0, first.output[-3000:]
    assert all(first.changed(h) == 2 for h in HOSTS)  # the blacklist file and the holds
    for host in HOSTS:
        assert_hardened(lab, host)
    second = harden(lab)  # the default batches (25%) this time
    assert second.rc == 0, second.output[-3000:]
    assert {h: second.changed(h) for h in HOSTS} == dict.fromkeys(HOSTS, 0)


def test_invoke_hardens_answers_give_the_plain_playbooks_end_state(lab) -> None:  # type: ignore[no-untyped-def]
    """What invoke harden passes (the audit's booted kernel, no fact gathering) gives the same holds and the same
    report (newly_held, skipped_unknown, other_holds) as the plain playbook from the same state; either way the holds
    are set by one dpkg_hold run per host, not one module run per package, and the holds already there are kept."""
    for host in ("gpu-1", "gpu-2"):
        r = ssh(lab, host, "apt-mark hold walinuxagent nvidia-utils-535")  # another hold, and one of ours already
        assert r.returncode == 0, r.stderr
    inventory = str(lab.cfg.inventory_path)
    audit = run_audit(load(inventory, "gpu"), AuditOptions(nvml_timeout=5), inventory=inventory)
    answers = audit_answers(audit)
    assert answers["harden_booted_kernels"]["gpu-2"] == BOOT_KERNEL

    plain = harden(lab, "--limit", "gpu-1")
    fed = harden(lab, "--limit", "gpu-2", extra={"harden_gather_facts": False, **answers})
    assert plain.rc == 0, plain.output[-3000:]
    assert fed.rc == 0, fed.output[-3000:]

    for run, host in ((plain, "gpu-1"), (fed, "gpu-2")):
        task = run.task("Hold the booted kernel, kernel meta and NVIDIA driver packages")
        assert task.count(f"changed: [{host}]") == 1 and "item=" not in task, task  # one module run, no loop
    assert holds(lab, "gpu-2") == holds(lab, "gpu-1")
    assert set(HELD) | {"walinuxagent"} <= set(holds(lab, "gpu-2"))
    report = fed.hold_report("gpu-2")
    assert report == plain.hold_report("gpu-1")
    assert report["other_holds"] == ["walinuxagent"]
    assert "nvidia-utils-535" in report["held"] and "nvidia-utils-535" not in report["newly_held"]
    assert set(HELD) <= set(report["held"])
    assert report["newly_held"] == [p for p in report["held"] if p != "nvidia-utils-535"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"unattended_upgrades_blacklist_extra_patterns": ["linux-("]},
            "unattended_upgrades_blacklist_extra_patterns[0] 'linux-(': not a valid Python regular expression",
        ),
        (
            {"unattended_upgrades_blacklist_extra_patterns": ["^.*"]},
            "unattended_upgrades_blacklist_extra_patterns[0] '^.*': matches every package name",
        ),
        # A variable of the second role: it must fail before the first role has written anything.
        (
            {"gpu_kernel_hold_enabled": "maybe"},
            "argument 'gpu_kernel_hold_enabled' is of type str and we were unable to convert to bool",
        ),
        ({"nvidia_driver_pin_enabled": True}, "nvidia_driver_pin_version must be an NVIDIA driver version"),
        # A name that is not a package name, for the second role: refused, not merely skipped as not installed.
        (
            {"gpu_kernel_hold_extra_packages": ["walinuxagent", "x; rm -rf /"]},
            'gpu_kernel_hold_extra_packages has "x; rm -rf /": not a dpkg package name',
        ),
    ],
    ids=["invalid-regex", "matches-everything", "wrong-type-second-role", "pin-without-version", "bad-extra-name"],
)
def test_bad_variables_fail_before_any_change(lab, extra: dict[str, object], message: str) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(lab)
    run = harden(lab, extra=extra)  # default fleet controls
    assert run.rc != 0
    assert message in " ".join(run.output.split()), run.output[-3000:]
    assert all(stats["changed"] == 0 for stats in run.recap.values()), run.recap
    assert "Write the kernel and NVIDIA Package-Blacklist" not in run.output  # no role task started
    assert snapshot(lab) == before


def test_host_with_dpkg_lock_held_fails_alone_and_unchanged(lab) -> None:  # type: ignore[no-untyped-def]
    inject(lab, "gpu-2", "apt-lock")
    before = snapshot(lab, ["gpu-2"])
    run = harden(lab, extra=ONE_BATCH)
    assert run.rc == 2, run.output[-3000:]
    assert run.recap["gpu-2"]["failed"] == 1 and run.recap["gpu-2"]["changed"] == 0
    text = " ".join(run.output.split())
    assert re.search(r"dpkg lock /var/lib/dpkg/lock-frontend is held by pid \d+ \(python3 -c import fcntl", text)
    assert "gpu-2 was not changed" in text
    assert snapshot(lab, ["gpu-2"]) == before
    assert_untouched(lab, "gpu-2")
    for host in ("gpu-1", "gpu-3", "gpu-4"):
        assert run.recap[host]["failed"] == 0
        assert_hardened(lab, host)


def test_unreachable_host_is_reported_and_others_fully_hardened(lab) -> None:  # type: ignore[no-untyped-def]
    inject(lab, "gpu-3", "unreachable")
    run = harden(lab, extra=ONE_BATCH)
    assert run.rc == 4, run.output[-3000:]  # ansible-playbook: a host was unreachable
    assert run.recap["gpu-3"]["unreachable"] == 1 and run.recap["gpu-3"]["changed"] == 0
    assert "fatal: [gpu-3]: UNREACHABLE!" in run.output
    for host in ("gpu-1", "gpu-2", "gpu-4"):
        assert run.recap[host]["failed"] == 0 and run.recap[host]["unreachable"] == 0
        assert_hardened(lab, host)
    # gpu-3, seen from the controller (its sshd is down): nothing was written there.
    root = lab.host_path("gpu-3", "/")
    assert not (root / "etc/apt/apt.conf.d/51gpufleet-package-blacklist").exists()
    assert not any(line.startswith("Status: hold") for line in (root / "var/lib/dpkg/status").read_text().splitlines())
