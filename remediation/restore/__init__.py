"""Emergency NVIDIA driver restore (runbook S1): rules, methods, the rolling NVML-gated flow, lock and journal.

Public API: :func:`remediation.restore.flow.driver_restore` (the flow), :func:`remediation.restore.rules.decide`
(the per-host rules, also used by the role's filter), :class:`remediation.restore.methods.RestoreMethod`,
:func:`remediation.rollout.lock.fleet_lock` and :func:`remediation.rollout.journal.undo_steps`. The task itself is
``commands/driver.py``.
"""
