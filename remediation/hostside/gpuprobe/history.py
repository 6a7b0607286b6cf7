"""apt history: the kernel and NVIDIA stanzas of /var/log/apt/history.log*."""

import gzip
import os
import re

from .common import (
    KERNEL_FAMILY,
    Options,  # noqa: F401 - type comments
    _unrooted,
)

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Any, Dict, List  # noqa: F401 - type comments

APT_HISTORY_MAX_BYTES = 2 * 1024 * 1024

# Stanzas worth sending: kernel image/headers/modules (versioned or meta) and NVIDIA/CUDA driver packages.
# linux-libc-dev, linux-perf, linux-firmware alone do not qualify.
HISTORY_PATTERN = re.compile(r"(?<![\w.+-])linux-(?:%s)|nvidia|cuda-drivers" % KERNEL_FAMILY, re.IGNORECASE)


def split_history_stanzas(text):
    # type: (str) -> List[str]
    """Split history.log text into stanzas: each begins at a ``Start-Date:`` line."""
    stanzas = []  # type: List[str]
    current = []  # type: List[str]
    for line in text.splitlines():
        if line.lstrip().startswith("Start-Date:") and current:
            stanzas.append("\n".join(current).strip("\n"))
            current = []
        if not line.strip() and not current:
            continue
        current.append(line)
    if current:
        stanzas.append("\n".join(current).strip("\n"))
    return [s for s in stanzas if s.strip()]


def select_history_stanzas(text):
    # type: (str) -> List[str]
    return [s for s in split_history_stanzas(text) if HISTORY_PATTERN.search(s)]


def _history_files(directory):
    # type: (str) -> List[str]
    """history.log, history.log.1, history.log.2.gz, ... newest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    ranked = []
    for name in names:
        match = re.match(r"^history\.log(?:\.(\d+))?(\.gz)?$", name)
        if match:
            ranked.append((int(match.group(1) or 0), name))
    return [os.path.join(directory, name) for _, name in sorted(ranked)]


def collect_apt_history(options):
    # type: (Options) -> Dict[str, Any]
    files = _history_files(options.path("/var/log/apt"))
    budget = APT_HISTORY_MAX_BYTES
    used_files = []  # type: List[str]
    chunks = []  # type: List[str]  # newest file first; reversed below
    truncated = False
    errors = []  # type: List[str]
    for path in files:
        if budget <= 0:
            truncated = True
            break
        try:
            if path.endswith(".gz"):
                with gzip.open(path, "rb") as handle:
                    data = handle.read(budget + 1)
            else:
                with open(path, "rb") as handle:
                    handle.seek(0, os.SEEK_END)
                    size = handle.tell()
                    handle.seek(max(0, size - budget - 1))
                    data = handle.read()
        except (IOError, OSError, EOFError) as exc:
            errors.append("%s: %s" % (path, exc))
            continue
        if len(data) > budget:
            truncated = True
            data = data[-budget:]
        budget -= len(data)
        chunks.append(data.decode("utf-8", "replace"))
        used_files.append(_unrooted(options, path) or path)
    stanzas = []  # type: List[str]
    for text in reversed(chunks):  # oldest file first: stanzas come out in chronological order
        stanzas.extend(select_history_stanzas(text))
    return {
        "files": used_files,
        "stanzas": len(stanzas),
        "truncated": truncated,
        "text": "\n\n".join(stanzas) + ("\n" if stanzas else ""),
        "error": "; ".join(errors) if errors else None,
    }
