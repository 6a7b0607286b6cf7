"""playbooks/remediate_timer.yml (role remediate_timer) on a 2-host lab of its own (127.0.76.N), each host a controller.

The playbook runs with ``ansible-playbook`` from the repository root (the project's ansible.cfg, host keys checked),
as ``invoke``'s tests of the other roles do. gpu-2 gets other values from the inventory (another fleet, the console
script, ``--allow-reboot``) through a second inventory file. Lab hosts have cron and no systemd: the cron variant is
installed for real and its line is run by hand as cron would run it (cron's minute granularity is too slow for a
test), as the loop's user, with a stand-in syslog on the host's ``/dev/log``; the systemd variant is rendered under
``--check --diff`` and its units checked with ``systemd-analyze verify`` on this machine.

A lab host has no checkout of the project: a small stand-in program is put where the loop's program would be
(``/opt/gpu-fleet-remediation/.venv/bin/invoke`` and ``gpufleet``); it records who ran it, where and with what, and
exits as the test asks. The wrapper the role installs is also run here with the project's real ``invoke remediate``
and ``gpufleet remediate`` (a fleet whose one host does not answer: a blocked plan, exit 1, in about a second), and
with the loop's state file held by another run (exit 4 after the loop's 10 s wait).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.config import test_prefix as lab_prefix
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
PREFIX = "127.0.76"
PLAYBOOK = ROOT / "playbooks" / "remediate_timer.yml"
WRAPPER_SRC = ROOT / "roles" / "remediate_timer" / "files" / "gpufleet-remediate-run"
PROJECT = "/opt/gpu-fleet-remediation"
WRAPPER = "/usr/local/lib/gpufleet/gpufleet-remediate-run"
STATE_DIR = "/var/lib/gpufleet"
OUTPUT = f"{STATE_DIR}/remediate-last.json"
LOCK = f"{STATE_DIR}/remediate-timer.lock"
CRON_FILE = "/etc/cron.d/gpufleet-remediate"
UNITS = ("/etc/systemd/system/gpufleet-remediate.service", "/etc/systemd/system/gpufleet-remediate.timer")
CALLS = "/tmp/remediate-stub.calls"
SYSLOG = "/tmp/syslog.txt"
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
                   r"\s+failed=(?P<failed>\d+)", re.M)
# Inventory values for gpu-2: they must reach its cron line as they are.
GPU2_VARS = {"remediate_timer_fleet": "prod", "remediate_timer_command_style": "console",
             "remediate_timer_allow_reboot": True}
STUB = textwrap.dedent(f"""\
    #!/bin/sh
    # Stand-in for the project's program on a lab controller: records who ran it, where, with what; exits as asked.
    echo "$(id -un) $(basename "$0") $*" >>{CALLS}
    sleep "$(cat {PROJECT}/stub-sleep 2>/dev/null || echo 0)"
    rc=$(cat {PROJECT}/stub-rc 2>/dev/null || echo 0)
    if [ "$rc" -le 1 ]; then
        /usr/bin/python3 -c 'import json, os, pwd, sys
    print(json.dumps({{"user": pwd.getpwuid(os.getuid()).pw_name, "cwd": os.getcwd(), "argv": sys.argv[1:]}}))' \\
            "$(basename "$0")" "$@"
    else
        echo "error: another remediate run holds the state file (waited 10 s): let it finish, then run again" >&2
    fi
    exit "$rc"
    """)
# A stand-in for syslog: a datagram socket on the host's own /dev/log (lab hosts have their own /dev), writable by
# every user as syslog's is, that appends each message to a file and quits after a while without one.
SYSLOG_LISTENER = textwrap.dedent(f"""\
    import os, socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("/dev/log")
    os.chmod("/dev/log", 0o666)
    s.settimeout(30)
    with open("{SYSLOG}", "ab", buffering=0) as f:
        try:
            while True:
                f.write(s.recv(65536) + b"\\n")
        except socket.timeout:
            pass
    """)
# What the refusals give to the role, and the one line each must produce.
HOSTILE = {
    "fleet": ({"remediate_timer_fleet": "gpu; rm -rf /"},
              'remediate_timer_fleet "gpu; rm -rf /" is not a fleet name (letters, digits, _ . -, beginning with a '
              'letter or digit); nothing was changed'),
    "project-space": ({"remediate_timer_project_dir": "/opt/gpu fleet"},
                      'remediate_timer_project_dir "/opt/gpu fleet" is not an absolute path of letters, digits and '
                      '. _ + @ - (no space, quote or shell character); nothing was changed'),
    "output-newline": ({"remediate_timer_output": "/var/lib/gpufleet/x.json\n* * * * * root touch /pwned"},
                       'remediate_timer_output "/var/lib/gpufleet/x.json\\n* * * * * root touch /pwned" is not an '
                       'absolute path of letters, digits and . _ + @ - (no space, quote or shell character); '
                       'nothing was changed'),
}

Recap = dict[str, dict[str, int]]


def playbook(lab: Any, home: Path, *args: str, expect_rc: int = 0) -> tuple[Recap, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "HOME": str(home),
                "ANSIBLE_HOME": str(home / ".ansible"), "ANSIBLE_NOCOLOR": "1"})
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(lab.cfg.inventory_path), "-i", str(home / "controllers.yml"),
         str(PLAYBOOK), "-e", "remediate_timer_hosts=gpu", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == expect_rc, proc.stdout[-6000:] + proc.stderr
    recap = {m["host"]: {k: int(m[k]) for k in ("changed", "unreachable", "failed")}
             for m in RECAP.finditer(proc.stdout)}
    return recap, proc.stdout + proc.stderr


def remote(lab: Any, host: str, command: str, timeout: float = 60) -> str:
    proc = ssh(lab, host, command, timeout=timeout)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def installed(lab: Any, host: str) -> dict[str, bool]:
    """What the role would have installed on ``host``: True for each that is there."""
    paths = [CRON_FILE, WRAPPER, STATE_DIR, OUTPUT, *UNITS]
    out = remote(lab, host, " ; ".join(f"test -e {p} && echo {p}" for p in paths) + "; true")
    there = {p: p in out.split() for p in paths}
    user = ssh(lab, host, "getent passwd gpufleet")
    there["user gpufleet"] = user.returncode == 0
    return there


def cron_job(lab: Any, host: str) -> str:
    """The command of the one job in the role's cron.d file (after the schedule and the user)."""
    (line,) = [x for x in remote(lab, host, f"cat {CRON_FILE}").splitlines() if x.strip() and not x.startswith("#")]
    return line.split(None, 6)[6]


