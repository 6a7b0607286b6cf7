"""Invoke entry point: assembles one namespace per area from :mod:`commands`.

Each area's tasks are thin shells over the ``remediation`` library (and the ``lab``) in ``commands/<area>.py``;
the defaults of every typed config section are registered here with ``ns.configure``, so ``invoke.yaml`` and
``INVOKE_*`` variables only override them. ``invoke --list`` shows every task.
"""

from __future__ import annotations

from pathlib import Path

from invoke import Collection

from commands import aks, aoai, audit, demo, driver, harden, k8s, kernel, lab, preflight, quota, train
from remediation.aoai.settings import AoaiSettings
from remediation.azure.settings import AzureSettings
from remediation.config import AnsibleSettings, AuditSettings, KernelUpdateSettings, RestoreSettings, defaults
from remediation.k8s.settings import K8sSettings
from remediation.train.settings import TrainSettings

# Invoke loads the invoke.yaml beside this file right after importing it: a broken one is one line and exit 2 here,
# not Invoke's traceback later
preflight(Path(__file__).resolve().with_name("invoke.yaml"))

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
    }
)
