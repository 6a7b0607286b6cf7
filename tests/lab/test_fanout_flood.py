"""A host that floods the fan-out is that host's error, bounded by the caps, and never the controller's memory
(issue 20): real SSH to a lab host, real commands that print more than the cap."""

from __future__ import annotations

import time

import pytest

from remediation.transport.fanout import Status, fan_out
from remediation.transport.inventory import load

pytestmark = pytest.mark.lab
MiB = 1024 * 1024


def test_output_over_the_cap_is_the_hosts_error_and_the_rest_is_untouched(lab) -> None:  # type: ignore[no-untyped-def]
    hosts = load(lab.cfg.inventory_path, "gpu", "gpu-1,gpu-2")
    t0 = time.monotonic()
    # gpu-1 sends 40 MiB on stdout (past a 1 MiB cap); gpu-2 sends 512 KiB, under it
    result = fan_out(
        hosts,
        'if [ "$(hostname)" = gpu-1 ]; then head -c 41943040 /dev/zero; else head -c 524288 /dev/zero; fi',
        connect_timeout=10,
        timeout=60,
        max_stdout=1 * MiB,
    )
    flooded, fine = result.runs["gpu-1"], result.runs["gpu-2"]
    assert flooded.status is Status.FAILED and flooded.stdout == ""
    assert flooded.error is not None and "over" in flooded.error and "stdout" in flooded.error
    assert fine.status is Status.OK and len(fine.stdout) == 524288
    assert time.monotonic() - t0 < 60  # the flood is cut off, not read to its end or waited out


def test_stderr_has_its_own_cap(lab) -> None:  # type: ignore[no-untyped-def]
    hosts = load(lab.cfg.inventory_path, "gpu", "gpu-3")
    run = fan_out(hosts, "head -c 3145728 /dev/zero >&2", connect_timeout=10, timeout=60, max_stderr=1 * MiB).runs[
        "gpu-3"
    ]
    assert run.status is Status.FAILED and run.error is not None and "stderr" in run.error
