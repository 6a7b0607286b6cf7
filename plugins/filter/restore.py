# Apache-2.0 (see the project's pyproject.toml)
"""Filters of the nvidia_driver_restore role: the restore's rules, from the project's one implementation.

``gpufleet_restore_decision`` runs the same code as ``invoke driver-restore`` (``remediation.restore.rules``
over the probe's facts and the audit's checks), and ``gpufleet_restore_undo_steps`` the same undo bookkeeping
(``remediation.rollout.journal``). They run on the controller and import the project's Python package
(``gpu-fleet-remediation``) from the Python that runs Ansible: installed with pip next to ansible-core, in the
execution environment, or the checkout's own virtualenv.
"""

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


def gpufleet_restore_decision(doc, host, host_vars, prefer="rebuild", force=False, cordon_marker=None,
                              module_source="auto", own_run=None):
    checks = _library("remediation.core.checks")
    facts_from_dict = _library("remediation.core.facts").facts_from_dict
    decide = _library("remediation.restore.rules").decide

    # The marker of the remediate run this restore runs for is not a cordon against it (rollout.cordon's rule).
    cordon_marker = _library("remediation.rollout.cordon").foreign_marker(cordon_marker, own_run or None)
    facts = facts_from_dict(doc, host=host)
    expected = host_vars.get("nvidia_driver_expected_version") or None
    count = host_vars.get("gpu_expected_count")
    policy = checks.Policy(
        expected_driver_version=str(expected) if expected else None,
        host_gpu_count={host: int(count)} if count not in (None, "") else {},
    )
    findings = checks.run_checks(facts, policy)
    return decide(
        host, facts, findings, host_vars, prefer=prefer, force=bool(force), cordon_marker=cordon_marker,
        module_source=str(module_source or "auto"),
    ).to_dict()


def gpufleet_restore_method(host_vars, requested="auto"):
    return _library("remediation.restore.rules").resolve_method(requested, host_vars)


def gpufleet_restore_undo_steps(journal, installed, held, grub_lines, present_paths=()):
    undo_steps_from_dicts = _library("remediation.rollout.journal").undo_steps_from_dicts
    return undo_steps_from_dicts(journal, list(installed), list(held), dict(grub_lines), list(present_paths))


def gpufleet_signed_build(show_text, driver_upstream):
    """``apt-cache show`` of a signed module package -> the version built for ``driver_upstream`` ('' when none)."""
    rules = _library("remediation.kernelupdate.rules")
    for offers in rules.parse_available(show_text or "").values():
        build = rules.signed_build_for(offers, str(driver_upstream))
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
