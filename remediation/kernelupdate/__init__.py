"""``invoke kernel-update``: kernel upgrades on GPU hosts as planned maintenance (runbook S1's last prevention line).

:mod:`.rules` plans one host (pure: the target kernel of the booted flavour, the module source, what to install and
to hold); :mod:`.flow` runs the plan fleet-wide in batches with the restore's lock, leases, cordons, journal, undo and
incident report; ``roles/gpu_kernel_update`` (``playbooks/kernel_update.yml``) does the per-host work: install,
gate 1, the one-shot trial boot, gate 2, promote or fall back, re-hold. The task is ``commands/kernel.py``.
"""
