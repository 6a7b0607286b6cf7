"""``invoke train.monitor``: GPU memory and utilization of one host, sampled through NVML, to CSV.

The sampler (:mod:`remediation.hostside.sampler`, stdlib + pynvml) travels the way the audit's probe does, bundled by
:func:`remediation.hostside.bundle_program`: one Python program on the SSH session's stdin, with the
controller's ``pynvml.py`` inside, used only where the host has none; the SSH session is
:func:`remediation.transport.fanout.run_one` (host keys verified, connect and command timeouts). A long run is cut
into chunks of about ``chunk_seconds``: each chunk is one SSH round trip whose rows are appended to the CSV as soon
as it ends, and the next chunk keeps the spacing (``--align``). The run is bounded by ``count`` and by ``max_seconds``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from remediation.core.errors import InventoryError
from remediation.hostside import SAMPLER_PATH, bundle_program
from remediation.hostside.sampler import FIELDS  # the CSV columns, as the sampler writes them
from remediation.train.errors import TrainError
from remediation.transport.fanout import HostRun, Status, run_one
from remediation.transport.inventory import Host, label
from remediation.transport.sshopts import hostname_problem

__all__ = ["FIELDS", "MonitorResult", "Sample", "bundle", "check_host_name", "monitor", "parse_csv", "remote_command"]


def remote_command(host_label: str, interval: float, count: int, align: float | None) -> str:
    """The sampler's command line on the host, every argument one shell word (``shlex.join``)."""
    argv = ["python3", "-I", "-", "--interval", f"{interval:g}", "--count", str(count), "--no-header",
            "--host-label", host_label]
    if align is not None:
        argv += ["--align", f"{align:.6f}"]
    return shlex.join(argv)


def check_host_name(name: str) -> None:
    """The inventory name labels every CSV row and travels in the remote command: refuse what OpenSSH would
    refuse as a host name (shell metacharacters, spaces, a leading ``-``) and commas (a CSV column each)."""
    problem = hostname_problem(name) or ("contains a comma (the CSV's separator)" if "," in name else None)
    if problem is not None:
        raise InventoryError(
            f"host {label(name)}: inventory host name {problem}; rename the host in the inventory (names such as"
            " gpu-2) to monitor it"
        )


def bundle(include_pynvml: bool = True) -> bytes:
    """The sampler as one program for a remote ``python3 -``, with pynvml for hosts that have none."""
    return bundle_program(SAMPLER_PATH.read_text(encoding="utf-8"), "gpumemlog", include_pynvml)


@dataclass(frozen=True)
class Sample:
    """One CSV row: one GPU at one moment (values None where NVML gave none)."""

    timestamp: str
    host: str
    gpu: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None
    memory_total_mib: int | None
    utilization_gpu_pct: int | None
    error: str

    @property
    def epoch(self) -> float:
        return _dt.datetime.strptime(self.timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC).timestamp()


def _opt_int(text: str) -> int | None:
    return int(text) if text.strip().lstrip("-").isdigit() else None


def parse_csv(text: str) -> list[Sample]:
    """The sampler's CSV (with or without its header) as samples; malformed lines are skipped."""
    out: list[Sample] = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) != len(FIELDS) or row[0] == "timestamp":
            continue
        try:
            _dt.datetime.strptime(row[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        except ValueError:
            continue
        out.append(
            Sample(row[0], row[1], _opt_int(row[2]), _opt_int(row[3]), _opt_int(row[4]), _opt_int(row[5]),
                   _opt_int(row[6]), row[7])
        )
    return out


@dataclass(frozen=True)
class MonitorResult:
    host: str
    samples: tuple[Sample, ...]
    chunks: int
    status: Status  # of the last SSH round trip
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK and self.error is None


def _row(s: Sample) -> str:
    values = [s.timestamp, s.host, s.gpu, s.memory_used_mib, s.memory_free_mib, s.memory_total_mib,
              s.utilization_gpu_pct, s.error]
    return ",".join("" if v is None else str(v) for v in values) + "\n"


def monitor(
    host: Host,
    *,
    interval: float,
    count: int,
    out: TextIO,
    max_seconds: float,
    chunk_seconds: float = 60.0,
    connect_timeout: float = 10.0,
    on_chunk: Callable[[list[Sample]], None] | None = None,
    header: bool = True,
) -> MonitorResult:
    """Sample ``host`` ``count`` times, ``interval`` seconds apart; rows go to ``out`` as each chunk arrives."""
    if not 0.1 <= interval <= 3600:
        raise TrainError(f"--interval {interval:g} must be between 0.1 and 3600 seconds")
    if count < 1:
        raise TrainError(f"--count {count} must be at least 1")
    if (count - 1) * interval > max_seconds:
        raise TrainError(
            f"--count {count} x --interval {interval:g} s is longer than train.monitor_max_seconds "
            f"({max_seconds:g} s); sample less often or fewer times"
        )
    check_host_name(host.name)
    program = bundle()
    per_chunk = max(1, int(chunk_seconds // interval))
    if header:
        out.write(",".join(FIELDS) + "\n")
    samples: list[Sample] = []
    align: float | None = None
    remaining, chunks = count, 0
    run: HostRun | None = None
    while remaining > 0:
        k = min(per_chunk, remaining)
        command = remote_command(host.name, interval, k, align)
        run = run_one(host, command, program, connect_timeout, timeout=k * interval + 30)
        chunks += 1
        got = parse_csv(run.stdout)
        for s in got:
            out.write(_row(s))
        out.flush()
        samples.extend(got)
        if on_chunk is not None:
            on_chunk(got)
        if run.status is not Status.OK and not (run.exit_code == 3 and got):
            break  # unreachable, timed out, or the sampler failed: stop, keep what came back
        if align is None and got:
            align = got[0].epoch
        remaining -= k  # the next chunk samples on align + n * interval: the spacing survives the SSH round trip
    assert run is not None
    error = None
    if run.status is not Status.OK and not (run.exit_code == 3 and samples):
        detail = run.error or (run.stderr.strip().splitlines() or [f"exit {run.exit_code}"])[-1]
        error = f"{host.name}: {run.status.value}: {detail}"
    elif any(s.error for s in samples):
        error = f"{host.name}: NVML: {next(s.error for s in samples if s.error)}"
    return MonitorResult(host.name, tuple(samples), chunks, run.status, error)
