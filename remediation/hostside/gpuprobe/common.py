"""Options, constants and small helpers every section of the probe shares."""

import contextlib
import datetime
import os
import signal
import subprocess

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Dict, Iterable, List, Optional  # noqa: F401 - type comments

SCHEMA = "gpufleet.facts/1"
PROBE_VERSION = "1.0.0"

DEFAULT_NVML_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 10.0
REAP_GRACE_S = 2.0

# The words after "linux-" in kernel package names (image, headers, modules; versioned or meta) and their
# flavours: the apt history stanzas worth sending (history.HISTORY_PATTERN) and the kernel meta-packages
# (packages.KERNEL_META_RE) are both built on it.
KERNEL_FAMILY = (
    r"image|headers|modules|generic|virtual|lowlatency|azure|aws|gcp|oracle|kvm|oem|hwe|cloud|signed|"
    r"unsigned|raspi|ibm|nvidia|amd64|arm64"
)


class Options(object):
    """Probe options.  ``root`` prefixes every host file path (testing against a sample tree)."""

    def __init__(
        self,
        nvml_timeout=DEFAULT_NVML_TIMEOUT_S,  # type: float
        simulate_upgrades=False,  # type: bool
        root="/",  # type: str
        kernel_release=None,  # type: Optional[str]
        skip_nvml=False,  # type: bool
        command_timeout=COMMAND_TIMEOUT_S,  # type: float
    ):
        # type: (...) -> None
        self.nvml_timeout = float(nvml_timeout)
        self.simulate_upgrades = bool(simulate_upgrades)
        self.root = root or "/"
        self.kernel_release = kernel_release
        self.skip_nvml = bool(skip_nvml)
        self.command_timeout = float(command_timeout)

    @classmethod
    def from_mapping(cls, values):
        # type: (Optional[Dict[str, Any]]) -> Options
        values = dict(values or {})
        known = ("nvml_timeout", "simulate_upgrades", "root", "kernel_release", "skip_nvml", "command_timeout")
        unknown = sorted(k for k in values if k not in known)
        if unknown:
            raise ValueError("unknown probe option(s): %s" % ", ".join(unknown))
        return cls(**{k: v for k, v in values.items() if v is not None})

    def path(self, *parts):
        # type: (str) -> str
        joined = os.path.join(*parts)
        if self.root in ("", "/"):
            return joined
        return os.path.join(self.root, joined.lstrip("/"))


def _utc_iso(ts):
    # type: (float) -> str
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_text(path, limit=None):
    # type: (str, Optional[int]) -> str
    with open(path, "rb") as handle:
        data = handle.read() if limit is None else handle.read(limit)
    return data.decode("utf-8", "replace")


def _read_text_or_none(path):
    # type: (str) -> Optional[str]
    try:
        return _read_text(path)
    except (IOError, OSError):
        return None


def run_command(argv, timeout):
    # type: (List[str], float) -> Dict[str, Any]
    """Run a command with a timeout; the result is data: {rc, stdout, stderr, error}."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except (IOError, OSError) as exc:
        return {"rc": None, "stdout": "", "stderr": "", "error": "%s: %s" % (argv[0], exc)}
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        return {
            "rc": None,
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
            "error": "%s timed out after %.0f s" % (argv[0], timeout),
        }
    return {
        "rc": proc.returncode,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
        "error": None,
    }


def _kill_group(pid):
    # type: (int) -> None
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _which(name, extra_dirs=("/usr/sbin", "/sbin", "/usr/bin", "/bin")):
    # type: (str, Iterable[str]) -> Optional[str]
    dirs = os.environ.get("PATH", "").split(os.pathsep) + list(extra_dirs)
    for directory in dirs:
        candidate = os.path.join(directory, name)
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def upstream_version(version):
    # type: (Optional[str]) -> Optional[str]
    """Debian version -> upstream part: '535.183.01-0ubuntu0.22.04.1' -> '535.183.01'."""
    if not version:
        return None
    if ":" in version:
        version = version.split(":", 1)[1]
    if "-" in version:
        version = version.rsplit("-", 1)[0]
    return version


def _proc_comm(pid):
    # type: (int) -> Optional[str]
    text = _read_text_or_none("/proc/%d/comm" % pid)
    return text.strip() if text is not None else None


def _unrooted(options, path):
    # type: (Options, Optional[str]) -> Optional[str]
    if path is None or options.root in ("", "/"):
        return path
    root = options.root.rstrip("/")
    return path[len(root) :] if path.startswith(root) else path
