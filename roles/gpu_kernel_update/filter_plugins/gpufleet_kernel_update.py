# Apache-2.0 (see the project's pyproject.toml)
"""Filters of the gpu_kernel_update role: the kernel update's plan and undo steps, from the project's one
implementation (``remediation.kernelupdate.rules``, ``remediation.restore.journal``). They run on the controller,
from this repository."""

from __future__ import annotations

import sys
from pathlib import Path

_PROJECT = Path(__file__).resolve().parents[3]
if str(_PROJECT) not in sys.path:
    sys.path.insert(0, str(_PROJECT))


def gpufleet_kernel_update_query(doc):
    """The shell command that asks apt what it offers for the host's flavour (run on the host)."""
    from remediation.facts import facts_from_dict
    from remediation.kernelupdate.rules import available_query

    facts = facts_from_dict(doc)
    return available_query(facts.system.kernel_flavour or "none", facts.packages.driver_branch)


def gpufleet_kernel_update_plan(doc, host, host_vars, available_text, kernel="", module_source="auto", force=False,
                                cordon_marker=None):
    from remediation.checks import Policy, run_checks
    from remediation.facts import facts_from_dict
    from remediation.kernelupdate.rules import parse_available, plan_host

    facts = facts_from_dict(doc, host=host)
    findings = run_checks(facts, Policy())
    return plan_host(
        host, facts, findings, host_vars, parse_available(available_text or ""), kernel=kernel or None,
        module_source=str(module_source or "auto"), force=bool(force), cordon_marker=cordon_marker,
    ).to_dict()


def gpufleet_kernel_update_undo_steps(journal, installed, held, grub_lines, present_paths=()):
    from remediation.restore.journal import undo_steps_from_dicts

    return undo_steps_from_dicts(journal, list(installed), list(held), dict(grub_lines), list(present_paths))


class FilterModule:
    def filters(self):
        return {
            "gpufleet_kernel_update_query": gpufleet_kernel_update_query,
            "gpufleet_kernel_update_plan": gpufleet_kernel_update_plan,
            "gpufleet_kernel_update_undo_steps": gpufleet_kernel_update_undo_steps,
        }
