"""The lab fleet on real hosts: isolation, NVML from per-host state, every fault's symptoms, reboots, repair.

These run against real sshd hosts of the lab (see tests/conftest.py), with OpenSSH checking host keys.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from lab import hardware
from lab.errors import LabError
from lab.faults import inject
from tests.conftest import ROOT, ssh

pytestmark = pytest.mark.lab

PYNVML_STATE = (
    "import json, pynvml\n"
    "try:\n"
    "    pynvml.nvmlInit()\n"
    "except pynvml.NVMLError as e:\n"
    "    print(json.dumps({'error': type(e).__name__})); raise SystemExit(0)\n"
    "out = {'driver': pynvml.nvmlSystemGetDriverVersion(), 'gpus': []}\n"
    "for i in range(pynvml.nvmlDeviceGetCount()):\n"
    "    try:\n"
    "        h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
    "    except pynvml.NVMLError as e:\n"
    "        out['gpus'].append({'error': type(e).__name__}); continue\n"
    "    out['gpus'].append({'name': pynvml.nvmlDeviceGetName(h),\n"
    "        'temp': pynvml.nvmlDeviceGetTemperature(h, 0),\n"
    "        'reasons': pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),\n"
    "        'used': pynvml.nvmlDeviceGetMemoryInfo(h).used,\n"
    "        'ecc': pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),\n"
    "        'procs': [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]})\n"
    "print(json.dumps(out))\n"
)


def nvml(lab, host: str) -> dict:  # type: ignore[no-untyped-def]
    r = ssh(lab, host, "python3 -c " + _quote(PYNVML_STATE))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


@pytest.fixture
def broken(lab):  # type: ignore[no-untyped-def]
    """The host a test may break; returned to its fresh state afterwards."""
    yield "gpu-4"
    lab.clear("gpu-4")


def test_hosts_have_their_own_identity_and_disks(lab) -> None:  # type: ignore[no-untyped-def]
    names = {ssh(lab, h, "hostname").stdout.strip() for h in ("gpu-1", "gpu-2")}
    assert names == {"gpu-1", "gpu-2"}
    # Unique host keys, all recorded for strict checking.
    keys = [line.split()[2] for line in lab.paths.known_hosts.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 4
    # A file, a dpkg hold and an apt config written on one host do not show on another.
    assert ssh(lab, "gpu-1", "echo mine > /etc/gpulab-test && apt-mark hold walinuxagent").returncode == 0
    assert ssh(lab, "gpu-2", "test -e /etc/gpulab-test").returncode == 1
    assert "walinuxagent" in ssh(lab, "gpu-1", "apt-mark showhold").stdout
    assert "walinuxagent" not in ssh(lab, "gpu-2", "apt-mark showhold").stdout
    ssh(lab, "gpu-1", "rm /etc/gpulab-test; apt-mark unhold walinuxagent")


def test_hosts_log_in_as_azureuser_with_sudo_and_refuse_root_like_cloud_init(lab) -> None:  # type: ignore[no-untyped-def]
    """As an Azure Ubuntu image: azureuser logs in with the key and has passwordless sudo; root's key only prints
    cloud-init's message and exits 142, and opens no tunnel (a root ProxyJump fails too)."""
    who = ssh(lab, "gpu-1", "id -un; id -Gn; sudo -n id -u", as_root=False)
    assert who.returncode == 0, who.stderr
    user, groups, root_uid = who.stdout.split("\n")[:3]
    assert user == "azureuser" and {"adm", "sudo"} <= set(groups.split()) and root_uid == "0"
    base = ["ssh", "-F", str(lab.paths.ssh_config), "-o", "User=root"]
    root = subprocess.run([*base, "gpu-1", "id -u"], capture_output=True, text=True, timeout=30, check=False)
    assert root.returncode == 142
    assert 'Please login as the user "azureuser" rather than the user "root".' in root.stdout
    jump = ["ssh", "-F", str(lab.paths.ssh_config), "-J"]
    through = subprocess.run([*jump, "gpu-1", "gpu-2", "hostname"], capture_output=True, text=True, timeout=30,
                             check=False)
    assert through.returncode == 0 and through.stdout.strip() == "gpu-2", through.stderr
    refused = subprocess.run([*jump, "root@gpu-1", "gpu-2", "hostname"], capture_output=True, text=True, timeout=30,
                             check=False)
    assert refused.returncode == 255 and "prohibited" in refused.stderr, refused.stderr
    hosts = yaml.safe_load(lab.cfg.inventory_path.read_text())["all"]["children"]["gpu"]["hosts"]
    assert {(v["ansible_user"], v["ansible_become"]) for v in hosts.values()} == {("azureuser", True)}


