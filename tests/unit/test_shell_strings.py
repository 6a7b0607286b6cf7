"""Issue 20: host-reported values that reach a shell command on a host are refused unless they are plain names."""

from __future__ import annotations

import pytest

from remediation.kernelupdate.rules import available_query


@pytest.mark.parametrize(
    ("flavour", "branch"),
    [("generic", "535\n"), ("generic\n", "535"), ("generic", "535\nid"), ("azure;id", "535"), ("generic", "5 35")],
)
def test_available_query_refuses_what_is_not_a_flavour_or_branch(flavour: str, branch: str) -> None:
    with pytest.raises(ValueError):
        available_query(flavour, branch)


def test_available_query_for_plain_names() -> None:
    assert "linux-modules-nvidia-535-" in available_query("generic", "535")
    assert "'^linux-image-[0-9].*-azure$'" in available_query("azure", None)
