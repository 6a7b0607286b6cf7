"""The gate under load: after an action, a short GPU load on the host and NVML watched while it runs.

"Healthy after reboot" that fails under load is how remediation storms start; so the gate of
:func:`remediation.remediate.act.gate` (finding gone, NVML answers, the expected driver) is followed, for the hosts
that passed it, by :func:`run_load`: the host program :mod:`remediation.hostside.gpuload` travels over the fan-out
(bundled by :func:`remediation.hostside.bundle_program`, with pynvml for hosts without one), runs a bounded load
(a matmul burst per GPU where torch or cupy is importable; on the lab, the lab NVML stand-in's load hook) for
``remediate.load_gate_seconds`` and samples NVML during it. :func:`judge` turns its document into a
:class:`LoadVerdict`:

- **failed**: an NVML error during the load (a GPU lost, NVML gone), a new Xid in the kernel log, the load itself
  broke, a GPU whose utilisation never reached :data:`MIN_UTIL` percent (the load did not reach it), no sample, or
  no GPU; with ``remediate.load_gate: required``, also a host with no load tool;
- **skipped**: no load tool on the host (no torch/cupy, not the lab's NVML) under ``when-available`` (the default):
  the gate passes on the other checks and says the load was not run; ``off`` never runs the program;
- **no answer**: the host could not be reached or the program gave no document (no verdict: an ambiguous outcome,
  as for a re-audit that could not probe).

The setting is ``remediate.load_gate``: ``required | when-available | off`` (default ``when-available``: a fleet
whose hosts carry no CUDA Python stack is still gated on NVML and the driver, and says so).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from remediation.core.errors import UsageError
from remediation.hostside import bundle_program
from remediation.transport.fanout import HostRun, Status, fan_out
from remediation.transport.inventory import Host

__all__ = ["MIN_UTIL", "SCHEMA", "LoadMode", "LoadResult", "LoadVerdict", "judge", "load_mode", "remote_command",
           "run_load", "verdict_of"]

SCHEMA = "gpufleet.gpuload/1"
#: A GPU under load must show at least this utilisation (percent) in one sample, or the load did not reach it.
MIN_UTIL = 30
MAX_SECONDS = 30.0


class LoadMode(StrEnum):
    REQUIRED = "required"
    WHEN_AVAILABLE = "when-available"
    OFF = "off"


class LoadResult(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    NO_ANSWER = "no-answer"


@dataclass(frozen=True)
class LoadVerdict:
    host: str
    result: LoadResult
    why: str
    tool: str | None = None

    @property
    def passed(self) -> bool | None:
        """True (passed, or skipped by the setting), False (failed), None (no answer: no verdict)."""
        if self.result is LoadResult.NO_ANSWER:
            return None
        return self.result is not LoadResult.FAILED

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "result": self.result.value, "why": self.why, "tool": self.tool}


def load_mode(value: str) -> LoadMode:
    """``remediate.load_gate`` as a :class:`LoadMode`, or one line naming the choices."""
    try:
        return LoadMode(str(value).strip().lower())
    except ValueError:
        raise UsageError(f"setting remediate.load_gate {value!r}: give required, when-available or off") from None


def _gpu_verdict(gpu: Mapping[str, Any], min_util: int) -> str | None:
    """Why one GPU failed under load, or None."""
    index = gpu.get("index", "?")
    samples = [s for s in gpu.get("samples") or [] if isinstance(s, Mapping)]
    errors = [str(s["error"]) for s in samples if s.get("error")]
    if errors:
        return f"GPU {index}: NVML failed under load ({errors[0]}; {len(errors)} of {len(samples)} samples)"
    if gpu.get("load_error"):
        return f"GPU {index}: the load broke ({gpu['load_error']})"
    utils = [int(s["util_gpu"]) for s in samples if isinstance(s.get("util_gpu"), int)]
    if not utils:
        return f"GPU {index}: no NVML sample during the load"
    if max(utils) < min_util:
        return f"GPU {index}: utilisation at most {max(utils)} % under load (at least {min_util} % expected)"
    return None


def judge(host: str, doc: Mapping[str, Any], mode: LoadMode, min_util: int = MIN_UTIL) -> LoadVerdict:
    """The load gate's verdict from the host program's document (see the module docstring)."""
    tool = doc.get("tool") if isinstance(doc.get("tool"), str) else None
    if doc.get("nvml_error"):
        return LoadVerdict(host, LoadResult.FAILED, f"load gate: {doc['nvml_error']}", tool)
    gpus = [g for g in doc.get("gpus") or [] if isinstance(g, Mapping)]
    if not gpus:
        return LoadVerdict(host, LoadResult.FAILED, "load gate: NVML counts no GPU", tool)
    if tool is None:
        note = str(doc.get("tool_note") or "no load tool on the host")
        if mode is LoadMode.REQUIRED:
            return LoadVerdict(host, LoadResult.FAILED, f"load gate: {note} (remediate.load_gate: required)")
        return LoadVerdict(host, LoadResult.SKIPPED, f"load gate skipped: {note}")
    problems = [p for p in (_gpu_verdict(g, min_util) for g in gpus) if p]
    xids = [str(x) for x in doc.get("xid_new") or []]
    if xids:
        problems.append(f"{len(xids)} Xid line(s) logged during the load: {xids[0]}")
    if problems:
        return LoadVerdict(host, LoadResult.FAILED, "load gate: " + "; ".join(problems[:3]), tool)
    peaks = [max(int(s["util_gpu"]) for s in g["samples"] if isinstance(s.get("util_gpu"), int)) for g in gpus]
    peak = f"{min(peaks)}" if min(peaks) == max(peaks) else f"{min(peaks)}-{max(peaks)}"
    return LoadVerdict(host, LoadResult.PASSED,
                       f"load gate passed: {len(gpus)} GPU(s) under {tool} load for {doc.get('seconds', '?')} s, "
                       f"NVML answered, peak utilisation {peak} %, no Xid", tool)


def verdict_of(run: HostRun, mode: LoadMode) -> LoadVerdict:
    """One host's fan-out result -> :class:`LoadVerdict` (never raises)."""
    if run.status in (Status.UNREACHABLE, Status.TIMED_OUT):
        return LoadVerdict(run.host, LoadResult.NO_ANSWER, f"load gate: {run.status.value}: {run.error or '?'}")
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        detail = run.error or (run.stderr.strip().splitlines() or [f"exit {run.exit_code}"])[-1]
        return LoadVerdict(run.host, LoadResult.NO_ANSWER, f"load gate: the load program gave no result ({detail})")
    return judge(run.host, doc, mode)


