"""`invoke harden`'s converge flow on lab hosts: check changes nothing, apply converges, the second run costs no
Ansible, a host with the dpkg lock held is left alone while the others are hardened."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.faults import inject
from remediation.host.audit import AuditOptions
from remediation.host.harden import harden
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab

pytestmark = pytest.mark.lab
OPTIONS = AuditOptions(nvml_timeout=5)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("harden-flow"), "127.0.40", 3)
    try:
        yield lab
    finally:
        lab.down(purge=True)


def fingerprint(lab, host: str) -> str:  # type: ignore[no-untyped-def]
    """dpkg status and the whole /etc/apt tree of a host."""
    root = Path(f"/proc/{lab.init_pid(host)}/root")
    h = hashlib.sha256((root / "var/lib/dpkg/status").read_bytes())
    for path in sorted((root / "etc/apt").rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


def test_check_prints_diffs_and_changes_nothing(fleet) -> None:  # type: ignore[no-untyped-def]
    before = {h: fingerprint(fleet, h) for h in ("gpu-1", "gpu-2", "gpu-3")}
    inv = str(fleet.cfg.inventory_path)
    env = {**os.environ, "INVOKE_LAB_STATE_DIR": str(fleet.paths.state), "COLUMNS": "200"}
    invoke = ROOT / ".venv/bin/invoke"
    r = subprocess.run(
        [str(invoke) if invoke.exists() else "invoke", "harden", "--inventory", inv, "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    for host in ("gpu-1", "gpu-2", "gpu-3"):
        assert f"{host}: changes (check mode)" in r.stdout
    assert '+    "^linux-image-";' in r.stdout  # the blacklist file's diff
    assert "nothing was changed" in r.stdout
    assert {h: fingerprint(fleet, h) for h in before} == before


def test_apply_skips_a_locked_host_then_converges_without_ansible(fleet) -> None:  # type: ignore[no-untyped-def]
    inject(fleet, "gpu-3", "apt-lock")
    locked_before = fingerprint(fleet, "gpu-3")
    inv = str(fleet.cfg.inventory_path)
    hosts = load(inv, "gpu")
    first = harden(hosts, inv, OPTIONS, diff=False)
    assert first.plan.to_change == ["gpu-1", "gpu-2"]
    assert [h.host for h in first.plan.blocked] == ["gpu-3"]
    assert "dpkg lock held" in (first.plan.blocked[0].blocked or "")
    assert first.applied is not None and first.applied.changed_hosts == ["gpu-1", "gpu-2"]
    assert first.not_converged == ["gpu-3"] and first.exit_code == 1
    # The re-audit (gpu-1's batch audited while gpu-2's ran, the rest at the end) covers every host, in order.
    assert first.after is not None and [h.host for h in first.after.hosts] == ["gpu-1", "gpu-2", "gpu-3"]
    assert all(h.probed for h in first.after.hosts)
    assert fingerprint(fleet, "gpu-3") == locked_before  # left alone, nothing half-written

    fleet.clear("gpu-3")
    second = harden(hosts, inv, OPTIONS, diff=False)
    assert second.plan.to_change == ["gpu-3"] and second.exit_code == 0
    third = harden(hosts, inv, OPTIONS, diff=False)
    assert third.stopped == "nothing to do" and third.applied is None and third.exit_code == 0
    assert third.plan.compliant == ["gpu-1", "gpu-2", "gpu-3"]
