"""``dkms status`` rows keep their entry whatever follows the state: a note, a build warning glued to it, anything."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.core.parsers import detect_kind, dkms
from remediation.host.diagnose import diagnose

WARNING = "WARNING! Diff between built and installed module!"


@pytest.mark.parametrize(
    ("line", "state", "note"),
    [
        (f"nvidia, 470.82.00, 5.13.0-28-generic, x86_64: installed{WARNING}", "installed", WARNING),
        (f"nvidia, 470.82.00, 5.13.0-28-generic, x86_64: installed {WARNING}", "installed", WARNING),
        (f"nvidia/535.104.05, 6.2.0-33-generic, x86_64: installed ({WARNING})", "installed", WARNING),
        (
            f"nvidia/535.104.05, 6.2.0-33-generic, x86_64: installed (original_module exists) ({WARNING})",
            "installed",
            f"original_module exists; {WARNING}",
        ),
        ("nvidia/550.54.14, 6.5.0-21-generic, x86_64: installedWARNING! Missing some built modules!", "installed",
         "WARNING! Missing some built modules!"),
        ("nvidia/550.54.14, 6.5.0-21-generic, x86_64: built, but not installed", "built", "but not installed"),
        ("nvidia/550.54.14, 6.5.0-21-generic, x86_64: installed-weak", "installed-weak", None),
        ("nvidia/550.54.14: added", "added", None),
    ],
)
def test_entry_kept_whatever_follows_the_state(line: str, state: str, note: str | None) -> None:
    (entry,) = dkms.parse(f"$ dkms status\n{line}").entries
    assert entry.module == "nvidia" and entry.state == state and entry.note == note
    assert entry.text == line


def test_glued_warning_row_counts_as_installed_and_is_dkms_text() -> None:
    text = (
        f"nvidia, 470.82.00, 5.13.0-27-generic, x86_64: installed\n"
        f"nvidia, 470.82.00, 5.13.0-28-generic, x86_64: installed{WARNING}\n"
    )
    parsed = dkms.parse(text)
    assert parsed.installed_kernels() == ("5.13.0-27-generic", "5.13.0-28-generic")
    assert detect_kind(text) == "dkms"
    facts = diagnose(text).facts
    assert [(e["kernel"], e["state"], e["note"]) for e in facts["entries"]] == [
        ("5.13.0-27-generic", "installed", None),
        ("5.13.0-28-generic", "installed", WARNING),
    ]


def test_a_word_that_only_starts_like_a_state_is_not_one() -> None:
    assert dkms.parse("nvidia, 396.45, 4.17.14, x86_64: builtin").entries == ()


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["installed", "built", "added", "broken"]), st.text(max_size=60).filter(lambda s: "\n" not in s))
def test_anything_after_the_state_keeps_the_entry(state: str, tail: str) -> None:
    glued = tail[:1].isascii() and (tail[:1].islower() or tail[:1] == "-")
    (entry,) = dkms.parse(f"nvidia/550.54.14, 6.5.0-21-generic, x86_64: {state}{'' if glued else tail}").entries
    assert entry.state == state and entry.kernel == "6.5.0-21-generic"
