"""The written-out whitespace of the table-residue cleaner is exactly what ``str.isspace`` counts (issue 25: the
list used to be computed at import by scanning all of Unicode, 0.16 s of every command's start)."""

from __future__ import annotations

import sys

from remediation.core.parsers import _text


def test_the_written_out_spaces_are_every_character_isspace_counts() -> None:
    scanned = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
    assert scanned == _text._SPACES
    assert "|" + scanned == _text._RESIDUE_CHARS
