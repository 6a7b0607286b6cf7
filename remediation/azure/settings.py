"""``azure:`` in ``invoke.yaml``: the ARM client's limits and the quota threshold (every value overridable)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AzureSettings"]


@dataclass(frozen=True)
class AzureSettings:
    """Defaults for ``quota.*``, ``aks.*`` and the driver extension (``azure:`` section)."""

    threshold_pct: float = 80.0  # a quota family at or above this share of its limit is flagged
    retry_total: int = 5  # ARM throttling (429) and transient errors (408, 5xx, connection): retries per request
    retry_backoff_s: float = 1.0  # exponential backoff base when ARM sends no Retry-After
    retry_backoff_max_s: float = 60.0
    max_retry_after_s: float = 120.0  # a Retry-After longer than this is not waited for: the error is reported
    request_timeout_s: float = 60.0  # one HTTP request (connect + read)
    poll_interval_s: float = 5.0  # long-running operations, when ARM sends no Retry-After
    poll_timeout_s: float = 1800.0  # how long a long-running operation may take
    max_pages: int = 50  # nextLink pages followed per list
    extra_locations: tuple[str, ...] = ()  # regions newer than the built-in list (remediation/azure/regions.py)
