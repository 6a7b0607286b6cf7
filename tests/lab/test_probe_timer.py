"""playbooks/audit_timer.yml (role gpu_probe_timer) on a 2-host lab of its own (127.0.45.N).

The playbook runs with ``ansible-playbook`` from the repository root (the project's ansible.cfg, host keys
checked). Cron's minute granularity is too slow for a test, so the test reads the cron.d line, checks it is
what cron would run (schedule, user, command), and runs that command itself over SSH.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import parser as prometheus_parser

from lab.faults import inject
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
PLAYBOOK = ROOT / "playbooks" / "audit_timer.yml"
PROBE = "/usr/local/lib/gpufleet/gpuprobe"  # the probe package's directory: python3 runs its __main__.py
FACTS = "/var/lib/gpufleet/facts.json"
PROM = "/var/lib/node_exporter/textfile_collector/gpufleet.prom"
CRON_FILE = "/etc/cron.d/gpufleet-probe"
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
                   r"\s+failed=(?P<failed>\d+)", re.M)


def playbook(lab: Any, home: Path, *args: str) -> tuple[dict[str, dict[str, int]], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "HOME": str(home),
                "ANSIBLE_HOME": str(home / ".ansible"), "ANSIBLE_NOCOLOR": "1"})
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(lab.cfg.inventory_path), str(PLAYBOOK), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr
    recap = {m["host"]: {k: int(m[k]) for k in ("changed", "unreachable", "failed")}
             for m in RECAP.finditer(proc.stdout)}
    return recap, proc.stdout


def remote(lab: Any, host: str, command: str) -> str:
    proc = ssh(lab, host, command)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in prometheus_parser.text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def converged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, dict[str, dict[str, int]]]]:
    require_lab()
    tmp = tmp_path_factory.mktemp("probe-timer-lab")
    lab = make_lab(tmp, "127.0.45", 2)
    try:
        recap, _ = playbook(lab, tmp)
        yield lab, tmp, recap
    finally:
        lab.down(purge=True)


def test_first_run_changes_every_host(converged: tuple[Any, Path, dict[str, dict[str, int]]]) -> None:
    _, _, recap = converged
    assert sorted(recap) == ["gpu-1", "gpu-2"]
    for host, counts in recap.items():
        assert counts["failed"] == 0 and counts["unreachable"] == 0, host
        assert counts["changed"] > 0, host


@pytest.mark.parametrize("host", ["gpu-1", "gpu-2"])
def test_cron_line_is_what_cron_runs_and_running_it_writes_facts_and_metrics(
    converged: tuple[Any, Path, dict[str, dict[str, int]]], host: str
) -> None:
    lab, _, _ = converged
    lines = [x for x in remote(lab, host, f"cat {CRON_FILE}").splitlines() if x.strip() and not x.startswith("#")]
    assert len(lines) == 1, lines
    fields = lines[0].split(None, 6)
    assert fields[:6] == ["*/5", "*", "*", "*", "*", "root"]  # every 5 minutes, as root (cron.d format)
    argv = shlex.split(fields[6])
    assert argv == [
        "/usr/bin/flock", "-n", "/run/gpufleet-probe.lock",
        "/usr/bin/python3", PROBE, "--nvml-timeout", "10", "--json-out", FACTS, "--prom-out", PROM,
        "--host-label", host,
    ]
    assert "%" not in fields[6]  # cron would turn % into a newline
    mode = remote(lab, host, f"stat -c %a {CRON_FILE}").strip()
    assert mode == "644"  # cron ignores group/other-writable cron.d files
    remote(lab, host, "service cron status")

    before = json.loads(remote(lab, host, f"cat {FACTS}"))  # from the role's run at install
    assert before["nvml"]["ok"] is True
    out = remote(lab, host, f"sleep 1; {fields[6]}; echo rc=$?")
    assert out.strip() == "rc=0"  # nothing on stdout: cron would mail it
    after = json.loads(remote(lab, host, f"cat {FACTS}"))
    assert after["collected_at"] > before["collected_at"]
    assert after["hostname"] == host and after["nvml"]["ok"] is True and after["nvml"]["device_count"] == 2
    # The facts hold kernel log lines: root's only (file 0600, directory 0700); the textfile stays world-readable
    # for node_exporter and holds none of them.
    assert remote(lab, host, f"stat -c '%a %U' {FACTS} {Path(FACTS).parent} {PROM}").splitlines() == [
        "600 root", "700 root", "644 root"]
    assert after["kernel_log"]["lines"], "a lab host's kernel log has NVRM lines at boot"
    prom = remote(lab, host, f"cat {PROM}")
    assert not [line for line in after["kernel_log"]["lines"] if line in prom] and "NVRM" not in prom
    nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups"
    denied = ssh(lab, host, f"{nobody} cat {FACTS}")
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    assert remote(lab, host, f"{nobody} cat {PROM}") == prom
    assert f'gpufleet_nvml_ok{{host="{host}"}} 1' in prom.splitlines()
    parsed = metrics(prom)
    assert parsed[("gpufleet_gpu_count", (("host", host),))] == 2
    kernel = after["system"]["kernel"]
    assert parsed[("gpufleet_kernel_nvidia_module", (("booted", "true"), ("host", host), ("kernel", kernel)))] == 1
    # no temporary files left next to the outputs (node_exporter reads *.prom only, but still)
    assert remote(lab, host, f"ls -A {Path(PROM).parent}").split() == ["gpufleet.prom"]


def test_cron_command_reports_a_thermal_fault(converged: tuple[Any, Path, dict[str, dict[str, int]]]) -> None:
    lab, _, _ = converged
    job = next(x for x in remote(lab, "gpu-2", f"cat {CRON_FILE}").splitlines() if x and not x.startswith("#"))
    inject(lab, "gpu-2", "thermal")
    remote(lab, "gpu-2", job.split(None, 6)[6])
    prom = remote(lab, "gpu-2", f"cat {PROM}")
    temps = {dict(k[1])["gpu"]: v for k, v in metrics(prom).items() if k[0] == "gpufleet_gpu_temperature_celsius"}
    assert temps["0"] == 86


def test_check_on_converged_hosts_reports_no_changes(converged: tuple[Any, Path, dict[str, dict[str, int]]]) -> None:
    lab, home, _ = converged
    recap, out = playbook(lab, home, "--check", "--diff")
    assert sorted(recap) == ["gpu-1", "gpu-2"]
    assert all(c == {"changed": 0, "unreachable": 0, "failed": 0} for c in recap.values()), out[-4000:]


def test_systemd_variant_renders_its_units_under_check(
    converged: tuple[Any, Path, dict[str, dict[str, int]]],
) -> None:
    """The lab has no systemd: this shows the unit templates render and the plan is sane, not that systemd
    runs them."""
    lab, home, _ = converged
    recap, out = playbook(lab, home, "--check", "--diff", "--limit", "gpu-1", "-e", "gpu_probe_timer_scheduler=systemd")
    assert recap["gpu-1"]["failed"] == 0 and recap["gpu-1"]["changed"] > 0
    assert "+ExecStart=/usr/bin/flock -n /run/gpufleet-probe.lock /usr/bin/python3 " + PROBE in out
    assert "+OnCalendar=*:0/5" in out
    assert remote(lab, "gpu-1", f"test -f {CRON_FILE} && echo kept").strip() == "kept"  # --check changed nothing


def test_upgrade_from_the_single_file_probe(converged: tuple[Any, Path, dict[str, dict[str, int]]]) -> None:
    """A host an earlier release set up has <install_dir>/gpuprobe.py: the role removes it, puts back a module that
    differs from the package's, runs the probe again, and the next run changes nothing."""
    lab, home, _ = converged
    old = "/usr/local/lib/gpufleet/gpuprobe.py"
    remote(lab, "gpu-1", f"cp {PROBE}/prom.py {old} && echo '# edited on the host' >> {PROBE}/prom.py")
    before = json.loads(remote(lab, "gpu-1", f"cat {FACTS}"))["collected_at"]
    recap, out = playbook(lab, home, "--limit", "gpu-1")
    assert recap["gpu-1"]["changed"] > 0 and recap["gpu-1"]["failed"] == 0, out[-4000:]
    assert remote(lab, "gpu-1", f"test -e {old} || echo gone").strip() == "gone"
    assert "# edited on the host" not in remote(lab, "gpu-1", f"cat {PROBE}/prom.py")
    assert json.loads(remote(lab, "gpu-1", f"cat {FACTS}"))["collected_at"] > before  # the updated probe ran
    recap, out = playbook(lab, home, "--limit", "gpu-1")
    assert recap["gpu-1"]["changed"] == 0, out[-4000:]
