"""The host area (S1 on a VM): the fleet audit, diagnose, harden and the host history, over the transport."""
