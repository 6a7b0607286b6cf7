"""The kernel log: NVIDIA lines since boot, from dmesg or the syslog files."""

import datetime
import os
import re

from .common import (
    Options,  # noqa: F401 - type comments
    _which,
    run_command,
)

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Dict, Iterable, List, Optional, Tuple  # noqa: F401 - type comments

KERNEL_LOG_MAX_LINES = 500
KERNEL_LOG_HEAD_LINES = 100  # when capping, keep the first lines since boot and the newest ones
KERN_LOG_TAIL_BYTES = 8 * 1024 * 1024

# NVIDIA lines, plus the kernel's own words when it refuses an unsigned module (Secure Boot lockdown: the
# ``Lockdown: systemd-modules-load: ...`` line at boot names no module).
KERNEL_LOG_PATTERN = re.compile(
    r"NVRM|nvidia|Xid|modprobe|fallen off the bus|Lockdown:|Key was rejected by service|Required key not available"
    r"|module verification failed",
    re.IGNORECASE,
)


def filter_kernel_log_lines(lines, cap=KERNEL_LOG_MAX_LINES):
    # type: (Iterable[str], int) -> Tuple[List[str], int]
    """Keep NVIDIA-related lines; cap to ``cap`` lines (first KERNEL_LOG_HEAD_LINES + newest rest).
    Returns (lines, number dropped)."""
    kept = [line.rstrip("\n") for line in lines if KERNEL_LOG_PATTERN.search(line)]
    if len(kept) <= cap:
        return kept, 0
    head = min(KERNEL_LOG_HEAD_LINES, cap)
    tail = cap - head
    dropped = len(kept) - cap
    return kept[:head] + (kept[-tail:] if tail else []), dropped


_BOOT_MARKER = re.compile(r"(?:\]\s*|kernel:\s*)Linux version \d")
_SYSLOG_TS = re.compile(r"^(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+(?P<time>\d\d:\d\d:\d\d)\s")
_ISO_TS = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(?P<tz>Z|[+-]\d\d:?\d\d)?\s")


def _line_time(line, now):
    # type: (str, datetime.datetime) -> Optional[datetime.datetime]
    match = _ISO_TS.match(line)
    if match:
        stamp = datetime.datetime.strptime(match.group("ts"), "%Y-%m-%dT%H:%M:%S")
        tz = match.group("tz")
        if tz and tz != "Z":
            sign = 1 if tz[0] == "+" else -1
            digits = tz[1:].replace(":", "")
            offset = datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            return (stamp - sign * offset).replace(tzinfo=datetime.timezone.utc)
        if tz == "Z":
            return stamp.replace(tzinfo=datetime.timezone.utc)
        return stamp.astimezone(datetime.timezone.utc)
    match = _SYSLOG_TS.match(line)
    if match:
        try:
            stamp = datetime.datetime.strptime(
                "%d %s %s %s" % (now.year, match.group("mon"), match.group("day"), match.group("time")),
                "%Y %b %d %H:%M:%S",
            ).astimezone(datetime.timezone.utc)
        except ValueError:
            return None
        if stamp > now + datetime.timedelta(days=1):
            stamp = stamp.replace(year=stamp.year - 1)
        return stamp
    return None


def kern_log_since_boot(text, boot_time):
    # type: (str, Optional[datetime.datetime]) -> List[str]
    """Lines of kern.log that belong to the current boot: after the last ``Linux version`` boot
    banner when there is one, else those stamped at or after boot_time (unstamped lines kept)."""
    lines = text.splitlines()
    last_marker = None
    for i, line in enumerate(lines):
        if _BOOT_MARKER.search(line):
            last_marker = i
    if last_marker is not None:
        return lines[last_marker:]
    if boot_time is None:
        return lines
    now = datetime.datetime.now(datetime.timezone.utc)
    slack = datetime.timedelta(seconds=60)
    out = []
    for line in lines:
        stamp = _line_time(line, now)
        if stamp is None or stamp >= boot_time - slack:
            out.append(line)
    return out


def collect_kernel_log(options, boot_time_iso):
    # type: (Options, Optional[str]) -> Dict[str, Any]
    dmesg = _which("dmesg")
    dmesg_error = None  # type: Optional[str]
    if dmesg is not None and options.root in ("", "/"):
        run = run_command([dmesg], options.command_timeout)
        if run["error"] is None and run["rc"] == 0:
            lines, dropped = filter_kernel_log_lines(run["stdout"].splitlines())
            return {"source": "dmesg", "lines": lines, "truncated": dropped, "error": None}
        dmesg_error = run["error"] or ("dmesg exited %s: %s" % (run["rc"], run["stderr"].strip()))
    elif dmesg is None:
        dmesg_error = "dmesg not found"
    boot_time = None
    if boot_time_iso:
        boot_time = datetime.datetime.strptime(boot_time_iso, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc
        )
    for candidate in ("/var/log/kern.log", "/var/log/syslog", "/var/log/messages"):
        path = options.path(candidate)
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - KERN_LOG_TAIL_BYTES))
                text = handle.read().decode("utf-8", "replace")
        except (IOError, OSError):
            continue
        lines, dropped = filter_kernel_log_lines(kern_log_since_boot(text, boot_time))
        return {"source": candidate, "lines": lines, "truncated": dropped, "error": dmesg_error}
    return {"source": None, "lines": [], "truncated": 0, "error": dmesg_error or "no kernel log readable"}
