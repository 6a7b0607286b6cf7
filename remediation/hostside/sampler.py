#!/usr/bin/env python3
"""GPU memory sampler: NVML every N seconds to CSV (the runbook's ``nvidia-smi --query-gpu=timestamp,memory.used,
memory.free,utilization.gpu --format=csv -l 5`` without nvidia-smi).

Runs on a GPU host with the Python standard library (>= 3.8) and ``pynvml``. ``invoke train.monitor`` sends it over
SSH in one bundle with the probe's copy of pynvml (:mod:`remediation.train.monitor`); the ``gpu_memory_log`` role
installs it and runs it from cron. One row per GPU per sample::

    timestamp,host,gpu,memory_used_mib,memory_free_mib,memory_total_mib,utilization_gpu_pct,error

``timestamp`` is UTC ISO 8601 with milliseconds. A GPU that NVML cannot read gives a row with its ``error`` and
empty values; NVML that does not initialise gives one such row per sample with ``gpu`` empty, and exit status 3.
Bounded: ``--count`` samples (1 to 100000), ``--interval`` seconds apart (0.1 to 3600); ``--align EPOCH`` puts
samples on ``EPOCH + k * interval`` so that consecutive runs keep the spacing. ``--out FILE`` appends to FILE
(header written when the file is new or empty), rotating it to ``FILE.1`` past ``--max-bytes``.
"""

import argparse
import contextlib
import datetime
import os
import socket
import sys
import time

FIELDS = (
    "timestamp",
    "host",
    "gpu",
    "memory_used_mib",
    "memory_free_mib",
    "memory_total_mib",
    "utilization_gpu_pct",
    "error",
)
MIB = 1024 * 1024


def _stamp(epoch):
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (moment.microsecond // 1000)


def _clean(text):
    return str(text).replace(",", ";").replace("\n", " ").replace("\r", " ")


def sample(nvml, host, epoch):
    """One sample of every GPU: a list of CSV rows (lists of strings)."""
    stamp = _stamp(epoch)
    rows = []
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:  # NVML errors are data in the CSV
        return [[stamp, host, "", "", "", "", "", _clean(exc)]]
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                util = str(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:  # some GPUs (MIG) have no utilization: empty
                util = ""
            rows.append(
                [stamp, host, str(index), str(memory.used // MIB), str(memory.free // MIB), str(memory.total // MIB),
                 util, ""]
            )
        except Exception as exc:  # one GPU's failure is a row, not a crash
            rows.append([stamp, host, str(index), "", "", "", "", _clean(exc)])
    return rows


class _Writer:
    def __init__(self, path, max_bytes, header):
        self.path = path
        self.max_bytes = max_bytes
        self.header = header

    def write(self, rows):
        lines = "".join(",".join(row) + "\n" for row in rows)
        if self.path is None:
            if self.header:
                sys.stdout.write(",".join(FIELDS) + "\n")
                self.header = False
            sys.stdout.write(lines)
            sys.stdout.flush()
            return
        if self.max_bytes and os.path.exists(self.path) and os.path.getsize(self.path) >= self.max_bytes:
            os.replace(self.path, self.path + ".1")
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        with open(self.path, "a") as handle:
            if new:
                handle.write(",".join(FIELDS) + "\n")
            handle.write(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gpumemlog", description="GPU memory and utilization through NVML, as CSV")
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--align", type=float, default=None)
    parser.add_argument("--host-label", default=None)
    parser.add_argument("--no-header", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--max-bytes", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0.1 <= args.interval <= 3600 or not 1 <= args.count <= 100000:
        sys.stderr.write("--interval must be 0.1..3600 seconds and --count 1..100000\n")
        return 2
    host = args.host_label or socket.gethostname()
    writer = _Writer(args.out, args.max_bytes, not args.no_header)
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        initialised = True
        init_error = None
    except Exception as exc:  # reported as rows, exit 3
        nvml = None
        initialised = False
        init_error = _clean(exc)
    start = time.time()
    if args.align is not None:
        start = args.align + args.interval * max(0, int((start - args.align) / args.interval + 0.999999))
    try:
        for k in range(args.count):
            due = start + k * args.interval
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            now = time.time()
            if initialised:
                writer.write(sample(nvml, host, now))
            else:
                writer.write([[_stamp(now), host, "", "", "", "", "", init_error]])
    finally:
        if initialised:
            with contextlib.suppress(Exception):  # shutting down a failed NVML changes nothing
                nvml.nvmlShutdown()
    return 0 if initialised else 3


if __name__ == "__main__":
    sys.exit(main())