def as_loop_user(command: str) -> str:
    """``command`` as cron runs a job of gpufleet's: /bin/sh, the user's uid/gid, a minimal environment, in HOME."""
    return (f"cd {STATE_DIR} && setpriv --reuid=gpufleet --regid=gpufleet --init-groups env -i HOME={STATE_DIR} "
            f"LOGNAME=gpufleet SHELL=/bin/sh PATH=/usr/bin:/bin /bin/sh -c {shlex.quote(command)}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The lab, then, in order: each refusal, --check on the fresh hosts, the first run (with what each left)."""
    require_lab()
    tmp = tmp_path_factory.mktemp("remediate-timer-lab")
    lab = make_lab(tmp, PREFIX, 2)
    try:
        (tmp / "controllers.yml").write_text(json.dumps({"all": {"hosts": {"gpu-2": GPU2_VARS}}}))
        for host in ("gpu-1", "gpu-2"):  # the project's program on each controller (a stand-in, see above)
            bin_dir = f"{PROJECT}/.venv/bin"
            remote(lab, host, f"mkdir -p {bin_dir} && printf %s {shlex.quote(STUB)} > {bin_dir}/invoke && cp "
                              f"{bin_dir}/invoke {bin_dir}/gpufleet && chmod 0755 {bin_dir}/invoke {bin_dir}/gpufleet")
        refused = {}
        for case, (values, _line) in HOSTILE.items():
            _, out = playbook(lab, tmp, "--limit", "gpu-1", "-e", json.dumps(values), expect_rc=2)
            refused[case] = (out, installed(lab, "gpu-1"))
        check_recap, check_out = playbook(lab, tmp, "--check", "--diff")
        after_check = {h: installed(lab, h) for h in ("gpu-1", "gpu-2")}
        first, _ = playbook(lab, tmp)
        yield {"lab": lab, "home": tmp, "refused": refused, "check": (check_recap, check_out, after_check),
               "first": first}
    finally:
        lab.down(purge=True)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_value_is_refused_with_one_line_and_nothing_installed(runs: dict[str, Any], case: str) -> None:
    out, there = runs["refused"][case]
    line = HOSTILE[case][1]
    errors = [x for x in out.splitlines() if x.startswith("[ERROR]: ")]
    assert errors == [f"[ERROR]: Task failed: Action failed: {line}"], out[-3000:]
    assert "Refuse values that are not plain names and absolute paths" in out
    assert not any(there.values()), there


def test_check_on_fresh_hosts_plans_changes_and_changes_nothing(runs: dict[str, Any]) -> None:
    recap, out, there = runs["check"]
    assert sorted(recap) == ["gpu-1", "gpu-2"]
    for host, counts in recap.items():
        assert counts["failed"] == 0 and counts["unreachable"] == 0 and counts["changed"] > 0, (host, out[-3000:])
        assert not any(there[host].values()), (host, there[host])
    assert f"+*/30 * * * * gpufleet /usr/bin/flock -n -E 75 {LOCK} {WRAPPER}" in out  # the cron line, in the diff


def test_first_run_changes_every_host(runs: dict[str, Any]) -> None:
    assert sorted(runs["first"]) == ["gpu-1", "gpu-2"]
    for host, counts in runs["first"].items():
        assert counts["failed"] == 0 and counts["unreachable"] == 0 and counts["changed"] > 0, host


@pytest.mark.parametrize("host", ["gpu-1", "gpu-2"])
def test_the_cron_line_runs_the_loop_as_its_user_under_flock(runs: dict[str, Any], host: str) -> None:
    lab = runs["lab"]
    lines = [x for x in remote(lab, host, f"cat {CRON_FILE}").splitlines() if x.strip() and not x.startswith("#")]
    assert len(lines) == 1, lines
    fields = lines[0].split(None, 6)
    assert fields[:6] == ["*/30", "*", "*", "*", "*", "gpufleet"]  # every 30 minutes, as the loop's user
    command, logger = fields[6].split(" 2>&1 | ")
    loop = {"gpu-1": [f"{PROJECT}/.venv/bin/invoke", "remediate", "--fleet", "gpu", "--yes", "--format", "json"],
            "gpu-2": [f"{PROJECT}/.venv/bin/gpufleet", "remediate", "--fleet", "prod", "--yes", "--format", "json",
                      "--allow-reboot"]}[host]
    assert shlex.split(command) == [
        "/usr/bin/flock", "-n", "-E", "75", LOCK,
        WRAPPER, "--chdir", PROJECT, "--output", OUTPUT, "--timeout", "3600", "--", *loop,
    ]
    assert logger == "/usr/bin/logger -t gpufleet-remediate"
    assert "%" not in fields[6]  # cron would turn % into a newline
    assert remote(lab, host, f"stat -c '%a %U' {CRON_FILE} {WRAPPER} {STATE_DIR}").splitlines() == [
        "644 root", "755 root", "750 gpufleet"]
    _, _, uid, _, _, home, shell = remote(lab, host, "getent passwd gpufleet").strip().split(":")
    assert int(uid) < 1000 and home == STATE_DIR and shell == "/usr/sbin/nologin"  # a system user, no login
    wrapper = hashlib.sha256(WRAPPER_SRC.read_bytes()).hexdigest()
    assert remote(lab, host, f"sha256sum {WRAPPER}").split()[0] == wrapper
    remote(lab, host, "service cron status")


def test_the_job_writes_the_result_atomically_and_sends_the_exit_code_to_syslog(runs: dict[str, Any]) -> None:
    lab = runs["lab"]
    job = cron_job(lab, "gpu-1")
    remote(lab, "gpu-1", f"rm -f /dev/log {SYSLOG} {CALLS}; (setsid python3 -c {shlex.quote(SYSLOG_LISTENER)} "
                         "</dev/null >/dev/null 2>&1 &); for i in $(seq 50); do test -S /dev/log && break; sleep 0.1; "
                         "done; test -S /dev/log")

    def run(rc: int) -> None:
        remote(lab, "gpu-1", f"echo {rc} > {PROJECT}/stub-rc")
        assert remote(lab, "gpu-1", as_loop_user(job) + "; echo rc=$?").strip() == "rc=0"  # nothing mailed by cron

    run(0)
    first = json.loads(remote(lab, "gpu-1", f"cat {OUTPUT}"))
    assert first == {"user": "gpufleet", "cwd": PROJECT,
                     "argv": ["invoke", "remediate", "--fleet", "gpu", "--yes", "--format", "json"]}
    assert remote(lab, "gpu-1", f"stat -c '%a %U' {OUTPUT}").strip() == "640 gpufleet"
    remote(lab, "gpu-1", f"touch -d @0 {OUTPUT}")
    run(1)  # escalated/blocked: a result document too, which replaces the last one
    assert remote(lab, "gpu-1", f"stat -c %Y {OUTPUT}").strip() != "0"
    remote(lab, "gpu-1", f"touch -d @0 {OUTPUT}")
    run(4)  # another run held the state file: no document, the last one stays
    assert remote(lab, "gpu-1", f"stat -c %Y {OUTPUT}").strip() == "0"
    assert json.loads(remote(lab, "gpu-1", f"cat {OUTPUT}")) == first
    assert remote(lab, "gpu-1", f"ls -A {STATE_DIR}").split() == ["remediate-last.json", "remediate-timer.lock"]
    assert remote(lab, "gpu-1", f"cat {CALLS}").splitlines() == [
        "gpufleet invoke remediate --fleet gpu --yes --format json"] * 3

    def logged() -> list[str]:  # the loop's lines (sudo logs there too), without the syslog header
        lines = [re.sub(r"^<\d+>\w{3} [ \d]\d \d\d:\d\d:\d\d ", "", x)
                 for x in remote(lab, "gpu-1", f"cat {SYSLOG}").splitlines()]
        return [x for x in lines if x.startswith("gpufleet-remediate:")]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(logged()) < 4:
        time.sleep(0.2)
    assert logged() == [
        f"gpufleet-remediate: exit 0; result in {OUTPUT}",
        f"gpufleet-remediate: exit 1; result in {OUTPUT}",
        "gpufleet-remediate: error: another remediate run holds the state file (waited 10 s): let it finish, then "
        "run again",
        f"gpufleet-remediate: exit 4; no result document, {OUTPUT} keeps the previous result",
    ]


def test_runs_never_overlap(runs: dict[str, Any]) -> None:
    lab = runs["lab"]
    command = cron_job(lab, "gpu-1").split(" 2>&1 | ")[0]  # without the logger: flock's own exit code
    remote(lab, "gpu-1", f"echo 0 > {PROJECT}/stub-rc; echo 4 > {PROJECT}/stub-sleep; rm -f {CALLS}")
    try:
        remote(lab, "gpu-1", f"(setsid sh -c {shlex.quote(as_loop_user(command))} </dev/null >/dev/null 2>&1 &); "
                             f"for i in $(seq 50); do test -s {CALLS} && break; sleep 0.1; done; test -s {CALLS}")
        started = time.monotonic()
        second = ssh(lab, "gpu-1", as_loop_user(command))
        assert second.returncode == 75 and time.monotonic() - started < 3, second  # skipped at once, not queued
        time.sleep(4.5)
        assert remote(lab, "gpu-1", f"cat {CALLS}").splitlines() == [
            "gpufleet invoke remediate --fleet gpu --yes --format json"]  # one run only
        assert ssh(lab, "gpu-1", f"flock -n {LOCK} true").returncode == 0  # and the first one let go of the lock
    finally:
        remote(lab, "gpu-1", f"rm -f {PROJECT}/stub-sleep")


def test_second_run_and_check_change_nothing(runs: dict[str, Any]) -> None:
    lab, home = runs["lab"], runs["home"]
    recap, out = playbook(lab, home)
    assert all(c == {"changed": 0, "unreachable": 0, "failed": 0} for c in recap.values()), out[-4000:]
    recap, out = playbook(lab, home, "--check", "--diff")
    assert all(c == {"changed": 0, "unreachable": 0, "failed": 0} for c in recap.values()), out[-4000:]
    assert sorted(recap) == ["gpu-1", "gpu-2"]


def test_systemd_variant_renders_a_oneshot_service_and_a_persistent_timer(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """The lab has no systemd: this shows what the units say and that systemd-analyze accepts them, not that
    systemd runs them."""
    lab, home = runs["lab"], runs["home"]
    # -e key=value gives strings: "false" must not turn into --allow-reboot, nor "90" * 60 into a long string
    recap, out = playbook(lab, home, "--check", "--diff", "--limit", "gpu-1", "-e", "remediate_timer_scheduler=systemd",
                          "-e", "remediate_timer_allow_reboot=false", "-e", "remediate_timer_timeout_minutes=90",
                          "-e", "remediate_timer_interval_minutes=15")
    assert recap["gpu-1"]["failed"] == 0 and recap["gpu-1"]["changed"] > 0
    units = {m[1]: [x[1:] for x in m[2].splitlines()] for m in re.finditer(
        r"^\+\+\+ after: \S+/(gpufleet-remediate\.(?:service|timer))\.j2\n@@[^\n]*\n((?:\+[^\n]*\n)+)", out, re.M)}
    assert sorted(units) == ["gpufleet-remediate.service", "gpufleet-remediate.timer"], out[-4000:]
    service = [x for x in units["gpufleet-remediate.service"] if x and not x.startswith("#")]
    assert service[service.index("[Service]"):] == [
        "[Service]",
        "Type=oneshot",
        "User=gpufleet",
        f"WorkingDirectory={PROJECT}",
        f"ExecStart=/usr/bin/flock -n -E 75 {LOCK} {WRAPPER} --chdir {PROJECT} --output {OUTPUT} --timeout 5400 -- "
        f"{PROJECT}/.venv/bin/invoke remediate --fleet gpu --yes --format json",
        "TimeoutStartSec=5520",
        "SyslogIdentifier=gpufleet-remediate",
        "Nice=5",
    ]
    timer = [x for x in units["gpufleet-remediate.timer"] if x and not x.startswith("#")]
    assert timer[timer.index("[Timer]"):] == [
        "[Timer]", "OnCalendar=*:0/15", "RandomizedDelaySec=60", "Persistent=true", "Unit=gpufleet-remediate.service",
        "[Install]", "WantedBy=timers.target"]
    assert remote(lab, "gpu-1", f"test -f {CRON_FILE} && echo kept").strip() == "kept"  # --check changed nothing
    assert not any(installed(lab, "gpu-1")[u] for u in UNITS)
    analyze = shutil.which("systemd-analyze")
    if analyze:  # systemd's own parser (Debian 12 machines have it; the lab hosts do not)
        for name, lines in units.items():
            (tmp_path / name).write_text("\n".join(lines) + "\n")
        proc = subprocess.run([analyze, "verify", "--man=no", *(str(tmp_path / n) for n in sorted(units))],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def test_disabling_removes_what_the_role_installed(runs: dict[str, Any]) -> None:
    lab, home = runs["lab"], runs["home"]
    recap, out = playbook(lab, home, "-e", "remediate_timer_enabled=false")
    assert all(c["changed"] > 0 and c["failed"] == 0 for c in recap.values()), out[-4000:]
    for host in ("gpu-1", "gpu-2"):
        there = installed(lab, host)
        assert [p for p, yes in there.items() if yes] == [STATE_DIR, "user gpufleet"], (host, there)
        assert remote(lab, host, f"ls -A {STATE_DIR}").split() == []  # no result, no lock
    recap, out = playbook(lab, home, "-e", "remediate_timer_enabled=false")
    assert all(c == {"changed": 0, "unreachable": 0, "failed": 0} for c in recap.values()), out[-4000:]


def _real_loop(tmp_path: Path, program: str, output: Path) -> subprocess.CompletedProcess[str]:
    """The installed wrapper, as the schedule runs it, around the project's own loop on a fleet of one host that
    does not answer."""
    down = f"{lab_prefix(PREFIX)}.200"  # nothing listens there
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu": {"hosts": {"gpu-9": {
        "ansible_host": down, "ansible_user": "azureuser"}}}}}}))
    venv = ROOT / ".venv" / "bin" if (ROOT / ".venv" / "bin" / program).exists() else BIN
    env = {**os.environ, "INVOKE_FLEETS_GPU_INVENTORY": str(inventory),
           "INVOKE_REMEDIATE_STATE_DIR": str(tmp_path / "state"), "INVOKE_REMEDIATE_IMDS_ENDPOINT": ""}
    return subprocess.run(
        ["/bin/sh", str(WRAPPER_SRC), "--chdir", str(ROOT), "--output", str(output), "--timeout", "120", "--",
         str(venv / program), "remediate", "--fleet", "gpu", "--yes", "--format", "json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180, check=False)


@pytest.mark.parametrize("program", ["invoke", "gpufleet"])
def test_the_wrapper_keeps_the_real_loops_result_and_exit_code(tmp_path: Path, program: str) -> None:
    output = tmp_path / "remediate-last.json"
    proc = _real_loop(tmp_path, program, output)
    assert proc.returncode == 1, proc.stderr  # a blocked host: exit 1, with a result
    assert proc.stdout == "" and proc.stderr.splitlines()[-1] == f"exit 1; result in {output}"
    doc = json.loads(output.read_text())
    assert doc["schema"] == "gpufleet.remediate-plan/1" and doc["fleet"] == "gpu" and doc["mode"]
    (host,) = doc["hosts"]
    assert host["host"] == "gpu-9" and host["outcome"]["status"] == "blocked", host
    assert oct(output.stat().st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yml", "remediate-last.json", "state"]


def test_the_wrapper_keeps_the_last_result_while_another_run_holds_the_state(tmp_path: Path) -> None:
    output = tmp_path / "remediate-last.json"
    assert _real_loop(tmp_path, "invoke", output).returncode == 1
    before = output.read_bytes()
    lock = tmp_path / "state" / "remediate" / "gpu.json.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a run of the loop holds it
        proc = _real_loop(tmp_path, "invoke", output)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: another remediate run holds {lock} (waited 10 s): let it finish, then run again",
        f"exit 4; no result document, {output} keeps the previous result"]
    assert output.read_bytes() == before
