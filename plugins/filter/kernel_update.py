# Apache-2.0 (see the project's pyproject.toml)
"""Filters of the gpu_kernel_update role: the kernel update's apt query, plan and undo steps, from the project's one
implementation (``remediation.kernelupdate.rules``, ``remediation.rollout.journal``) in the installed Python package
gpu-fleet-remediation. They run on the controller."""

from __future__ import annotations

import importlib
from typing import Any

from ansible.errors import AnsibleFilterError


def _library(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise AnsibleFilterError(
            f"gpufleet.remediation needs the Python package gpu-fleet-remediation in the Python that runs Ansible "
            f"(cannot import {module}: {exc}); install it there with pip (the collection's requirements.txt), "
            "or use the gpufleet execution environment"
        ) from exc


def gpufleet_kernel_update_query(doc):
    """The shell command that asks apt what it offers for the host's flavour (run on the host)."""
    facts = _library("remediation.core.facts").facts_from_dict(doc)
    query = _library("remediation.kernelupdate.rules").available_query
    return query(facts.system.kernel_flavour or "none", facts.packages.driver_branch)


def gpufleet_kernel_update_plan(doc, host, host_vars, available_text, kernel="", module_source="auto", force=False,
                                cordon_marker=None):
    checks = _library("remediation.core.checks")
    rules = _library("remediation.kernelupdate.rules")
    facts = _library("remediation.core.facts").facts_from_dict(doc, host=host)
    findings = checks.run_checks(facts, checks.Policy())
    return rules.plan_host(
        host, facts, findings, host_vars, rules.parse_available(available_text or ""), kernel=kernel or None,
        module_source=str(module_source or "auto"), force=bool(force), cordon_marker=cordon_marker,
    ).to_dict()


def gpufleet_kernel_update_undo_steps(journal, installed, held, grub_lines, present_paths=()):
    undo = _library("remediation.rollout.journal").undo_steps_from_dicts
    return undo(journal, list(installed), list(held), dict(grub_lines), list(present_paths))


class FilterModule:
    def filters(self):
        return {
            "gpufleet_kernel_update_query": gpufleet_kernel_update_query,
            "gpufleet_kernel_update_plan": gpufleet_kernel_update_plan,
            "gpufleet_kernel_update_undo_steps": gpufleet_kernel_update_undo_steps,
        }
