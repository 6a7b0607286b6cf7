"""The load gate's host program: a short, bounded GPU load, and what NVML says while it runs.

Runs on a GPU host (Python >= 3.8, standard library + pynvml; sent over the fan-out by
:func:`remediation.hostside.bundle_program`, see :mod:`remediation.remediate.loadgate`) and prints one JSON document
on its last line::

    {"schema": "gpufleet.gpuload/1", "tool": "torch" | "cupy" | "lab" | null, "tool_note": "...",
     "gpus": [{"index": 0, "samples": [{"t": 0.2, "util_gpu": 97, "error": null}, ...], "load_error": null}],
     "nvml_error": null, "xid_new": ["NVRM: Xid (PCI:...): 79, ..."], "xid_error": null, "seconds": 4.1}

The load, first that applies:

* ``torch`` (with CUDA) or ``cupy`` importable: a matmul burst on every GPU, one thread each, for ``--seconds``, on
  two square fp16 matrices of ``--size`` (default 4096: 32 MiB each, bounded whatever the GPU);
* the lab's NVML stand-in (it exports ``gpulabLoadHookVersion``; see lab/native/README.md): the lab has no GPU to
  run a kernel on, so the program writes the hook's state file (``$GPULAB_STATE_DIR`` or ``/run/gpulab``, file
  ``load``, with an ``until`` time that expires by itself) for the length of the load, and removes it after;
* neither: ``tool`` is null and ``tool_note`` says why; nothing is loaded (the controller decides whether that fails
  the gate, per ``remediate.load_gate``).

While the load runs, every ``--interval`` seconds each GPU's handle is looked up afresh and its utilisation read; an
NVML error (a GPU lost under load) is recorded in the sample. Xid lines the kernel logged during the load (``dmesg``
before and after) are reported. The program never raises: every failure is a field of the document. It judges
nothing: the verdict is the controller's (:func:`remediation.remediate.loadgate.judge`).
"""

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple  # noqa: F401 - used in type comments (3.8)

SCHEMA = "gpufleet.gpuload/1"
MAX_SECONDS = 30.0
LAB_HOOK_SYMBOL = "gpulabLoadHookVersion"
XID_MARK = "NVRM: Xid"


def lab_state_dir():
    # type: () -> str
    return os.environ.get("GPULAB_STATE_DIR") or "/run/gpulab"


