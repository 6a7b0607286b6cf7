"""Issue 20, item 3: ``train.monitor`` never puts an inventory host name into a shell command unquoted."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from remediation.core.errors import InventoryError
from remediation.train.monitor import bundle, monitor, parse_csv, remote_command
from remediation.transport.inventory import Host


@pytest.mark.parametrize("name", ["gpu-2;touch {m}", "gpu-2$(touch {m})", "gpu-2`touch {m}`", "gpu-2\ntouch {m}"])
def test_remote_command_keeps_the_name_one_word(tmp_path: Path, name: str) -> None:
    """The command runs through a real /bin/sh, as sshd runs it: the name is the label, nothing else runs."""
    marker = tmp_path / "pwned"
    label = name.replace("{m}", str(marker))
    command = remote_command(label, 0.1, 1, None).replace("python3", shlex.quote(sys.executable), 1)
    assert shlex.split(command)[-1] == label
    proc = subprocess.run(["/bin/sh", "-c", command], input=bundle(), capture_output=True, timeout=60, check=False)
    assert not marker.exists()
    assert proc.returncode == 3, proc.stderr  # no NVML on the controller: a row with the error
    if "\n" not in label:  # (a newline splits the CSV row: monitor() refuses such names, below)
        assert [r.host for r in parse_csv(proc.stdout.decode())] == [label]


def test_remote_command_align() -> None:
    assert shlex.split(remote_command("gpu-1", 5, 12, 1700000000.5))[-4:] == [
        "--host-label", "gpu-1", "--align", "1700000000.500000"]


@pytest.mark.parametrize("name", ["gpu-2;id", "gpu 2", "-gpu", "gpu,2", "gpu-2\nid", "gpu$(id)"])
def test_monitor_refuses_a_hostile_name_before_connecting(name: str) -> None:
    host = Host(name, "127.0.0.1", port=1)  # nothing listens: a refused name must not even try
    with pytest.raises(InventoryError) as err:
        monitor(host, interval=1, count=1, out=io.StringIO(), max_seconds=60)
    assert "\n" not in str(err.value) and "rename the host" in str(err.value)
