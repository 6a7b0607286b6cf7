# Apache-2.0 (see the project's pyproject.toml)
"""Filters of the nvidia_driver_restore role: the restore's rules, from the project's one implementation.

``gpufleet_restore_decision`` runs the same code as ``invoke driver-restore`` (``remediation.restore.rules``
over the probe's facts and the audit's checks), and ``gpufleet_restore_undo_steps`` the same undo bookkeeping
(``remediation.restore.journal``). They run on the controller, from this repository.
"""

from __future__ import annotations

import sys
from pathlib import Path

_PROJECT = Path(__file__).resolve().parents[3]
if str(_PROJECT) not in sys.path:
    sys.path.insert(0, str(_PROJECT))


def gpufleet_restore_decision(doc, host, host_vars, prefer="rebuild", force=False, cordon_marker=None,
                              module_source="auto"):
    from remediation.checks import Policy, run_checks
    from remediation.facts import facts_from_dict
    from remediation.restore.rules import decide

    facts = facts_from_dict(doc, host=host)
    expected = host_vars.get("nvidia_driver_expected_version") or None
    count = host_vars.get("gpu_expected_count")
    policy = Policy(
        expected_driver_version=str(expected) if expected else None,
        host_gpu_count={host: int(count)} if count not in (None, "") else {},
    )
    findings = run_checks(facts, policy)
    return decide(
        host, facts, findings, host_vars, prefer=prefer, force=bool(force), cordon_marker=cordon_marker,
        module_source=str(module_source or "auto"),
    ).to_dict()


def gpufleet_restore_method(host_vars, requested="auto"):
    from remediation.restore.rules import resolve_method

    return resolve_method(requested, host_vars)


def gpufleet_restore_undo_steps(journal, installed, held, grub_lines, present_paths=()):
    from remediation.restore.journal import undo_steps_from_dicts

    return undo_steps_from_dicts(journal, list(installed), list(held), dict(grub_lines), list(present_paths))


def gpufleet_signed_build(show_text, driver_upstream):
    """``apt-cache show`` of a signed module package -> the version built for ``driver_upstream`` ('' when none)."""
    from remediation.kernelupdate.rules import parse_available, signed_build_for

    for offers in parse_available(show_text or "").values():
        build = signed_build_for(offers, str(driver_upstream))
        if build is not None:
            return build.version
    return ""


class FilterModule:
    def filters(self):
        return {
            "gpufleet_signed_build": gpufleet_signed_build,
            "gpufleet_restore_decision": gpufleet_restore_decision,
            "gpufleet_restore_method": gpufleet_restore_method,
            "gpufleet_restore_undo_steps": gpufleet_restore_undo_steps,
        }
