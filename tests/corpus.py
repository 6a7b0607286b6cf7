"""The field-text corpus (tests/fixtures/corpus/field-text-dev.md, see its SOURCES.md) as fenced blocks keyed by
section id."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "fixtures" / "corpus" / "field-text-dev.md"
_HEADING = re.compile(r"^#{3,4} ([0-9]+[A-Z]?\.[0-9]+)\b")


@cache
def blocks() -> dict[str, list[str]]:
    """Fenced blocks of the corpus, keyed by the section id of the heading above them ("2.4", "4A.1", ...)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    buf: list[str] | None = None
    for line in CORPUS.read_text(encoding="utf-8").split("\n"):
        if buf is None:
            heading = _HEADING.match(line)
            if heading:
                current = heading.group(1)
                out[current] = []
            elif line.startswith("```") and current is not None:
                buf = []
        elif line.startswith("```"):
            assert current is not None
            out[current].append("\n".join(buf))
            buf = None
        else:
            buf.append(line)
    return out
