"""Native pieces of the lab (fake libnvidia-ml, uname preload); see README.md."""
