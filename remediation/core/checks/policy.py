"""What the checks compare facts against: thresholds, expectations and package patterns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["Policy"]


@dataclass(frozen=True)
class Policy:
    """Fleet policy for the checks.

    ``expected_gpu_count`` applies to every host unless ``host_gpu_count`` (host name -> count, e.g. from the
    inventory's per-host ``gpu_count``/VM size) overrides it.  DCGM limits follow DCGM's health checks: a GPU
    fails at ``retired_pages_limit`` retired pages in total, beyond ``retired_dbe_limit`` double-bit retired
    pages, and (row remapping GPUs) at ``remapped_uncorrectable_limit`` rows remapped for uncorrectable
    errors, or with any pending remap or a remap failure.
    """

    expected_driver_version: str | None = None
    expected_gpu_count: int | None = None
    host_gpu_count: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    temp_alert_c: int = 78
    memory_full_pct: float = 95.0
    retired_pages_limit: int = 63
    retired_dbe_limit: int = 15
    remapped_uncorrectable_limit: int = 512
    power_cap_busy_util_pct: int = 50
    kernel_blacklist_patterns: tuple[str, ...] = ("linux-image", "linux-headers", "linux-modules")
    nvidia_package_patterns: tuple[str, ...] = ("nvidia-", "libnvidia-")

    def expected_gpus(self, host: str) -> int | None:
        """GPUs ``host`` should have: its override, else the fleet value, else None (not checked)."""
        return self.host_gpu_count.get(host, self.expected_gpu_count)
