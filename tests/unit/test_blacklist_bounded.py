"""Package-Blacklist entries come from the host: an entry built to backtrack forever must not hang the audit."""

from __future__ import annotations

import time

import pytest

from remediation.core.checks.blacklist import blacklist_match, bounded, invalid_entries

NAME = "linux-image-6.5.0-45-generic"


@pytest.mark.parametrize(
    "entry",
    [
        "(a+)+$",  # the textbook catastrophic pattern
        "(l|li|lin)*x$",  # alternation under a repeat
        "(.*)*x$",
        "(?:[a-z-]+)*!",
        r"(l)\1*x",  # back-reference
        ".*.*.*.*.*.*x$",  # many unbounded repeats in a row
        "l" * 300,  # too long to bother
    ],
)
def test_an_entry_that_can_backtrack_without_bound_is_not_evaluated(entry: str) -> None:
    hostile_name = "a" * 40 + "!" if entry.startswith("(a") else "l" * 40 + "!"
    assert not bounded(entry)
    t0 = time.process_time()
    assert blacklist_match(hostile_name, [entry]) is None
    assert blacklist_match(NAME, [entry]) is None
    assert time.process_time() - t0 < 0.5


@pytest.mark.parametrize(
    "entry", ["linux-image", "linux-", "^linux-image", "linux-(image|headers|modules)", "linux-.*-generic$",
              "linux-image*", r"linux-image-\d+\.\d+", "linux-(?:image|headers)-[0-9.-]+generic$"]
)
def test_what_people_write_for_package_names_is_still_evaluated(entry: str) -> None:
    assert bounded(entry)
    assert blacklist_match(NAME, [entry]) == entry
    assert blacklist_match("nvidia-driver-535", ["nvidia-", entry]) == "nvidia-"


def test_invalid_entries_are_still_reported_as_such() -> None:
    assert invalid_entries(["*nvidia*", "linux-image"]) == ("*nvidia*",)
    assert not bounded("*nvidia*")