def lab_hook():
    # type: () -> bool
    """Whether the NVML library this host loads is the lab's stand-in with its load hook."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return hasattr(lib, LAB_HOOK_SYMBOL)


def find_tool():
    # type: () -> Tuple[Optional[str], Any, str]
    """(tool, module or None, note): the load this host can run."""
    notes = []
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]

        if torch.cuda.is_available():
            return "torch", torch, "torch %s, CUDA" % torch.__version__
        notes.append("torch without CUDA")
    except Exception as exc:  # ImportError, or a broken install
        notes.append("torch not importable (%s)" % type(exc).__name__)
    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "cupy", cupy, "cupy %s" % cupy.__version__
        notes.append("cupy sees no GPU")
    except Exception as exc:
        notes.append("cupy not importable (%s)" % type(exc).__name__)
    if lab_hook():
        return "lab", None, "the lab's NVML load hook (%s)" % LAB_HOOK_SYMBOL
    notes.append("no lab NVML load hook")
    return None, None, "no load tool on the host: " + "; ".join(notes)


def xid_lines():
    # type: () -> Tuple[List[str], Optional[str]]
    """(the kernel log's Xid lines, error or None)."""
    try:
        run = subprocess.run(["dmesg"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], "dmesg: %s" % exc
    if run.returncode != 0:
        return [], "dmesg exited %s" % run.returncode
    text = run.stdout.decode("utf-8", "replace")
    return [line.strip() for line in text.splitlines() if XID_MARK in line], None


def new_lines(before, after):
    # type: (List[str], List[str]) -> List[str]
    """The lines of ``after`` beyond those of ``before`` (counted, so a repeated line still counts once more)."""
    seen = {}  # type: Dict[str, int]
    for line in before:
        seen[line] = seen.get(line, 0) + 1
    out = []
    for line in after:
        if seen.get(line, 0) > 0:
            seen[line] -= 1
        else:
            out.append(line)
    return out[:20]


class Burst(threading.Thread):
    """A matmul loop on one GPU until ``deadline``; its error, if any, in ``error``."""

    def __init__(self, tool, module, index, size, deadline):
        # type: (str, Any, int, int, float) -> None
        threading.Thread.__init__(self, daemon=True)
        self.tool, self.module, self.index, self.size, self.deadline = tool, module, index, size, deadline
        self.error = None  # type: Optional[str]
        self.rounds = 0

    def run(self):
        # type: () -> None
        try:
            if self.tool == "torch":
                torch = self.module
                dev = torch.device("cuda", self.index)
                a = torch.randn(self.size, self.size, device=dev, dtype=torch.float16)
                b = torch.randn(self.size, self.size, device=dev, dtype=torch.float16)
                while time.time() < self.deadline:
                    for _ in range(8):
                        a = torch.matmul(a, b).clamp_(-1.0, 1.0)
                    torch.cuda.synchronize(dev)
                    self.rounds += 1
                if not bool(torch.isfinite(a).all()):
                    self.error = "the matmul gave non-finite values"
            else:
                cupy = self.module
                with cupy.cuda.Device(self.index):
                    a = cupy.random.standard_normal((self.size, self.size)).astype(cupy.float16)
                    b = cupy.random.standard_normal((self.size, self.size)).astype(cupy.float16)
                    while time.time() < self.deadline:
                        for _ in range(8):
                            a = cupy.clip(cupy.matmul(a, b), -1.0, 1.0)
                        cupy.cuda.Device(self.index).synchronize()
                        self.rounds += 1
                    if not bool(cupy.isfinite(a).all()):
                        self.error = "the matmul gave non-finite values"
        except Exception as exc:
            self.error = "%s: %s" % (type(exc).__name__, str(exc)[:300])


def write_lab_load(until):
    # type: (float) -> str
    path = os.path.join(lab_state_dir(), "load")
    tmp = path + ".%d" % os.getpid()
    with open(tmp, "w") as handle:
        handle.write("until=%d\nutil_gpu=100\nutil_memory=45\n" % int(until + 1))
    os.rename(tmp, path)
    return path


def sample(pynvml, count, t0):
    # type: (Any, int, float) -> List[Dict[str, Any]]
    out = []
    for i in range(count):
        s = {"t": round(time.time() - t0, 2), "util_gpu": None, "error": None}  # type: Dict[str, Any]
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            s["util_gpu"] = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception as exc:
            s["error"] = str(exc)[:200] or type(exc).__name__
        out.append(s)
    return out


def run_load(seconds, interval, size):
    # type: (float, float, int) -> Dict[str, Any]
    doc = {"schema": SCHEMA, "tool": None, "tool_note": "", "gpus": [], "nvml_error": None, "xid_new": [],
           "xid_error": None, "seconds": 0.0}  # type: Dict[str, Any]
    t0 = time.time()
    tool, module, doc["tool_note"] = find_tool()
    doc["tool"] = tool
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        doc["nvml_error"] = "NVML: %s" % (str(exc)[:200] or type(exc).__name__)
        return doc
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        doc["gpus"] = [{"index": i, "samples": [], "load_error": None} for i in range(count)]
        if tool is None or count == 0:
            return doc
        before, doc["xid_error"] = xid_lines()
        deadline = time.time() + seconds
        bursts = []  # type: List[Burst]
        hook = None
        try:
            if tool == "lab":
                hook = write_lab_load(deadline)
            else:
                bursts = [Burst(tool, module, i, size, deadline) for i in range(count)]
                for b in bursts:
                    b.start()
            time.sleep(min(interval, seconds))
            while time.time() < deadline:
                for g, s in zip(doc["gpus"], sample(pynvml, count, t0)):
                    g["samples"].append(s)
                time.sleep(interval)
        finally:
            if hook is not None:
                with contextlib.suppress(OSError):
                    os.unlink(hook)
            for b in bursts:
                b.join(timeout=30)
        for g, b in zip(doc["gpus"], bursts):
            g["load_error"] = b.error if not b.is_alive() else "the load did not end within 30 s of its deadline"
        after, error = xid_lines()
        doc["xid_error"] = doc["xid_error"] or error
        doc["xid_new"] = new_lines(before, after)
    except Exception as exc:
        doc["nvml_error"] = "NVML: %s" % (str(exc)[:200] or type(exc).__name__)
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
        doc["seconds"] = round(time.time() - t0, 2)
    return doc


def main(argv):
    # type: (List[str]) -> int
    import argparse

    parser = argparse.ArgumentParser(prog="gpuload", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the load (at most 30)")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between NVML samples")
    parser.add_argument("--size", type=int, default=4096, help="matrix side of the matmul burst (fp16)")
    args = parser.parse_args(argv)
    seconds = max(0.5, min(args.seconds, MAX_SECONDS))
    interval = max(0.05, min(args.interval, seconds))
    size = max(256, min(args.size, 8192))
    print(json.dumps(run_load(seconds, interval, size)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
