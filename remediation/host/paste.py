"""Split a paste into its parts: each run of lines of one kind (nvidia-smi, kernel log, apt history, ...).

An on-call paste is often several outputs one after another: ``nvidia-smi``'s failure, ``modprobe``'s FATAL line,
``apt history``; or ``dkms status`` next to ``uname -r``. :func:`split` cuts the text into blocks (at blank lines,
at shell prompts such as ``$ dkms status`` or ``user@host:~$ uname -r``, and around a bare kernel release line,
which is ``uname -r``'s output), gives each block the kind :func:`~remediation.core.parsers.detect_kind` finds for
it, and joins neighbouring blocks of one kind into a :class:`Part`. Kernel lines beside nvidia-smi output join its
part (the ``nvml`` diagnosis reads them), and a block of no kind between two blocks of the same kind belongs to
that kind (the sections of ``nvidia-smi -q``, apt history stanzas with a comment between them). Blocks of no kind
elsewhere are :class:`Part` with kind ``unknown``: the parts ``diagnose`` could not read.

A ``transcript`` part (``uname -r`` / ``uname -a`` output, ``find /lib/modules`` lines naming an ``nvidia.ko``) is
no registered kind: it gives the running kernel (and the kernels that have a module) to the cross-kind rules and
has no finding of its own.

Linear: one pass over the lines, one kind detection per block (every block's text once), at most
:data:`MAX_BLOCKS` blocks (past that the rest is one block).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from remediation.core.parsers import UNKNOWN, detect_kind

__all__ = ["MAX_BLOCKS", "TRANSCRIPT", "Part", "has_transcript", "kernel_release", "split"]

TRANSCRIPT = "transcript"
#: Past this many blocks the rest of the text is one block (keeps detection cheap on pathological input).
MAX_BLOCKS = 400

# A shell prompt that starts a command's output: "$ cmd", "# cmd", "user@host:~$ cmd", "[user@host ~]$ cmd".
_PROMPT_HEAD = r"[ \t]*(?:[\w.-]{1,64}@[\w.-]{1,64}:[^\s$#]{0,256}[ \t]?|\[[^\]\n]{1,128}\][ \t]?)?[$#]"
_PROMPT = re.compile(_PROMPT_HEAD + r"[ \t]+\S")
_UNAME_CMD = re.compile(_PROMPT_HEAD + r"[ \t]*uname\b")
# uname -r's output alone on its line: 6.5.0-45-generic, 5.15.0-1068-azure, 6.8.0-45.45~22.04.1 ...
_KERNEL_ALONE = re.compile(r"[ \t]*([0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,6}[-.+_~][0-9A-Za-z.+_~-]{0,128})[ \t]*", re.ASCII)
# uname -a: Linux gpu-07 6.5.0-45-generic #45~22.04.1-Ubuntu SMP ...
_UNAME_A = re.compile(r"[ \t]*Linux[ \t]+\S{1,255}[ \t]+([0-9]{1,4}\.[0-9]{1,4}\S{0,128})[ \t]+#", re.ASCII)
# Kinds whose text the nvml diagnosis reads as well: they join an nvml part beside them.
_JOINS_NVML = frozenset({"kernel-log", TRANSCRIPT})


@dataclass(frozen=True)
class Part:
    """Lines ``first``..``last`` (1-based, inclusive) of the paste, of kind ``kind`` (``unknown``: not read)."""

    kind: str
    first: int
    last: int
    text: str


def kernel_release(line: str) -> str | None:
    """The kernel release ``line`` gives as ``uname -r`` or ``uname -a`` output, else ``None``."""
    m = _KERNEL_ALONE.fullmatch(line) or _UNAME_A.match(line)
    return m.group(1) if m else None


def _module_path(line: str) -> bool:
    """``find /lib/modules``'s output: a path to an NVIDIA kernel module (or its directory)."""
    path = line.strip()
    return path.startswith("/lib/modules/") and " " not in path and "nvidia" in path


def has_transcript(text: str) -> bool:
    """Whether a line of ``text`` is ``uname``'s output or a path to an NVIDIA module (a ``transcript`` part)."""
    return any(kernel_release(line) is not None or _module_path(line) for line in _lines(text))


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) 0-based line indexes of each block; blank lines belong to none."""
    blocks: list[tuple[int, int]] = []
    start: int | None = None
    for i, line in enumerate(lines):
        if len(blocks) >= MAX_BLOCKS - 1:  # the rest is one block
            if start is None and line.strip():
                start = i
            continue
        if not line.strip():
            if start is not None:
                blocks.append((start, i - 1))
                start = None
            continue
        if start is not None and _PROMPT.match(line):
            blocks.append((start, i - 1))
            start = None
        if kernel_release(line) is not None:
            # uname's output is a block of its own, with the "$ uname -r" line right above it
            if start is not None and not (start == i - 1 and _UNAME_CMD.match(lines[start])):
                blocks.append((start, i - 1))
                start = None
            blocks.append((i if start is None else start, i))
            start = None
            continue
        if start is None:
            start = i
    if start is not None:
        blocks.append((start, len(lines) - 1))
    return blocks


def _kind(lines: list[str], first: int, last: int, text: str) -> str:
    kind = detect_kind(text)
    if kind != UNKNOWN:
        return kind
    body = [line for line in lines[first : last + 1] if not _PROMPT.match(line)]
    if body and all(kernel_release(line) is not None or _module_path(line) for line in body):
        return TRANSCRIPT
    if all(_PROMPT.match(line) for line in lines[first : last + 1]):
        return ""  # a command with no output: no part
    return UNKNOWN


def split(text: str, kind: str | None = None) -> list[Part]:
    """The parts of ``text`` in order. Never raises; blank text gives ``[]``.

    ``kind``: the kind of ``text`` as a whole when the caller knows it (a text of one block is one part of it).
    """
    lines = _lines(text)
    blocks = _blocks(lines)
    if len(blocks) == 1 and kind is not None:
        first, last = blocks[0]
        return [Part(kind, first + 1, last + 1, "\n".join(lines[first : last + 1]))]
    typed: list[tuple[str, int, int]] = []
    for first, last in blocks:
        kind = _kind(lines, first, last, "\n".join(lines[first : last + 1]))
        if kind:
            typed.append((kind, first, last))
    # A block of no kind between two blocks of one kind is part of that kind.
    for i in range(1, len(typed) - 1):
        if typed[i][0] == UNKNOWN and typed[i - 1][0] == typed[i + 1][0] != UNKNOWN:
            typed[i] = (typed[i - 1][0], typed[i][1], typed[i][2])
    merged: list[tuple[str, int, int]] = []
    for kind, first, last in typed:
        if merged:
            prev_kind, prev_first, _ = merged[-1]
            joins = (
                prev_kind == kind
                or (prev_kind == "nvml" and kind in _JOINS_NVML)
                or (kind == "nvml" and prev_kind in _JOINS_NVML)
            )
            if joins:
                merged[-1] = ("nvml" if "nvml" in (kind, prev_kind) else kind, prev_first, last)
                continue
        merged.append((kind, first, last))
    return [Part(kind, first + 1, last + 1, "\n".join(lines[first : last + 1])) for kind, first, last in merged]
