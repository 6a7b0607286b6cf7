"""The probe's /proc scan of processes holding /dev/nvidia*: who they are (executable, not comm) and what it cannot see.

``/proc/<pid>/comm`` holds at most 15 characters: ``nvidia-persistenced`` reads ``nvidia-persiste`` and
``nv-fabricmanager`` reads ``nv-fabricmanage`` there (seen on a real H200 host, driver 580). A driver daemon is
recognised by the basename of its executable (``/proc/<pid>/exe``), then argv[0], and only then comm.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

PROBE_DIR = Path(__file__).resolve().parents[2] / "remediation" / "hostside"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
sys.path.insert(0, str(PROBE_DIR))
try:
    import gpuprobe
finally:
    sys.path.pop(0)

COMM_MAX = 15  # TASK_COMM_LEN - 1


def _proc(
    root: Path,
    pid: int,
    exe: str | None,
    fds: dict[str, str],
    *,
    cmdline: bytes | None = None,
    comm: str | None = None,
) -> None:
    """A /proc/<pid> as the kernel shows it: comm is the executable's basename cut to 15 characters."""
    d = root / "proc" / str(pid)
    (d / "fd").mkdir(parents=True)
    name = os.path.basename(exe or "") or "?"
    (d / "comm").write_text((comm if comm is not None else name[:COMM_MAX]) + "\n")
    (d / "stat").write_text(f"{pid} ({name[:COMM_MAX]}) S 1 {pid} {pid} 0 -1\n")
    if exe is not None:
        (d / "exe").symlink_to(exe)
    (d / "cmdline").write_bytes(cmdline if cmdline is not None else (exe or "").encode() + b"\0")
    for fd, target in fds.items():
        (d / "fd" / fd).symlink_to(target)


def _scan(root: Path) -> dict[str, Any]:
    found = gpuprobe.collect_device_users(gpuprobe.Options(root=str(root), skip_nvml=True))
    assert found is not None
    return found


def _by_pid(found: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {u["pid"]: u for u in found["users"]}


def test_driver_daemons_with_real_15_char_comms_are_services(tmp_path: Path) -> None:
    gpus = {"3": "/dev/nvidiactl", "4": "/dev/nvidia0", "5": "/dev/nvidia1"}
    _proc(tmp_path, 812, "/usr/bin/nvidia-persistenced", gpus)
    _proc(tmp_path, 813, "/usr/bin/nv-fabricmanager", {"3": "/dev/nvidiactl"})
    _proc(tmp_path, 3121, "/usr/bin/python3.10", {"5": "/dev/nvidiactl", "7": "/dev/nvidia1"}, comm="python3")
    users = _by_pid(_scan(tmp_path))
    assert users[812]["comm"] == "nvidia-persiste" and users[813]["comm"] == "nv-fabricmanage"
    assert users[812]["exe"] == "nvidia-persistenced" and users[812]["service"] is True
    assert users[813]["exe"] == "nv-fabricmanager" and users[813]["service"] is True
    assert users[3121] == {
        "pid": 3121,
        "comm": "python3",
        "exe": "python3.10",
        "devices": ["/dev/nvidia1", "/dev/nvidiactl"],
        "gpus": [1],
        "service": False,
    }


def test_a_daemon_whose_binary_was_replaced_by_an_upgrade_is_still_a_service(tmp_path: Path) -> None:
    # dpkg replaced /usr/bin/nvidia-persistenced while the old daemon runs: the exe link gets " (deleted)".
    _proc(tmp_path, 812, "/usr/bin/nvidia-persistenced (deleted)", {"3": "/dev/nvidiactl"})
    user = _by_pid(_scan(tmp_path))[812]
    assert user["exe"] == "nvidia-persistenced" and user["service"] is True


def test_argv0_is_used_when_exe_is_unreadable_and_comm_only_last(tmp_path: Path) -> None:
    _proc(tmp_path, 900, None, {"3": "/dev/nvidiactl"}, cmdline=b"/usr/bin/nvidia-persistenced\0--verbose\0",
          comm="nvidia-persiste")
    _proc(tmp_path, 901, None, {"3": "/dev/nvidiactl"}, cmdline=b"", comm="nv-hostengine")
    _proc(tmp_path, 902, None, {"3": "/dev/nvidia0"}, cmdline=b"", comm="nvidia-persiste")
    users = _by_pid(_scan(tmp_path))
    assert users[900]["exe"] == "nvidia-persistenced" and users[900]["service"] is True
    assert users[901]["exe"] is None and users[901]["service"] is True  # a short name: comm is the whole name
    # A cut comm alone proves nothing: a job could call itself that. Counted as work.
    assert users[902]["exe"] is None and users[902]["service"] is False


def test_a_job_renaming_itself_is_not_a_service(tmp_path: Path) -> None:
    # prctl(PR_SET_NAME) / argv[0] games: the executable decides, not what the process says it is.
    _proc(tmp_path, 4000, "/usr/bin/python3.10", {"3": "/dev/nvidia0"}, comm="nvidia-persistenced"[:COMM_MAX],
          cmdline=b"nvidia-persistenced\0")
    assert _by_pid(_scan(tmp_path))[4000]["service"] is False


def test_gone_processes_are_not_unreadable_but_denied_ones_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _proc(tmp_path, 812, "/usr/bin/nvidia-persistenced", {"3": "/dev/nvidiactl"})
    (tmp_path / "proc" / "950").mkdir()  # exited between the two reads: no fd directory left
    _proc(tmp_path, 960, "/usr/bin/python3", {"3": "/dev/nvidia0"})
    real_listdir = os.listdir
    denied = str(tmp_path / "proc" / "960" / "fd")

    def listdir(path: Any) -> list[str]:
        if str(path) == denied:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(gpuprobe.devices.os, "listdir", listdir)
    found = _scan(tmp_path)
    assert set(_by_pid(found)) == {812}
    assert found["unreadable"] == 1


def test_the_loader_takes_exe_and_unreadable_and_tolerates_an_older_probe() -> None:
    from remediation.core.facts import facts_from_dict

    doc = json.loads((FIXTURES / "healthy.json").read_text())
    doc["device_users"] = {
        "users": [
            {"pid": 812, "comm": "nvidia-persiste", "exe": "nvidia-persistenced", "devices": ["/dev/nvidiactl"],
             "gpus": [], "service": True},
            {"pid": 3121, "comm": "python3", "devices": ["/dev/nvidia0"], "gpus": [0], "service": False},
        ],
        "unreadable": 3,
        "truncated": False,
    }
    users = facts_from_dict(doc, host="h").device_users
    assert users.unreadable == 3 and users.available
    assert [u.exe for u in users.users] == ["nvidia-persistenced", None]
    assert [u.pid for u in users.workloads] == [3121]
    del doc["device_users"]["unreadable"]
    assert facts_from_dict(doc, host="h").device_users.unreadable == 0
