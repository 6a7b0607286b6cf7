"""Azure Resource Manager for the fleet: GPU quota (show, plan, request), AKS node pools, the NVIDIA driver extension.

Credentials, subscription and the Resource Manager endpoint come from azure-cli-core's profile (:mod:`.session`):
whatever ``az login`` (a user, a service principal, a managed identity) left in ``AZURE_CONFIG_DIR`` and the CLI's
active cloud, so sovereign clouds and a registered test cloud work the same way. Requests go through one azure-core
pipeline (:mod:`.client`): bearer tokens over HTTPS only, ARM throttling and transient errors retried, long-running
operations polled to a terminal state, every other error raised with ARM's ``code`` and ``message``. Request bodies
are built as data in the shape of the REST specs (Microsoft.Quota 2023-02-01, Microsoft.Compute 2024-11-01,
Microsoft.ContainerService 2024-09-01).

Modules: :mod:`.quota` (usages, plans, requests), :mod:`.aks` (node pools), :mod:`.extension` (``NvidiaGpuDriverLinux``
remove / re-add, used by ``invoke driver-restore --method azure-extension``), :mod:`.checks` (the findings),
:mod:`.report` (table, JSON, Prometheus textfile). azure-cli-core is imported only where a live call needs it.
"""
