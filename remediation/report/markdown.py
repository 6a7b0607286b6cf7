"""Putting text from the field into Markdown without letting it change the document's structure.

Evidence (kernel log lines, apt history stanzas, error messages) can contain anything: backticks, ``#``, pipes,
HTML, line breaks. Three ways in, each CommonMark-correct:

- :func:`fence`: a fenced code block whose fence is longer than the longest run of backticks in the text
  (CommonMark: a closing fence must be at least as long as the opening one, so no line inside can close it).
  The text is kept verbatim apart from line endings (every Unicode line break becomes ``\\n``) and NUL (U+FFFD,
  which a CommonMark parser would substitute anyway).
- :func:`code`: an inline code span whose backtick string length does not occur in the text; line breaks
  become spaces.
- :func:`inline`: plain inline text with Markdown punctuation backslash-escaped and line breaks collapsed, and
  a leading ``-``/``+``/``=``/``1.`` escaped, so it stays a paragraph even at the start of a line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["code", "fence", "fence_for", "inline", "lines_of"]

_BACKTICKS = re.compile(r"`+")
_INLINE_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~!&])")
_LIST_START = re.compile(r"^(\d{1,9})([.)])")  # "1." / "1)" at the start of a line: an ordered list


def lines_of(text: str | Iterable[str]) -> list[str]:
    """Text (or several texts) as single lines: split on every line break, NUL replaced."""
    chunks = [text] if isinstance(text, str) else list(text)
    out: list[str] = []
    for chunk in chunks:
        out.extend((chunk.replace("\x00", "\ufffd")).splitlines() or [""])
    return out


def fence_for(lines: Iterable[str]) -> str:
    """The backtick fence for ``lines``: at least three, and longer than any backtick run in them."""
    longest = max((len(m.group(0)) for line in lines for m in _BACKTICKS.finditer(line)), default=0)
    return "`" * max(3, longest + 1)


def fence(text: str | Iterable[str], info: str = "text") -> str:
    """``text`` as a fenced code block (no trailing newline after the closing fence)."""
    body = lines_of(text)
    marker = fence_for(body)
    info = info.replace("`", "").strip()
    return "\n".join([f"{marker}{info}", *body, marker])


def code(value: object) -> str:
    """``value`` as an inline code span that no backtick inside it can end."""
    text = " ".join(lines_of(str(value))).strip() or " "
    runs = {len(m.group(0)) for m in _BACKTICKS.finditer(text)}
    n = 1
    while n in runs:
        n += 1
    ticks = "`" * n
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def inline(value: object) -> str:
    """``value`` as plain inline text: one line, Markdown punctuation escaped."""
    text = " ".join(part.strip() for part in lines_of(str(value)) if part.strip())
    text = _INLINE_SPECIAL.sub(r"\\\1", text)
    # What would start a block if the text begins a line: a list item, a setext underline.
    if text[:1] in ("-", "+", "="):
        return "\\" + text
    return _LIST_START.sub(r"\1\\\2", text)
