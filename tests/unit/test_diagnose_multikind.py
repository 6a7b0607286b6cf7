"""diagnose() on a paste of several kinds: each part read, findings merged critical first, unread parts named.

The texts are written here in the real tools' formats (each names its tool), as an on-call engineer pastes them:
one terminal session after another, prompts included.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from remediation.core.findings import Severity
from remediation.host.diagnose import diagnose, render_text

ROOT = Path(__file__).resolve().parents[2]
INVOKE = ROOT / ".venv" / "bin" / "invoke"

# nvidia-smi's failure, modprobe's FATAL line (kmod), then /var/log/apt/history.log (apt's history format): the S1
# triage bundle of the runbook.
S1_BUNDLE = """\
azureuser@gpu-node-07:~$ nvidia-smi
NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA \
driver is installed and running.

azureuser@gpu-node-07:~$ sudo modprobe nvidia
modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.5.0-45-generic
azureuser@gpu-node-07:~$ tail -n 6 /var/log/apt/history.log

Start-Date: 2024-07-13  06:25:01
Commandline: /usr/bin/unattended-upgrade
Install: linux-image-6.5.0-45-generic:amd64 (6.5.0-45.45~22.04.1, automatic), \
linux-modules-6.5.0-45-generic:amd64 (6.5.0-45.45~22.04.1, automatic)
Upgrade: linux-image-generic-hwe-22.04:amd64 (6.5.0.44.44~22.04.24, 6.5.0.45.45~22.04.25)
End-Date: 2024-07-13  06:25:43
"""

# `dkms status` (dkms 3.x format: module/version, kernel, arch: state) and `uname -r`'s bare output.
DKMS_44_UNAME_45 = """\
$ dkms status
nvidia/550.90.07, 6.5.0-44-generic, x86_64: installed
$ uname -r
6.5.0-45-generic
"""

# The same pair with no prompts, separated by a blank line, as pasted into a chat.
DKMS_44_UNAME_45_BARE = "nvidia/550.90.07, 6.5.0-44-generic, x86_64: installed\n\n6.5.0-45-generic\n"

# PyTorch (torch/cuda/__init__.py, _lazy_init) on a host whose driver is not loaded.
TORCH_NO_DRIVER = """\
Traceback (most recent call last):
  File "/opt/train/train.py", line 41, in <module>
    model = model.to("cuda")
  File "/usr/local/lib/python3.10/dist-packages/torch/cuda/__init__.py", line 302, in _lazy_init
    torch._C._cuda_init()
RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a \
driver from http://www.nvidia.com/Download/index.aspx
"""

# nvidia-smi's failure, a chat message in the middle (no tool's format), then apt history.
UNREAD_MIDDLE = """\
NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA \
driver is installed and running.

hi team, node 7 again after last night's patch window, see below
thx \x00\ufffd

