"""The real probe against sample host trees (``--root``): dpkg status, modules, DKMS, apt history, kern.log, locks.

``build_host_tree`` writes a small but realistic Ubuntu GPU host file system; the probe reads it exactly as it
reads ``/``.  The same builder produced the JSON fixtures in tests/fixtures/facts/.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# The probe package; ``python3 PROBE`` runs it as the timer does (its __main__.py).
PROBE = Path(__file__).resolve().parents[2] / "remediation" / "hostside" / "gpuprobe"

NVIDIA_PACKAGES = {
    "nvidia-driver-535": "535.183.01-0ubuntu0.22.04.1",
    "nvidia-dkms-535": "535.183.01-0ubuntu0.22.04.1",
    "nvidia-kernel-common-535": "535.183.01-0ubuntu0.22.04.1",
    "libnvidia-compute-535": "535.183.01-0ubuntu0.22.04.1",
    "nvidia-utils-535": "535.183.01-0ubuntu0.22.04.1",
}

S1_HISTORY = textwrap.dedent(
    """\
    Start-Date: 2026-11-20  10:02:11
    Commandline: apt-get install -y nvidia-driver-535
    Requested-By: azureuser (1000)
    Install: nvidia-driver-535:amd64 (535.183.01-0ubuntu0.22.04.1), nvidia-dkms-535:amd64 (535.183.01-0ubuntu0.22.04.1, automatic)
    End-Date: 2026-11-20  10:04:40

    Start-Date: 2026-11-25  06:11:02
    Commandline: apt-get install -y jq
    Requested-By: azureuser (1000)
    Install: jq:amd64 (1.6-2.1ubuntu3)
    End-Date: 2026-11-25  06:11:04

    Start-Date: 2026-12-02  03:14:07
    Commandline: /usr/bin/unattended-upgrade
    Install: linux-image-6.5.0-45-generic:amd64 (6.5.0-45.45, automatic), linux-modules-6.5.0-45-generic:amd64 (6.5.0-45.45, automatic), linux-headers-6.5.0-45-generic:amd64 (6.5.0-45.45, automatic)
    Upgrade: linux-image-generic:amd64 (6.5.0.44.44, 6.5.0.45.45), linux-generic:amd64 (6.5.0.44.44, 6.5.0.45.45), linux-headers-generic:amd64 (6.5.0.44.44, 6.5.0.45.45)
    End-Date: 2026-12-02  03:15:30
    """  # noqa: E501 - real history.log lines are this long
)


def _stanza(name: str, version: str, status: str = "install ok installed", arch: str = "amd64") -> str:
    return textwrap.dedent(
        f"""\
        Package: {name}
        Status: {status}
        Priority: optional
        Section: misc
        Installed-Size: 100
        Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
        Architecture: {arch}
        Version: {version}
        Description: {name}
         A continuation line that the parser must fold away.
        """
    )


def build_host_tree(
    root: Path,
    *,
    kernels: dict[str, str],
    module_for: dict[str, str],
    meta_version: str = "6.5.0.45.45",
    held: tuple[str, ...] = (),
    nvidia: dict[str, str] | None = None,
    history: str = S1_HISTORY,
    rotated_history: str | None = None,
    reboot_required: tuple[str, ...] = (),
    kern_log: str | None = None,
    dkms_only: dict[str, str] | None = None,
) -> Path:
    """A host file system under ``root``.

    ``kernels``: release -> linux-image version; ``module_for``: release -> nvidia.ko version (DKMS-installed);
    ``dkms_only``: release -> version built in the DKMS tree but not installed into /lib/modules.
    """
    nvidia = NVIDIA_PACKAGES if nvidia is None else nvidia
    stanzas = []
    for release, version in kernels.items():
        for prefix in ("linux-image-", "linux-modules-", "linux-headers-"):
            name = prefix + release
            stanzas.append(_stanza(name, version, "hold ok installed" if name in held else "install ok installed"))
    for meta in ("linux-generic", "linux-image-generic", "linux-headers-generic"):
        stanzas.append(_stanza(meta, meta_version, "hold ok installed" if meta in held else "install ok installed"))
    for name, version in nvidia.items():
        stanzas.append(_stanza(name, version, "hold ok installed" if name in held else "install ok installed"))
    stanzas.append(_stanza("unattended-upgrades", "2.8ubuntu1", arch="all"))
    stanzas.append(_stanza("linux-libc-dev", "6.5.0-45.45"))
    stanzas.append(_stanza("linux-image-6.2.0-39-generic", "6.2.0-39.40", status="deinstall ok config-files"))
    dpkg = root / "var/lib/dpkg"
    dpkg.mkdir(parents=True, exist_ok=True)
    (dpkg / "status").write_text("\n".join(stanzas))
    (dpkg / "lock").write_text("")
    (dpkg / "lock-frontend").write_text("")
    for release in kernels:
        (root / "lib/modules" / release / "kernel/drivers/net").mkdir(parents=True, exist_ok=True)
    for release, version in module_for.items():
        ko = root / "lib/modules" / release / "updates/dkms/nvidia.ko"
        ko.parent.mkdir(parents=True, exist_ok=True)
        ko.write_bytes(
            b"\x7fELF" + b"\x00" * 64 + f"srcversion=ABC\x00version={version}\x00license=NVIDIA\x00".encode()
        )
        built = root / "var/lib/dkms/nvidia" / version / release / "x86_64/module/nvidia.ko"
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_bytes(b"ko")
    for release, version in (dkms_only or {}).items():
        built = root / "var/lib/dkms/nvidia" / version / release / "x86_64/module/nvidia.ko"
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_bytes(b"ko")
    apt = root / "var/log/apt"
    apt.mkdir(parents=True, exist_ok=True)
    (apt / "history.log").write_text(history)
    if rotated_history is not None:
        with gzip.open(apt / "history.log.2.gz", "wt") as handle:
            handle.write(rotated_history)
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "os-release").write_text(
        'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n'
    )
    if reboot_required:
        run = root / "run"
        run.mkdir(parents=True, exist_ok=True)
        (run / "reboot-required").write_text("*** System restart required ***\n")
        (run / "reboot-required.pkgs").write_text("".join(p + "\n" for p in reboot_required))
    if kern_log is not None:
        (root / "var/log").mkdir(parents=True, exist_ok=True)
        (root / "var/log/kern.log").write_text(kern_log)
    return root


def run_probe(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(PROBE), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


S1_KERNELS = {"6.5.0-44-generic": "6.5.0-44.44", "6.5.0-45-generic": "6.5.0-45.45"}


@pytest.fixture
def s1_root(tmp_path: Path) -> Path:
    kern_log = textwrap.dedent(
        """\
        Dec  1 22:00:01 gpu01 kernel: [    0.000000] Linux version 6.5.0-44-generic (buildd@lcy02) #44-Ubuntu SMP
        Dec  1 22:00:09 gpu01 kernel: [    4.100000] nvidia: loading out-of-tree module taints kernel.
        Dec  2 03:20:00 gpu01 kernel: [    0.000000] Linux version 6.5.0-45-generic (buildd@lcy02) #45-Ubuntu SMP
        Dec  2 03:20:04 gpu01 kernel: [    4.212000] e1000: eth0 NIC Link is Up
        Dec  2 03:20:05 gpu01 kernel: [    4.300000] modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.5.0-45-generic
        """  # noqa: E501 - a real kern.log line
    )
    return build_host_tree(
        tmp_path / "host",
        kernels=S1_KERNELS,
        module_for={"6.5.0-44-generic": "535.183.01"},
        reboot_required=(),
        kern_log=kern_log,
    )


def test_s1_tree_packages_and_modules(s1_root: Path) -> None:
    doc = run_probe("--root", str(s1_root), "--kernel-release", "6.5.0-45-generic", "--skip-nvml")
    pkgs = doc["packages"]
    assert pkgs["available"] is True
    kernels = {k["release"]: k for k in pkgs["kernels"]}
    assert set(kernels) == set(S1_KERNELS)  # config-files-only 6.2.0-39 is not installed
    old, new = kernels["6.5.0-44-generic"], kernels["6.5.0-45-generic"]
    assert old["nvidia_module"] == {
        "present": True,
        "version": "535.183.01",
        "path": "/lib/modules/6.5.0-44-generic/updates/dkms/nvidia.ko",
        "error": None,
        "source": "dkms",
        "signed": False,
        "would_load": None,  # the tree has no /sys/firmware: Secure Boot cannot be told
    }
    assert old["flavour"] == "generic" and doc["system"]["kernel_flavour"] == "generic"
    assert old["dkms"] == [{"module": "nvidia", "version": "535.183.01", "state": "installed"}]
    assert new["nvidia_module"]["present"] is False and new["dkms"] == []
    assert new["headers_installed"] is True and new["image_version"] == "6.5.0-45.45"
    assert pkgs["kernel_meta"] == {
        "linux-generic": "6.5.0.45.45",
        "linux-headers-generic": "6.5.0.45.45",
        "linux-image-generic": "6.5.0.45.45",
    }
    assert pkgs["driver_package"] == "nvidia-driver-535"
    assert pkgs["driver_package_version"] == "535.183.01"
    assert pkgs["driver_branch"] == "535"
    assert set(pkgs["nvidia"]) == set(NVIDIA_PACKAGES)
    assert pkgs["held"] == []
    assert doc["system"]["kernel"] == "6.5.0-45-generic"
    assert doc["system"]["os_release"] == {"ID": "ubuntu", "VERSION_ID": "22.04", "PRETTY_NAME": "Ubuntu 22.04.5 LTS"}
    assert doc["errors"] == []


def test_apt_history_keeps_kernel_and_nvidia_stanzas_in_order(tmp_path: Path) -> None:
    rotated = textwrap.dedent(
        """\
        Start-Date: 2026-10-01  06:41:09
        Commandline: /usr/bin/unattended-upgrade
        Upgrade: libnvidia-common-535:amd64 (535.161.07-0ubuntu0.22.04.1, 535.183.01-0ubuntu0.22.04.1)
        End-Date: 2026-10-01  06:41:09

        Start-Date: 2026-10-02  07:00:00
        Commandline: apt-get install -y linux-libc-dev
        Upgrade: linux-libc-dev:amd64 (6.5.0-44.44, 6.5.0-45.45)
        End-Date: 2026-10-02  07:00:02
        """
    )
    root = build_host_tree(tmp_path / "h", kernels=S1_KERNELS, module_for={}, rotated_history=rotated)
    doc = run_probe("--root", str(root), "--skip-nvml")
    hist = doc["apt_history"]
    assert hist["files"] == ["/var/log/apt/history.log", "/var/log/apt/history.log.2.gz"]
    text = hist["text"]
    assert "jq" not in text and "linux-libc-dev" not in text
    assert hist["stanzas"] == 3
    assert text.index("2026-10-01") < text.index("2026-11-20") < text.index("2026-12-02")
    assert "Install: linux-image-6.5.0-45-generic:amd64 (6.5.0-45.45, automatic)" in text


def test_kern_log_fallback_keeps_current_boot_only(s1_root: Path) -> None:
    doc = run_probe("--root", str(s1_root), "--skip-nvml")
    log = doc["kernel_log"]
    assert log["source"] == "/var/log/kern.log"
    assert log["lines"] == [
        "Dec  2 03:20:05 gpu01 kernel: [    4.300000] modprobe: FATAL: Module nvidia not found in directory "
        "/lib/modules/6.5.0-45-generic"
    ]


def test_reboot_required_and_holds(tmp_path: Path) -> None:
    root = build_host_tree(
        tmp_path / "h",
        kernels=S1_KERNELS,
        module_for={"6.5.0-44-generic": "535.183.01"},
        held=("linux-image-6.5.0-44-generic", "linux-image-generic"),
        reboot_required=("linux-image-6.5.0-45-generic", "linux-base"),
    )
    doc = run_probe("--root", str(root), "--skip-nvml")
    assert doc["system"]["reboot_required"] is True
    assert doc["system"]["reboot_required_pkgs"] == ["linux-image-6.5.0-45-generic", "linux-base"]
    assert doc["packages"]["held"] == ["linux-image-6.5.0-44-generic", "linux-image-generic"]


def test_missing_dpkg_database_is_data(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    doc = run_probe("--root", str(tmp_path / "empty"), "--skip-nvml")
    assert doc["packages"]["available"] is False
    assert doc["packages"]["kernels"] == []
    assert doc["apt_history"]["stanzas"] == 0
    assert doc["dpkg_lock"]["held"] is False
    assert doc["errors"] == []


def test_dpkg_lock_held_by_another_process_is_named(s1_root: Path) -> None:
    lock = s1_root / "var/lib/dpkg/lock-frontend"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time\n"
            f"fd=os.open({str(lock)!r}, os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        doc = run_probe("--root", str(s1_root), "--skip-nvml")
    finally:
        holder.kill()
        holder.wait()
    state = doc["dpkg_lock"]
    assert state["held"] is True
    assert state["holder_pid"] == holder.pid
    assert state["holder_comm"] == Path(sys.executable).name[:15] or state["holder_comm"].startswith("python")
    # and the probe released what it tested: we can take the lock now
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_module_walk_finds_distro_module_and_compressed_versions(tmp_path: Path) -> None:
    sys.path.insert(0, str(PROBE.parent))
    try:
        import gpuprobe
    finally:
        sys.path.pop(0)
    modules = tmp_path / "lib/modules/6.8.0-1015-azure"
    ko = modules / "kernel/nvidia-535srv/nvidia.ko.xz"
    ko.parent.mkdir(parents=True)
    import lzma

    ko.write_bytes(lzma.compress(b"\x00" * 10 + b"version=535.183.06\x00"))
    (modules / "kernel/nvidia-535srv/nvidia-uvm.ko").write_bytes(b"x")
    found = gpuprobe.find_nvidia_module(str(modules))
    assert found == str(ko)
    assert gpuprobe.module_version(found) == "535.183.06"
    text = tmp_path / "nvidia.ko"
    text.write_text("filename: /lib/modules/x/updates/dkms/nvidia.ko\nsrcversion: 1\nversion:        550.54.15\n")
    assert gpuprobe.module_version(str(text)) == "550.54.15"


def test_processes_holding_nvidia_devices_are_listed_without_nvml(tmp_path: Path) -> None:
    """/proc/<pid>/fd links to /dev/nvidia*: a job (listed, with its GPUs), a driver service (marked), others not."""
    root = tmp_path / "host"

    def proc(pid: int, exe: str, fds: dict[str, str], ppid: int = 1) -> None:
        d = root / "proc" / str(pid)
        (d / "fd").mkdir(parents=True)
        comm = exe.rsplit("/", 1)[-1][:15]  # the kernel keeps 15 characters of the executable's name
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
        (d / "exe").symlink_to(exe)
        for fd, target in fds.items():
            (d / "fd" / fd).symlink_to(target)

    job = {"0": "/dev/null", "5": "/dev/nvidiactl", "6": "/dev/nvidia-uvm", "7": "/dev/nvidia1"}
    proc(3121, "/usr/bin/python3", job)
    proc(812, "/usr/bin/nvidia-persistenced", {"3": "/dev/nvidiactl", "4": "/dev/nvidia0", "5": "/dev/nvidia1"})
    proc(900, "/usr/sbin/sshd", {"3": "socket:[1234]", "4": "/dev/nvidia-not-a-device/x"})
    (root / "proc" / "self").mkdir()
    doc = run_probe("--root", str(root), "--skip-nvml")
    users = {u["pid"]: u for u in doc["device_users"]["users"]}
    assert set(users) == {812, 3121}
    assert users[3121] == {
        "pid": 3121,
        "comm": "python3",
        "exe": "python3",
        "devices": ["/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidiactl"],
        "gpus": [1],
        "service": False,
    }
    assert users[812]["comm"] == "nvidia-persiste" and users[812]["exe"] == "nvidia-persistenced"
    assert users[812]["service"] is True and users[812]["gpus"] == [0, 1]


def test_device_users_are_unknown_where_there_is_no_proc(s1_root: Path) -> None:
    doc = run_probe("--root", str(s1_root), "--skip-nvml")
    assert doc["device_users"] is None
