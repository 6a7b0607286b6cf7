"""GPU fleet remediation: audit, harden and restore GPU hosts (Azure VMs, AKS node pools)."""

__version__ = "0.1.0"
