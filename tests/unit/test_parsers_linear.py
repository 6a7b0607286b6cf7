"""Issue 20 item 2: no parser hangs on pasted text. Every text entry point reads 1 MiB of adversarial text in < 2 s.

The entry points are discovered from the kind registry (:func:`remediation.core.parsers.kinds`: each kind's ``score``,
``parse`` and its diagnosis through :func:`remediation.host.diagnose.diagnose`), so a new kind is covered without
editing this file; the areas' own task functions (k8s pending/latency, aoai, train OOM) are listed below.

The documents are generated, deterministic, and built from what makes a backtracking regex quadratic: long runs of
one character class (``|``, ``| ``, spaces, tabs, ``:``, digits, ``[``, ``(``, ``=``...) that end in something no
pattern expects, the same runs as one 1 MiB line, many short lines, and every parser's keywords repeated. Time is
this process's CPU time, so a busy machine does not fail the test; a quadratic regex takes minutes on these inputs.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.aoai.analysis import analyse
from remediation.aoai.settings import AoaiSettings
from remediation.core.errors import RemediationError
from remediation.core.parsers import kinds
from remediation.core.parsers._text import clean_line
from remediation.host.diagnose import diagnose
from remediation.k8s.latency import cpu_throttling
from remediation.k8s.pending import diagnose_pending
from remediation.train.api import diagnose_oom
from remediation.train.settings import TrainSettings

SIZE = 1 << 20
LIMIT_S = 2.0
#: diagnose with the kind detected scores the text with every kind, then parses it: several passes, still linear
#: (a quadratic pass over 1 MiB takes minutes, not seconds)
COMPOSITE_LIMIT_S = 5.0

# Runs of one character class, and two-character alternations (what ``(?:\s*\|)+`` or ``\d+\s*/`` feed on).
UNITS = (
    "|", "| ", " |", " ", "\t", " \t", ":", ": ", "0", "1.", "1 ", "1/", "[", "[ ", "(", "( ", "=", "x=", "-", ".",
    "/", ",", ", ", "'", '"', "`", "{", "<", ">", "#", "a", "a ", "a-", "W-1-", "\u2019", "\x00", "\r",
)  # fmt: skip
# Words the parsers' patterns start from, so each pattern gets past its first token and backtracks on what follows.
KEYWORDS = (
    "NVRM: Xid (PCI:0000:00:1e): 79, pid=", "NVRM: API mismatch", "NVRM: RmInitAdapter failed!", "nvidia-smi",
    "NVIDIA-SMI has failed because it couldn't communicate", "Failed to initialize NVML:", "nvml error:",
    "Unable to determine the device handle for GPU", "modprobe: FATAL: Module nvidia", "[ 12.345678]",
    "Start-Date: 2024-01-01  00:00:00", "Commandline: apt-get", "Install: linux-image-6.5.0-45-generic:amd64 (",
    "Upgrade:", "dkms status", "nvidia/535.183.01, 6.5.0-45-generic, x86_64:", "Bad return status for module build",
    "Skipping kernel", "Building module", "Installing to /lib/modules/", "Starting unattended upgrades script",
    "Allowed origins are:", "Initial blacklist:", "Packages that will be upgraded:", "Package linux is blacklisted",
    "0/5 nodes are available:", "Insufficient nvidia.com/gpu", "1 node(s) had untolerated taint {", "FailedScheduling",
    "Warning  FailedScheduling  3m  default-scheduler", "Events:", "pod didn't trigger scale-up:",
    "Loading model weights took", "Loading safetensors checkpoint shards: 100%|", "Shard ready in", "W-9000-model.ms:",
    "container_cpu_cfs_periods_total{", "HTTP 429", "Retry-After:", "Requests to the ChatCompletions_Create",
    "retry after", "x-ratelimit-remaining-tokens:", "/openai/deployments/", '"code": "429"', "Rate limit",
    "CUDA out of memory. Tried to allocate", "GPU 0 has a total capacity of", "(GPU 0;", "Process 12 has",
    "of which", "GiB", "MiB", "reserved by PyTorch but unallocated", "torch.OutOfMemoryError", "HIP out of memory",
)  # fmt: skip


def _fill(parts: list[str], sep: str) -> str:
    out, size = [], 0
    while size < SIZE:
        for part in parts:
            out.append(part)
            size += len(part) + len(sep)
    return sep.join(out)[:SIZE]


def _run(unit: str, length: int) -> str:
    return (unit * (length // len(unit) + 1))[:length]


DOCUMENTS: dict[str, str] = {
    # 64 KiB lines, one per unit, each ending in a character no pattern expects there.
    "long-lines": _fill([_run(u, 1 << 16) + "\x7f" for u in UNITS], "\n"),
    # The same runs in one line of 1 MiB.
    "one-line": _fill([_run(u, 1 << 15) + "~" for u in UNITS], ""),
    # Many short lines of every unit.
    "short-lines": _fill([_run(u, 79) for u in UNITS], "\n"),
    # Each keyword followed by runs the rest of its pattern could backtrack over.
    "keywords-lines": _fill([k + _run(u, 200) for k in KEYWORDS for u in (" ", "|", "1", ":", "(")], "\n"),
    "keywords-one-line": _fill([k + " " + _run(u, 2000) for k in KEYWORDS for u in ("| ", "0", "[", "=")], " "),
}


def _registry_entry_points() -> list[tuple[str, Callable[[str], object]]]:
    entries: list[tuple[str, Callable[[str], object]]] = [("diagnose(auto)", diagnose)]
    for name, spec in kinds().items():
        entries.append((f"{name}.score", spec.score))
        entries.append((f"{name}.parse", spec.parse))
        entries.append((f"diagnose(kind={name})", functools.partial(diagnose, kind=name)))
    return entries


AREA_ENTRY_POINTS: list[tuple[str, Callable[[str], object]]] = [
    ("k8s.diagnose_pending", diagnose_pending),
    ("k8s.cpu_throttling", cpu_throttling),
    ("aoai.analyse", lambda text: analyse(text, AoaiSettings())),
    ("train.diagnose_oom", lambda text: diagnose_oom(text, TrainSettings())),
]
ENTRY_POINTS = _registry_entry_points() + AREA_ENTRY_POINTS


def test_documents_are_one_mebibyte_each() -> None:
    assert all(len(doc) == SIZE for doc in DOCUMENTS.values())
    assert len(ENTRY_POINTS) >= 3 * 5 + 1  # the five host kinds at least, and the plugins once loaded


@pytest.mark.parametrize(("name", "entry"), ENTRY_POINTS, ids=[name for name, _ in ENTRY_POINTS])
def test_entry_point_is_linear_on_adversarial_text(name: str, entry: Callable[[str], object]) -> None:
    slow = []
    for doc_name, doc in DOCUMENTS.items():
        start = time.process_time()
        # The project's own refusal (e.g. "nothing in it is a request") is an answer too, if it comes in time.
        with contextlib.suppress(RemediationError):
            entry(doc)
        spent = time.process_time() - start
        if spent >= (COMPOSITE_LIMIT_S if name == "diagnose(auto)" else LIMIT_S):
            slow.append(f"{doc_name}: {spent:.1f} s")
    assert not slow, f"{name} is not linear: {slow}"


# --- the rewrites keep their meaning ---------------------------------------------------------------------------

_OLD_TABLE_RESIDUE = re.compile(r"(?:\s*\|)+\s*$")  # the quadratic original, for short inputs only


def _old_clean_line(line: str) -> str:
    line = _OLD_TABLE_RESIDUE.sub("", line.rstrip())
    stripped = line.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "`\"'":
        line = line.replace(stripped, stripped[1:-1], 1)
    elif stripped[:1] in ("`", '"'):
        line = line.replace(stripped[0], "", 1)
    elif stripped[-1:] in ("`", '"'):
        line = line[: line.rstrip().rfind(stripped[-1])]
    return line.rstrip()


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(" |\tx`\"'\u00a0\u2003\x0b:"), max_size=40))
def test_table_residue_is_stripped_as_the_regex_did(line: str) -> None:
    assert clean_line(line) == _old_clean_line(line)
