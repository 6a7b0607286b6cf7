"""``aoai:`` in ``invoke.yaml``: the thresholds of ``invoke aoai.diagnose`` and the defaults of the templates."""

from __future__ import annotations

from dataclasses import dataclass, field

from remediation.core.errors import UsageError

__all__ = ["AoaiSettings"]


@dataclass(frozen=True)
class AoaiSettings:
    """``aoai:``; every value is also a flag of the task that uses it."""

    retry_after_cap_s: float = 60.0  # a Retry-After above this means "use another deployment", not "sleep"
    tpm_limit: int = 0  # the deployment's tokens-per-minute quota, for peak-vs-limit (0: not known)
    warn_share_pct: float = 5.0  # share of 429 answers that is worth a finding
    storm_share_pct: float = 30.0  # share of 429 answers that is a storm (critical)
    slightly_over_s: float = 1.0  # Retry-After up to this: slightly over the limit
    far_over_s: float = 30.0  # Retry-After from this: far over the limit
    sustained_pct: float = 80.0  # load at or above this share of TPM ...
    sustained_minutes: int = 15  # ... for this many minutes in a row: evaluate PTU
    alert_pct: float = 80.0  # the TPM alert fires at this share of the quota
    alert_window_minutes: int = 5  # the alerts' evaluation window (and frequency: 1 minute)
    alert_429_count: int = 10  # 429s in the window that fire the 429 alert
    alert_severity: int = 2  # Azure Monitor severity 0 (critical) .. 4 (verbose)
    api_version: str = "2024-10-21"
    # deployment name -> RPM per 1,000 TPM, over the model's ratio (remediation.aoai.limits): e.g. {my-o3: 1}
    rpm_per_1000_tpm: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, ratio in self.rpm_per_1000_tpm.items():
            if not (isinstance(ratio, (int, float)) and 0 < ratio < float("inf")):
                raise UsageError(f"setting aoai.rpm_per_1000_tpm.{name}: {ratio} must be a positive number")