def remote_command(seconds: float) -> str:
    if not 0 < seconds <= MAX_SECONDS:
        raise UsageError(f"setting remediate.load_gate_seconds {seconds:g}: give 1 to {MAX_SECONDS:g} seconds")
    return shlex.join(["python3", "-I", "-", "--seconds", f"{seconds:g}"])


def run_load(hosts: Iterable[Host], *, mode: LoadMode | str = LoadMode.WHEN_AVAILABLE, seconds: float = 5.0,
             concurrency: int = 32, connect_timeout: float = 10.0) -> dict[str, LoadVerdict]:
    """The load gate on every host at once (one SSH round trip each, bounded by ``seconds`` + 60 s)."""
    mode = load_mode(mode) if isinstance(mode, str) else mode
    chosen: Sequence[Host] = list(hosts)
    if mode is LoadMode.OFF:
        return {h.name: LoadVerdict(h.name, LoadResult.SKIPPED, "load gate off (remediate.load_gate: off)")
                for h in chosen}
    from remediation.hostside import GPULOAD_PATH

    program = bundle_program(GPULOAD_PATH.read_text(encoding="utf-8"), "gpuload")
    result = fan_out(chosen, remote_command(seconds), stdin=program, concurrency=concurrency,
                     connect_timeout=connect_timeout, timeout=seconds + 60)
    return {name: verdict_of(run, mode) for name, run in result.runs.items()}
