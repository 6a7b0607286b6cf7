"""Text clean-up shared by the field-text parsers.

Field text arrives copied from terminals, syslog, GitHub issues and web pages. The same line can carry:
syslog escapes (``#012`` for an embedded newline), typographic apostrophes, diff/quote prefixes (``+> ``),
back-ticks or double quotes from inline code, table residue from a rendered page (trailing `` | |``) and
trailing spaces. :func:`split_lines` undoes all of that once, so each parser matches on clean lines.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Joined", "clean_line", "normalize", "split_lines", "strip_quote_prefix"]

_TYPOGRAPHIC = str.maketrans(
    {
        "\u2018": "'",  # left single quotation mark (seen in "couldn\u2018t")
        "\u2019": "'",  # right single quotation mark
        "\u201b": "'",
        "\u02bc": "'",  # modifier letter apostrophe
        "\u2032": "'",  # prime
        "\u00b4": "'",  # acute accent used as apostrophe
        "\u201c": '"',
        "\u201d": '"',
        "\u00a0": " ",  # no-break space
        "\u2009": " ",
        "\u202f": " ",
        "\t": " ",
    }
)

#: What table residue is made of: ``|`` and every character ``str.isspace`` (and so the regex ``\s``) counts. Written
#: out: scanning all of Unicode for them cost 0.16 s of every command's start (tests/unit/test_text_residue.py checks
#: the list against that scan).
_SPACES = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
_RESIDUE_CHARS = "|" + _SPACES
_QUOTE_PREFIX = re.compile(r"^\s*(?:[+\-]?>+ ?)+")
_DIFF_PLUS = re.compile(r"^[+\-](?=[\[<A-Za-z])")


def normalize(text: str) -> str:
    """Line endings, syslog escapes and typographic characters made plain."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("#012", "\n").replace("#011", " ")
    return text.translate(_TYPOGRAPHIC)


def clean_line(line: str) -> str:
    """One line without trailing spaces, table residue (`` | |``) or wrapping quotes/back-ticks."""
    line = line.rstrip()
    if line.endswith("|"):  # str.rstrip: linear, where the regex (?:\s*\|)+\s*$ was quadratic on a line of pipes
        line = line.rstrip(_RESIDUE_CHARS)
    stripped = line.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "`\"'":
        line = line.replace(stripped, stripped[1:-1], 1)
    elif stripped[:1] in ("`", '"'):
        line = line.replace(stripped[0], "", 1)
    elif stripped[-1:] in ("`", '"'):
        line = line[: line.rstrip().rfind(stripped[-1])]
    return line.rstrip()


def strip_quote_prefix(line: str) -> str:
    """A line without a diff/quote prefix such as ``+> ``, ``> `` or a leading diff ``+``."""
    line = _QUOTE_PREFIX.sub("", line, count=1)
    return _DIFF_PLUS.sub("", line, count=1)


def split_lines(text: str) -> list[str]:
    """Normalised, cleaned lines of ``text`` (empty lines kept, so indexes stay meaningful)."""
    return [clean_line(line) for line in normalize(text).split("\n")]


@dataclass(frozen=True)
class _Segment:
    start: int
    end: int
    line_index: int


class Joined:
    """Physical lines joined into one searchable string, with a map back to the lines.

    Wrapped messages (a kernel message continued on ``NVRM:`` lines, a terminal line wrapped by the poster)
    are matched on the joined text; :meth:`lines_for` gives back the original lines a match rests on.
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._segments: list[_Segment] = []
        self._ends: list[int] = []
        self._length = 0
        self._lines: dict[int, str] = {}

    def add(self, index: int, piece: str, original: str, *, separator: str = " ") -> None:
        """Append ``piece`` (from physical line ``index``, text ``original``) after ``separator``."""
        piece = " ".join(piece.split())
        if not piece:
            return
        if self._parts:
            self._parts.append(separator)
            self._length += len(separator)
        start = self._length
        self._parts.append(piece)
        self._length += len(piece)
        self._segments.append(_Segment(start, self._length, index))
        self._ends.append(self._length)
        self._lines[index] = original

    def break_message(self) -> None:
        """End the current message: nothing after this is joined to what came before."""
        if self._parts and self._parts[-1] != "\n":
            self._parts.append("\n")
            self._length += 1

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def lines_for(self, start: int, end: int) -> tuple[str, ...]:
        """The original lines whose pieces overlap ``[start, end)``, in order, each once."""
        seen: list[int] = []
        for seg in self._segments[bisect.bisect_right(self._ends, start) :]:
            if seg.start >= end:
                break
            if seg.line_index not in seen:
                seen.append(seg.line_index)
        return tuple(self._lines[i].strip() for i in seen)


def unique(items: Iterable[str]) -> tuple[str, ...]:
    """``items`` without repeats, first occurrence kept."""
    out: list[str] = []
    for item in items:
        if item not in out:
            out.append(item)
    return tuple(out)
