"""The project's task namespace: one collection per area from :mod:`commands`, with the typed config defaults.

``tasks.py`` in the checkout exposes it to ``invoke``; :mod:`commands.cli` (the ``gpufleet`` console script) gives
it to :class:`invoke.Program` as its namespace, so an install (the wheel ships :mod:`commands`) runs the same tasks
from any directory. The defaults of every typed config section are registered here with ``ns.configure``, so
``invoke.yaml`` and ``INVOKE_*`` variables only override them. ``invoke --list`` / ``gpufleet --list`` show every task.
"""

from __future__ import annotations

from invoke import Collection

from commands import aks, aoai, audit, demo, driver, harden, k8s, kernel, lab, quota, remediate, train
from remediation.aoai.api import AoaiSettings
from remediation.azure.api import AzureSettings
from remediation.config import (
    AnsibleSettings,
    AuditSettings,
    KernelUpdateSettings,
    RemediateSettings,
    RestoreSettings,
    defaults,
)
from remediation.k8s.api import K8sSettings
from remediation.train.api import TrainSettings

__all__ = ["long_flags_only", "ns"]

def long_flags_only(collection: Collection) -> None:
    """Every task of ``collection`` (and its sub-collections) takes long flags only: Invoke's automatic short flag
    (each flag's first free letter) made ``-h`` mean ``--history``, ``--hosts`` or ``--host`` by task and ``-o``
    mean ``--format`` or ``--out``; without them ``-h`` is always the program's help."""
    for task in collection.tasks.values():
        task.auto_shortflags = False
    for sub in collection.collections.values():
        long_flags_only(sub)


ns = Collection(demo.demo, audit.diagnose)
ns.add_collection(audit.ns)
ns.add_collection(harden.ns)
ns.add_collection(driver.ns)
ns.add_collection(kernel.ns)
ns.add_collection(lab.ns)
ns.add_collection(k8s.ns)
ns.add_collection(aoai.ns)
ns.add_collection(quota.ns)
ns.add_collection(aks.ns)
ns.add_collection(train.ns)
ns.add_collection(remediate.ns)
long_flags_only(ns)
ns.configure(
    {
        "ansible": defaults(AnsibleSettings),
        "audit": defaults(AuditSettings),
        "driver_restore": defaults(RestoreSettings),
        "kernel_update": defaults(KernelUpdateSettings),
        "k8s": defaults(K8sSettings),
        "aoai": defaults(AoaiSettings),
        "azure": defaults(AzureSettings),
        "train": defaults(TrainSettings),
        "remediate": defaults(RemediateSettings),
    }
)
