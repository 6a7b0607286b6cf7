"""Undo bookkeeping: only what this run changed, only while it is still as the run left it."""

from __future__ import annotations

import pytest

from remediation.rollout.journal import JOURNAL_SCHEMA, journal_from_dict, undo_steps

AFTER = 'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux 6.5.0-44-generic"'


def _journal(**extra):  # type: ignore[no-untyped-def]
    return journal_from_dict({
        "schema": JOURNAL_SCHEMA, "run_id": "r1", "host": "gpu-2", "action": "rebuild", "started_at": "t",
        "changes": [
            {"kind": "packages_installed", "packages": ["linux-headers-6.5.0-45-generic"]},
            {"kind": "grub_default", "path": "/etc/default/grub", "before": "GRUB_DEFAULT=0", "after": AFTER},
            {"kind": "holds_added", "packages": ["linux-image-6.5.0-45-generic", "nvidia-driver-535"]},
        ],
        **extra,
    })


def test_undo_reverses_in_order_and_only_what_is_still_ours() -> None:
    steps = undo_steps(
        _journal(),
        installed=["linux-headers-6.5.0-45-generic", "nvidia-driver-535"],
        held=["nvidia-driver-535", "walinuxagent"],  # walinuxagent was held before: not in the journal
        grub_lines={"/etc/default/grub": AFTER},
    )
    assert [s.kind for s in steps] == ["unhold", "grub_restore", "remove_packages"]
    assert steps[0].packages == ("nvidia-driver-535",)  # the other hold is already gone
    assert steps[1].line == "GRUB_DEFAULT=0"
    assert steps[2].packages == ("linux-headers-6.5.0-45-generic",)


def test_nothing_to_undo_when_the_change_never_happened_or_was_changed_since() -> None:
    steps = undo_steps(_journal(), installed=[], held=[], grub_lines={"/etc/default/grub": "GRUB_DEFAULT=2"})
    assert steps == []


def test_grub_line_added_by_the_run_is_removed() -> None:
    j = journal_from_dict({"schema": JOURNAL_SCHEMA, "changes": [
        {"kind": "grub_default", "path": "/etc/default/grub", "before": None, "after": AFTER}]})
    (step,) = undo_steps(j, [], [], {"/etc/default/grub": AFTER})
    assert step.kind == "grub_remove"


def test_bad_journal_is_refused() -> None:
    with pytest.raises(ValueError, match="not a restore journal"):
        journal_from_dict({"schema": "x"})
    with pytest.raises(ValueError, match="no known kind"):
        journal_from_dict({"schema": JOURNAL_SCHEMA, "changes": [{"kind": "rm -rf"}]})


def test_module_built_by_the_run_is_removed_only_when_present() -> None:
    j = journal_from_dict({"schema": JOURNAL_SCHEMA, "changes": [
        {"kind": "module_built", "packages": ["6.5.0-45-generic"],
         "path": "/lib/modules/6.5.0-45-generic/updates/dkms/nvidia.ko", "after": "535.183.01"}]})
    assert undo_steps(j, [], [], {}) == []
    (step,) = undo_steps(j, [], [], {}, present_paths=["/lib/modules/6.5.0-45-generic/updates/dkms/nvidia.ko"])
    assert step.kind == "dkms_remove" and step.line == "535.183.01" and step.packages == ("6.5.0-45-generic",)