Start-Date: 2024-07-13  06:25:01
Commandline: /usr/bin/unattended-upgrade
Install: linux-image-6.5.0-45-generic:amd64 (6.5.0-45.45~22.04.1, automatic)
End-Date: 2024-07-13  06:25:43
"""


def _ids(text: str, **kwargs: str) -> list[str]:
    return [f.id for f in diagnose(text, **kwargs).findings]


def test_s1_bundle_gives_the_critical_driver_finding_first_and_the_apt_one() -> None:
    result = diagnose(S1_BUNDLE)
    ids = [f.id for f in result.findings]
    assert ids[0] == "GPU-DRV-001"
    assert result.findings[0].severity is Severity.CRITICAL
    assert "6.5.0-45-generic" in result.findings[0].summary
    assert "GPU-KRN-006" in ids  # unattended-upgrade installed the kernel: the apt part's evidence
    ranks = [f.severity.rank for f in result.findings]
    assert ranks == sorted(ranks, reverse=True)
    doc = result.to_dict()
    assert [(p["kind"], p["lines"]) for p in doc["parts"]] == [("nvml", [1, 5]), ("apt-history", [8, 12])]
    assert doc["unread"] == []  # the prompt line before the apt history has no output: no part, nothing unread
    assert doc["parts"][0]["findings"] == ["GPU-DRV-001"]
    json.dumps(doc)
    out = render_text(result)
    assert out.index("[CRITICAL] GPU-DRV-001") < out.index("GPU-KRN-006")
    assert "parts: nvml (lines 1-5), apt-history (lines 8-12)" in out


@pytest.mark.parametrize("text", [DKMS_44_UNAME_45, DKMS_44_UNAME_45_BARE])
def test_dkms_built_for_44_while_45_runs_is_the_s1_cause(text: str) -> None:
    result = diagnose(text)
    assert [f.id for f in result.findings] == ["GPU-DRV-001"]
    finding = result.findings[0]
    assert finding.severity is Severity.CRITICAL
    assert "6.5.0-45-generic" in finding.summary and "6.5.0-44-generic" in finding.summary
    assert any("nvidia/550.90.07, 6.5.0-44-generic" in line for line in finding.evidence)
    assert result.kind == "dkms"  # the paste read as one kind, as before; the parts say the rest
    assert [p.kind for p in result.parts] == ["dkms", "transcript"]


def test_dkms_built_for_the_running_kernel_is_no_finding() -> None:
    assert _ids(DKMS_44_UNAME_45.replace("6.5.0-45-generic", "6.5.0-44-generic")) == []


def test_modprobe_path_names_the_running_kernel_against_dkms() -> None:
    # dkms status beside modprobe's FATAL for another kernel: the cause, proved by both
    text = (
        "$ dkms status\nnvidia/535.183.01, 5.15.0-1068-azure, x86_64: installed\n"
        "$ sudo modprobe nvidia\nmodprobe: FATAL: Module nvidia not found in directory /lib/modules/5.15.0-1070-azure\n"
    )
    result = diagnose(text)
    assert result.findings[0].id == "GPU-DRV-001"
    assert "5.15.0-1070-azure" in result.findings[0].summary
    assert "5.15.0-1068-azure" in result.findings[0].summary


def test_dkms_and_uname_exit_1_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "triage.txt"
    path.write_text(DKMS_44_UNAME_45)
    r = subprocess.run(
        [str(INVOKE), "diagnose", str(path), "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert [f["id"] for f in doc["findings"]] == ["GPU-DRV-001"]
    assert {"kind", "facts", "findings", "parts", "unread"} == set(doc)


def test_pytorch_found_no_nvidia_driver_is_the_driver_not_loaded_finding() -> None:
    result = diagnose(TORCH_NO_DRIVER)
    assert result.kind == "nvml"
    assert result.facts["error_class"] == "driver_not_loaded"
    assert [f.id for f in result.findings] == ["GPU-DRV-001"]
    assert any("Found no NVIDIA driver" in line for line in result.findings[0].evidence)
    # the same finding nvidia-smi's "couldn't communicate" gives
    smi = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert _ids(smi) == ["GPU-DRV-001"]


def test_an_unreadable_middle_part_is_reported_unread() -> None:
    result = diagnose(UNREAD_MIDDLE)
    doc = result.to_dict()
    assert doc["unread"] == [{"lines": [3, 4], "reason": "not recognised"}]
    assert [p["kind"] for p in doc["parts"]] == ["nvml", "apt-history"]
    assert result.findings[0].id == "GPU-DRV-001"
    assert "not recognised: lines 3-4" in render_text(result)


def test_the_same_finding_id_from_two_parts_comes_once() -> None:
    # nvidia-smi's failure and PyTorch's, with apt history between them: one driver finding
    text = S1_BUNDLE + "\n" + TORCH_NO_DRIVER
    ids = _ids(text)
    assert ids.count("GPU-DRV-001") == 1
    assert ids[0] == "GPU-DRV-001"


def test_kind_still_forces_one_kind() -> None:
    forced = diagnose(S1_BUNDLE, kind="apt-history")
    assert forced.kind == "apt-history"
    assert "GPU-DRV-001" not in [f.id for f in forced.findings]
    assert set(forced.to_dict()) == {"kind", "facts", "findings"}  # no parts: one kind, the whole text
    nvml = diagnose(DKMS_44_UNAME_45, kind="dkms")
    assert [f.id for f in nvml.findings] == []  # dkms alone cannot see the running kernel


def test_one_kind_pastes_keep_the_old_json() -> None:
    smi = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    assert set(diagnose(smi).to_dict()) == {"kind", "facts", "findings"}


@pytest.mark.parametrize(
    "text",
    [
        "\x00\x01\x02\n\n\ufffd\ufffd\n\n6.5.0-45-generic\n",
        "$ \n# \n\n$ uname -r\n\n" * 50,
        ("nvidia/550.90.07, 6.5.0-44-generic, x86_64: installed\n\n\udcff\n\n" * 300),
        "Start-Date: 2024-01-01  00:00:00\n\nNVRM: Xid (PCI:0000:00:1e): 79, pid=1\n\n" + "x\n\n" * 1000,
    ],
)
def test_odd_pastes_never_crash(text: str) -> None:
    result = diagnose(text)
    json.dumps(result.to_dict())
    assert render_text(result).startswith("kind: ")


def test_s1_bundle_at_the_command_line_prints_gpu_drv_001_first_brief_and_explained() -> None:
    """``invoke diagnose -`` on the S1 bundle: the critical driver finding is the first one printed, in the brief
    default (with its one command, the host marked) and with ``--explain`` (the runbook)."""
    for extra in ([], ["--explain"]):
        done = subprocess.run([str(INVOKE), "diagnose", "-", *extra], cwd=ROOT, input=S1_BUNDLE, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 1 and done.stderr == ""
        headers = [line for line in done.stdout.splitlines() if line.startswith("[")]
        assert headers[0].startswith("[CRITICAL] GPU-DRV-001"), done.stdout
        assert any("GPU-KRN-006" in line for line in headers[1:])
        assert ("Resolution:" in done.stdout) is bool(extra)
        assert ("  run: invoke driver-restore --limit <host>" in done.stdout) is not bool(extra)
