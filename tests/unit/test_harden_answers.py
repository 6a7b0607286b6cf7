"""`invoke harden`'s per-host extra vars built from the audit's facts (remediation.host.harden.audit_answers): the
held packages are exactly what `apt-mark showhold` (which gpu_kernel_hold then skips) lists for the same dpkg
status file, read by the real probe and the real apt-mark."""

from __future__ import annotations

import copy
import datetime as _dt
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from remediation.core.facts import facts_from_dict
from remediation.host.audit import AuditResult, HostAudit
from remediation.host.harden import audit_answers
from remediation.hostside.gpuprobe.common import Options
from remediation.hostside.gpuprobe.packages import collect_packages
from remediation.transport.fanout import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"

# Every dpkg state a hold can be in: installed, a foreign architecture beside the native one, removed with its
# configuration kept, never installed; and packages that are installed or selected for removal but not held.
DPKG_STATUS = """\
Package: walinuxagent
Status: hold ok installed
Architecture: amd64
Version: 2.9.1.1-0ubuntu0.22.04.1

Package: linux-image-generic
Status: install ok installed
Architecture: amd64
Version: 6.5.0.44.44

Package: libfoo
Status: hold ok installed
Architecture: i386
Version: 1.0

Package: libfoo
Status: install ok installed
Architecture: amd64
Version: 1.0

Package: nvidia-utils-535
Status: hold ok half-configured
Architecture: amd64
Version: 535.183.01-0ubuntu0.22.04.1

Package: gone
Status: hold ok not-installed
Architecture: amd64

Package: removed
Status: hold ok config-files
Architecture: amd64
Version: 2.0

Package: bar
Status: deinstall ok installed
Architecture: amd64
Version: 1.0
"""


def apt_mark_showhold(root: Path) -> list[str]:
    """`apt-mark showhold` on the status file under ``root`` (no sources, no caches written), as the role reads it:
    each line without its ``:ARCH``."""
    if shutil.which("apt-mark") is None:
        pytest.skip("apt-mark is not installed here")
    empty = root / "empty"
    empty.mkdir()
    opts = {
        "Dir::State::status": root / "var/lib/dpkg/status",
        "Dir::State::Lists": empty,
        "Dir::State::extended_states": empty / "extended_states",
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": empty,
        "Dir::Cache::pkgcache": "",
        "Dir::Cache::srcpkgcache": "",
        "APT::Architecture": "amd64",
        "APT::Architectures::": "amd64",
    }
    argv = ["apt-mark"]
    for key, value in opts.items():
        argv += ["-o", f"{key}={value}"]
    argv += ["-o", "APT::Architectures::=i386", "showhold"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [line.split(":", 1)[0] for line in proc.stdout.splitlines()]


def host_audit(name: str, doc: dict[str, Any] | None, status: Status = Status.OK) -> HostAudit:
    facts = facts_from_dict(doc, host=name) if doc is not None else None
    return HostAudit(name, status, facts, (), None if doc is not None else "connection refused", 0.1)


def test_held_packages_are_what_apt_mark_showhold_lists(tmp_path: Path) -> None:
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(DPKG_STATUS)
    healthy = json.loads((FIXTURES / "healthy.json").read_text())
    doc = copy.deepcopy(healthy)
    doc["packages"] = collect_packages(Options(root=str(tmp_path), skip_nvml=True))  # the real probe's section
    unreadable = copy.deepcopy(healthy)
    unreadable["packages"] = None  # the probe could not read the dpkg database
    audit = AuditResult("gpu", "inv.yml", _dt.datetime.now(_dt.UTC), 1.0, (
        host_audit("gpu-1", doc),
        host_audit("gpu-2", None, Status.UNREACHABLE),
        host_audit("gpu-3", unreadable),
    ))

    answers = audit_answers(audit)

    shown = apt_mark_showhold(tmp_path)
    assert shown == ["gone", "libfoo", "nvidia-utils-535", "removed", "walinuxagent"]  # apt-mark really read it
    assert answers["harden_held_packages"] == {"gpu-1": shown}
    # gpu-2 was not probed and gpu-3's dpkg database was not read: the playbook asks those hosts itself.
    kernel = healthy["system"]["kernel"]
    assert answers["harden_booted_kernels"] == {"gpu-1": kernel, "gpu-3": kernel}
    # Data, handed to the playbook as JSON: the round trip keeps it.
    assert json.loads(json.dumps(answers)) == answers


def test_a_host_with_no_holds_gets_an_empty_list_not_none(tmp_path: Path) -> None:
    """An empty list says "nothing is held" (the role skips apt-mark); only a missing host means "ask the host"."""
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(DPKG_STATUS.replace("Status: hold", "Status: install"))
    doc = json.loads((FIXTURES / "healthy.json").read_text())
    doc["packages"] = collect_packages(Options(root=str(tmp_path), skip_nvml=True))
    audit = AuditResult("gpu", "inv.yml", _dt.datetime.now(_dt.UTC), 1.0, (host_audit("gpu-1", doc),))
    assert apt_mark_showhold(tmp_path) == []
    assert audit_answers(audit)["harden_held_packages"] == {"gpu-1": []}
