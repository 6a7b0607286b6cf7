"""The fleet audit on real lab hosts: the fault matrix in one run, host key refusal, the CLI's contract."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.faults import FAULTS, inject
from remediation.host.audit import AuditOptions, run_audit
from remediation.transport.fanout import Status
from remediation.transport.inventory import load
from tests.conftest import ROOT, make_lab, require_lab, ssh

pytestmark = pytest.mark.lab

# host -> fault; gpu-1 stays healthy.
MATRIX = {f"gpu-{i}": fault for i, fault in enumerate(FAULTS, start=2)}
EXPECTED = {
    "kernel-upgrade": "GPU-DRV-001",
    "driver-mismatch": "GPU-DRV-002",
    "thermal": "GPU-THM-003",
    "ecc": "GPU-HW-003",
    "xid-79": "GPU-HW-001",
    "gpu-missing": "GPU-HW-002",
    "memory-full": "GPU-MEM-001",
    "apt-lock": "GPU-APT-001",
    "hang": "GPU-DRV-006",
}
# Hosts whose image has no pynvml, as a stock Azure Ubuntu image has none: the probe uses the copy in its bundle.
# The faults NVML reports, so the finding test proves them through that copy; and one more healthy host.
STOCK_HEALTHY = f"gpu-{len(MATRIX) + 2}"
STOCK_IMAGE = {h for h, f in MATRIX.items() if f in ("thermal", "gpu-missing", "memory-full", "hang")} | {STOCK_HEALTHY}
NVML_TIMEOUT = 3.0
HOST_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_lab()
    lab = make_lab(tmp_path_factory.mktemp("audit"), "127.0.46", len(MATRIX) + 2,
                   host_overrides={h: {"pynvml": False} for h in STOCK_IMAGE})
    try:
        for host, fault in MATRIX.items():
            inject(lab, host, fault)
        yield lab
    finally:
        lab.down(purge=True)


def _probe_processes(lab, host: str) -> list[str]:  # type: ignore[no-untyped-def]
    root = Path(f"/proc/{lab.init_pid(host)}/root")
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "root").resolve() == root.resolve() and b"python3\x00-I\x00-" in (proc / "cmdline").read_bytes():
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return out


def test_fault_matrix_each_fault_is_its_own_finding(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts = load(fleet.cfg.inventory_path, "gpu")
    t0 = time.monotonic()
    result = run_audit(hosts, AuditOptions(nvml_timeout=NVML_TIMEOUT, timeout=HOST_TIMEOUT, concurrency=32))
    elapsed = time.monotonic() - t0
    # Bounded: the hanging host costs the NVML timeout, not the command timeout, and nothing waits forever.
    assert elapsed < HOST_TIMEOUT + 10
    by_host = {h.host: h for h in result.hosts}
    assert set(by_host) == {h.name for h in hosts}
    baseline = by_host["gpu-1"]
    assert baseline.facts is not None and not baseline.facts.nvml.failed
    # An unhardened lab host carries only the predictive warnings (kernel not held, blacklist missing).
    assert {f.id for f in baseline.findings} <= {"GPU-KRN-002", "GPU-KRN-003", "GPU-KRN-004"}
    for host, fault in MATRIX.items():
        audit = by_host[host]
        assert not audit.healthy, f"{host} ({fault}) reported healthy"
        if fault == "unreachable":
            assert audit.status is Status.UNREACHABLE and audit.facts is None
            continue
        assert audit.status is Status.OK, (host, audit.error)
        ids = {f.id for f in audit.findings}
        assert EXPECTED[fault] in ids, (host, fault, sorted(ids))
        assert EXPECTED[fault] not in {f.id for f in baseline.findings}
    # The hang: reported as NVML timing out, and the probe left nothing running on the host.
    hang_host = next(h for h, f in MATRIX.items() if f == "hang")
    assert by_host[hang_host].facts.nvml.error_class == "timeout"  # type: ignore[union-attr]
    time.sleep(0.5)
    for host, fault in MATRIX.items():
        if fault != "unreachable":
            assert _probe_processes(fleet, host) == [], host
    assert result.exit_code() == 1


def test_a_host_without_pynvml_is_audited_through_the_bundles_own(fleet) -> None:  # type: ignore[no-untyped-def]
    for host in ("gpu-1", STOCK_HEALTHY):
        r = ssh(fleet, host, "python3 -c 'import pynvml'")
        assert (r.returncode == 0) == (host not in STOCK_IMAGE), (host, r.stderr)
    assert "No module named 'pynvml'" in ssh(fleet, STOCK_HEALTHY, "python3 -c 'import pynvml'").stderr
    hosts = load(fleet.cfg.inventory_path, "gpu", limit=f"gpu-1,{STOCK_HEALTHY}")
    result = run_audit(hosts, AuditOptions(nvml_timeout=NVML_TIMEOUT, timeout=HOST_TIMEOUT))
    with_own, stock = result.host("gpu-1"), result.host(STOCK_HEALTHY)
    assert stock.status is Status.OK and stock.facts is not None and with_own.facts is not None, stock.error
    assert not stock.facts.nvml.failed
    assert (stock.facts.nvml.driver_version, len(stock.facts.nvml.gpus)) == (
        with_own.facts.nvml.driver_version, len(with_own.facts.nvml.gpus))
    assert len(stock.facts.nvml.gpus) > 0
    assert {f.id for f in stock.findings} == {f.id for f in with_own.findings}


def test_s1_finding_names_the_package_and_who_installed_it(fleet) -> None:  # type: ignore[no-untyped-def]
    s1_host = next(h for h, f in MATRIX.items() if f == "kernel-upgrade")
    hosts = load(fleet.cfg.inventory_path, "gpu", limit=s1_host)
    audit = run_audit(hosts, AuditOptions(nvml_timeout=NVML_TIMEOUT)).host(s1_host)
    drv = next(f for f in audit.findings if f.id == "GPU-DRV-001")
    text = drv.summary + "\n" + "\n".join(drv.evidence)
    assert "6.5.0-45-generic" in drv.summary
    assert "linux-image-6.5.0-45-generic" in text and "unattended-upgrade" in text


def test_unknown_host_key_makes_a_host_unreachable_not_trusted(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hosts = load(fleet.cfg.inventory_path, "gpu", limit="gpu-1")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    from dataclasses import replace

    result = run_audit([replace(hosts[0], ssh=replace(hosts[0].ssh, user_known_hosts=(empty,)))], AuditOptions())
    audit = result.host("gpu-1")
    assert audit.status is Status.UNREACHABLE
    assert "known_hosts" in (audit.error or "")
    assert result.exit_code() == 3


def _invoke(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    invoke = ROOT / ".venv/bin/invoke"
    env = {**os.environ, "INVOKE_LAB_STATE_DIR": str(state)}
    return subprocess.run(
        [str(invoke) if invoke.exists() else "invoke", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
        timeout=120,
    )


def test_cli_audit_json_and_exit_codes(fleet) -> None:  # type: ignore[no-untyped-def]
    inv = str(fleet.cfg.inventory_path)
    r = _invoke("audit", "--inventory", inv, "--limit", "gpu-1", "--format", "json", state=fleet.paths.state)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["hosts"][0]["host"] == "gpu-1" and doc["hosts"][0]["status"] == "ok"
    assert {f["severity"] for f in doc["hosts"][0]["findings"]} <= {"warning", "info"}
    # Warnings (unhardened kernel) fail the run only when asked to.
    r = _invoke(
        "audit",
        "--inventory",
        inv,
        "--limit",
        "gpu-1",
        "--fail-on",
        "warning",
        "--format",
        "json",
        state=fleet.paths.state,
    )
    assert r.returncode == 1
    r = _invoke("audit", "--inventory", inv, "--limit", "gpu-99", state=fleet.paths.state)
    assert r.returncode == 2 and r.stderr.startswith("error: --limit gpu-99 matches no host")
    r = _invoke("audit", "--inventory", "/nonexistent.yml", state=fleet.paths.state)
    assert r.returncode == 2 and "inventory /nonexistent.yml does not exist" in r.stderr
    unreachable = next(h for h, f in MATRIX.items() if f == "unreachable")
    r = _invoke(
        "audit", "--inventory", inv, "--limit", f"gpu-1,{unreachable}", "--format", "json", state=fleet.paths.state
    )
    assert r.returncode == 3
