"""The simulated GPU fleet: Debian hosts in namespaces, a fake NVIDIA driver and NVML, faults."""