def test_unknown_host_key_is_refused(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Clients verify host keys: with another host's key recorded, OpenSSH refuses to connect."""
    lines = lab.paths.known_hosts.read_text().splitlines()
    swapped = [lines[0].split()[0] + " " + " ".join(lines[1].split()[1:])]
    bad = tmp_path / "known_hosts"
    bad.write_text("\n".join(swapped) + "\n")
    r = subprocess.run(
        ["ssh", "-F", str(lab.paths.ssh_config), "-o", f"UserKnownHostsFile={bad}", "gpu-1", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr or "Host key verification failed" in r.stderr


def test_booted_kernel_seen_by_every_uname_caller(lab) -> None:  # type: ignore[no-untyped-def]
    r = ssh(
        lab,
        "gpu-1",
        "uname -r; python3 -c 'import os, platform; print(os.uname().release); print(platform.release())';"
        " cat /proc/sys/kernel/osrelease",
    )
    assert r.stdout.split() == ["6.5.0-44-generic"] * 4


def test_pynvml_on_host_answers_from_host_state(lab) -> None:  # type: ignore[no-untyped-def]
    state = nvml(lab, "gpu-1")
    assert state["driver"] == "535.183.01"
    assert [g["name"] for g in state["gpus"]] == ["NVIDIA A100 80GB PCIe"] * 2
    smi = ssh(lab, "gpu-1", "nvidia-smi --query-gpu=index,temperature.gpu --format=csv,noheader")
    assert smi.returncode == 0
    assert smi.stdout.split("\n")[0] == "0, 34"


def test_kernel_upgrade_fault_is_runbook_s1(lab) -> None:  # type: ignore[no-untyped-def]
    """The issue's acceptance: gpu-2 broken the S1 way by the real unattended-upgrade; gpu-1 unaffected."""
    inject(lab, "gpu-2", "kernel-upgrade")
    try:
        r = ssh(lab, "gpu-2", "python3 -c 'import pynvml; pynvml.nvmlInit()'")
        assert r.returncode == 1
        assert "NVMLError_DriverNotLoaded" in r.stderr
        smi = ssh(lab, "gpu-2", "nvidia-smi")
        assert smi.returncode == 9
        assert "couldn't communicate with the NVIDIA driver" in smi.stdout
        assert ssh(lab, "gpu-2", "uname -r").stdout.strip() == "6.5.0-45-generic"
        history = ssh(lab, "gpu-2", "cat /var/log/apt/history.log").stdout
        stanzas = [s for s in history.split("\n\n") if "linux-image-6.5.0-45-generic" in s]
        assert len(stanzas) == 1
        assert "Commandline: /usr/bin/unattended-upgrade" in stanzas[0]
        assert "Install: linux-modules-6.5.0-45-generic:amd64 (6.5.0-45.45, automatic)," in stanzas[0]
        assert "linux-image-6.5.0-45-generic:amd64 (6.5.0-45.45, automatic)" in stanzas[0]
        assert "Upgrade: linux-image-generic:amd64 (6.5.0.44.44, 6.5.0.45.45)" in stanzas[0]
        assert "Failed to find module 'nvidia'" in ssh(lab, "gpu-2", "dmesg").stdout
        # The DKMS stand-in left the new kernel without a module (its headers were never installed).
        assert (
            ssh(lab, "gpu-2", "dkms status").stdout.strip() == "nvidia/535.183.01, 6.5.0-44-generic, x86_64: installed"
        )
        # gpu-1 is untouched.
        assert ssh(lab, "gpu-1", "uname -r").stdout.strip() == "6.5.0-44-generic"
        assert nvml(lab, "gpu-1")["driver"] == "535.183.01"
    finally:
        lab.clear("gpu-2")


def test_headers_dkms_hook_repairs_the_module_the_driver_metapackage_builds_nothing(lab, broken) -> None:  # type: ignore[no-untyped-def]
    """As on Ubuntu: ``nvidia-driver-535`` is a metapackage without maintainer scripts (reinstalling it builds no
    module); DKMS builds through ``nvidia-dkms-535``'s scripts, its kernel hooks and ``dkms autoinstall``."""
    inject(lab, broken, "kernel-upgrade")
    assert nvml(lab, broken) == {"error": "NVMLError_DriverNotLoaded"}
    # Pin the installed version: a bare --reinstall would take the newer driver from -updates (real apt does).
    meta = ssh(lab, broken, "apt-get install -y -q --reinstall"
               " nvidia-driver-535=$(dpkg-query -W -f='${Version}' nvidia-driver-535)", timeout=300)
    assert meta.returncode == 0, meta.stdout + meta.stderr
    assert "Installing to" not in meta.stdout
    assert ssh(lab, broken, "ls /lib/modules/6.5.0-45-generic/updates/dkms/nvidia.ko").returncode != 0
    fix = ssh(lab, broken, "apt-get install -y -q linux-headers-$(uname -r)", timeout=300)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    assert "Installing to /lib/modules/6.5.0-45-generic/updates/dkms/" in fix.stdout
    lab.reboot(broken)
    state = nvml(lab, broken)
    assert state["driver"] == "535.183.01" and len(state["gpus"]) == 2


def test_reboot_boots_newest_installed_kernel_unless_pinned(lab, broken) -> None:  # type: ignore[no-untyped-def]
    assert ssh(lab, broken, "apt-get install -y -q linux-image-6.5.0-45-generic", timeout=300).returncode == 0
    assert ssh(lab, broken, "test -e /run/reboot-required").returncode == 0
    old = lab.boot_id(broken)
    new = lab.reboot(broken)
    assert new != old
    assert ssh(lab, broken, "uname -r").stdout.strip() == "6.5.0-45-generic"
    assert ssh(lab, broken, "test -e /run/reboot-required").returncode == 1  # /run is cleared at boot
    entry = "Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-44-generic"
    pin = f"sed -i 's/^GRUB_DEFAULT=.*/GRUB_DEFAULT=\"{entry}\"/' /etc/default/grub"
    assert ssh(lab, broken, pin).returncode == 0
    lab.reboot(broken)  # the boot loader reads grub.cfg: an edit without update-grub changes nothing
    assert ssh(lab, broken, "uname -r").stdout.strip() == "6.5.0-45-generic"
    assert ssh(lab, broken, "update-grub").returncode == 0
    lab.reboot(broken)
    assert ssh(lab, broken, "uname -r").stdout.strip() == "6.5.0-44-generic"
    assert nvml(lab, broken)["driver"] == "535.183.01"


def test_reboot_from_inside_restarts_only_that_host(lab) -> None:  # type: ignore[no-untyped-def]
    before = {h: lab.boot_id(h) for h in ("gpu-1", "gpu-3")}
    r = ssh(lab, "gpu-3", "reboot")
    assert r.returncode == 0
    new = lab.wait_rebooted("gpu-3", before["gpu-3"])
    assert new != before["gpu-3"]
    assert lab.boot_id("gpu-1") == before["gpu-1"]
    assert ssh(lab, "gpu-3", "cat /proc/sys/kernel/random/boot_id").stdout.strip() == new


@pytest.mark.parametrize(
    ("fault", "expect"),
    [
        ("driver-mismatch", {"error": "NVMLError_LibRmVersionMismatch"}),
        ("hang", None),
    ],
)
def test_driver_faults(lab, broken, fault: str, expect) -> None:  # type: ignore[no-untyped-def]
    inject(lab, broken, fault)
    if fault == "hang":
        r = ssh(lab, broken, "timeout 3 python3 -c 'import pynvml; pynvml.nvmlInit()'; echo rc=$?")
        assert r.stdout.strip().endswith("rc=124")  # NVML blocks; only a timeout gets the caller back
        return
    assert nvml(lab, broken) == expect
    smi = ssh(lab, broken, "nvidia-smi")
    assert smi.returncode == 18
    assert smi.stdout.startswith("Failed to initialize NVML: Driver/library version mismatch")
    assert "NVRM: API mismatch: the client has the version 535.216.01" in ssh(lab, broken, "dmesg").stdout


def test_hardware_faults(lab, broken) -> None:  # type: ignore[no-untyped-def]
    inject(lab, broken, "thermal")
    gpu0 = nvml(lab, broken)["gpus"][0]
    assert gpu0["temp"] == 86
    assert gpu0["reasons"] & hardware.HW_THERMAL_SLOWDOWN
    inject(lab, broken, "ecc")
    assert nvml(lab, broken)["gpus"][0]["ecc"] == 2
    assert "): 63, pid='<unknown>'" in ssh(lab, broken, "dmesg").stdout
    inject(lab, broken, "memory-full")
    gpu0 = nvml(lab, broken)["gpus"][0]
    assert gpu0["used"] > 0.95 * 80 * 2**30 and gpu0["procs"] == [48211, 48377]
    inject(lab, broken, "xid-79")
    gpus = nvml(lab, broken)["gpus"]
    assert gpus[1] == {"error": "NVMLError_GpuIsLost"} and "name" in gpus[0]
    assert "79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." in ssh(lab, broken, "dmesg").stdout
    assert ssh(lab, broken, "nvidia-smi").returncode == 15
    inject(lab, broken, "gpu-missing")
    assert len(nvml(lab, broken)["gpus"]) == 1
    assert lab.faults(broken) == ["thermal", "ecc", "memory-full", "xid-79", "gpu-missing"]


def test_unreachable_and_apt_lock(lab, broken) -> None:  # type: ignore[no-untyped-def]
    inject(lab, broken, "apt-lock")
    r = ssh(lab, broken, "apt-get install -y walinuxagent")
    assert r.returncode == 100
    assert "Could not get lock /var/lib/dpkg/lock-frontend" in r.stderr
    inject(lab, broken, "unreachable")
    r = ssh(lab, broken, "true")
    assert r.returncode == 255 and "Connection refused" in r.stderr


def test_clear_returns_a_host_to_fresh(lab, broken) -> None:  # type: ignore[no-untyped-def]
    inject(lab, broken, "thermal")
    ssh(lab, broken, "apt-mark hold walinuxagent")
    lab.clear(broken)
    assert lab.faults(broken) == []
    assert nvml(lab, broken)["gpus"][0]["temp"] == 34
    assert ssh(lab, broken, "apt-mark showhold").stdout.strip() == ""


def test_bad_fault_and_host_fail_before_any_change(lab) -> None:  # type: ignore[no-untyped-def]
    before = (lab.paths.host("gpu-1") / "hw/gpus").read_text()
    with pytest.raises(LabError, match="unknown fault 'meltdown'; known faults: kernel-upgrade"):
        inject(lab, "gpu-1", "meltdown")
    with pytest.raises(LabError, match="host 'gpu-99' is not in the lab"):
        inject(lab, "gpu-99", "thermal")
    with pytest.raises(LabError, match="out of range"):
        lab.up(0)
    assert (lab.paths.host("gpu-1") / "hw/gpus").read_text() == before


def test_power_commands_refuse_outside_a_lab_host(tmp_path: Path) -> None:
    """The reboot shim cannot reboot the real machine: outside a lab host it refuses and signals nothing."""
    shim = tmp_path / "reboot"
    shim.write_bytes((ROOT / "lab/hostfiles/gpulab-power").read_bytes())
    shim.chmod(0o755)
    r = subprocess.run([str(shim)], capture_output=True, text=True, check=False)
    assert r.returncode == 1
    assert "not a gpulab lab host" in r.stderr


def test_cli_errors_are_one_line_and_exit_2(lab) -> None:  # type: ignore[no-untyped-def]
    env_state = {"INVOKE_LAB_STATE_DIR": str(lab.paths.state)}
    r = subprocess.run(
        [
            str(ROOT / ".venv/bin/invoke") if (ROOT / ".venv/bin/invoke").exists() else "invoke",
            "lab.fault",
            "--host",
            "gpu-1",
            "--fault",
            "meltdown",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        env={**__import__("os").environ, **env_state},
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: unknown fault 'meltdown'")


def _leftovers(state: str) -> tuple[list[str], list[str]]:
    """Processes whose root or command line, and mount tables, still name the lab's state directory."""
    procs, mounts = [], []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if state in str((proc / "root").readlink()) or state in (proc / "cmdline").read_text():
                procs.append(proc.name)
            if state in (proc / "mounts").read_text():
                mounts.append(proc.name)
        except OSError:
            continue
    return procs, mounts


def test_a_lab_that_fails_to_start_part_way_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: a fixture whose lab errors after its hosts started must not leave them up on their addresses."""
    import socket

    import lab.control
    from tests.conftest import make_lab, require_lab

    require_lab()

    def broken_inventory(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("inventory write failed (injected)")

    monkeypatch.setattr(lab.control.inventory, "write", broken_inventory)
    with pytest.raises(RuntimeError, match="injected"):
        make_lab(tmp_path, "127.0.43", 2)  # the hosts and their sshd were up when the error came
    from lab.config import test_prefix

    assert _leftovers(str(tmp_path / "state")) == ([], [])
    for i in (1, 2):
        with socket.socket() as s:
            s.settimeout(0.5)
            assert s.connect_ex((f"{test_prefix('127.0.43')}.{i}", 22)) != 0, f"host {i} still listens on port 22"


def test_lab_down_leaves_no_process_and_no_mount(tmp_path: Path) -> None:
    from tests.conftest import make_lab, require_lab

    require_lab()
    small = make_lab(tmp_path, "127.0.43", 2)
    try:
        state = str(small.paths.state)
        pids = [small.init_pid(h) for h in ("gpu-1", "gpu-2")]
        small.reboot("gpu-2")  # a rebooted host is stopped just as cleanly
    finally:
        small.down()

    assert _leftovers(state) == ([], [])
    assert all(not Path(f"/proc/{p}").exists() for p in pids)
    assert small.supervisor_pid() is None
