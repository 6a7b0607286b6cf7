"""Requests per minute per model: how many RPM Azure OpenAI gives a Standard deployment for each 1,000 TPM.

Azure allocates quota in units of capacity, each with an amount of TPM and of RPM, and the ratio varies by model
(source below). A deployment's RPM is its TPM times the model's ratio; the client's admission queue keeps under it.
A model the table does not name gets :data:`DEFAULT_RPM_PER_1000_TPM` (6, "older chat models"): no figure is
invented for it. Override the ratio per deployment (``Deployment(rpm_per_1000_tpm=...)``, or
``aoai.rpm_per_1000_tpm: {<deployment>: <ratio>}`` in ``invoke.yaml``), or give the deployment's ``rpm`` outright
(the RPM shown on the deployment in the Foundry portal is the figure that counts).

Source: "Azure OpenAI in Azure AI Foundry Models quotas and limits",
https://learn.microsoft.com/en-us/azure/ai-foundry/openai/quotas-limits (ms.date 2025-07-11; read 2026-12-06 from
the page's source, MicrosoftDocs/azure-ai-docs articles/ai-foundry/openai/quotas-limits.md at commit
005fa2f16dd28f91c58f75f2a8023630f1fa4aca):

- the capacity-unit table under "o-series rate limits" ("The ratio of Requests Per Minute (RPM) to Tokens Per Minute
  (TPM) for quota can vary by model"): older chat models 6 RPM / 1,000 TPM; o1 and o1-preview 1 RPM / 6,000 TPM; o3
  and o4-mini 1 RPM / 1,000 TPM; o3-mini, o1-mini and o3-pro 1 RPM / 10,000 TPM;
- the per-model TPM/RPM quota tables on the same page, where a ratio holds on every row for the model (marked
  "tier tables" below): gpt-4.1, gpt-4.1-mini, gpt-4.1-nano (e.g. Default 1 M TPM / 1 K RPM), gpt-4.5 (150 K / 150),
  codex-mini (1 M / 1 K), model-router 2025-05-19 (1 M / 1 K): 1 RPM / 1,000 TPM; gpt-4o and gpt-4o-mini (450 K /
  2.7 K, 2 M / 12 K), gpt-4 turbo-2024-04-09 (450 K / 2.7 K): 6 RPM / 1,000 TPM; computer-use-preview (450 K / 4.5 K):
  10 RPM / 1,000 TPM.

Not in the table (default 6 applies, say so when it matters): gpt-5 and its variants, gpt-4o audio and realtime
models (the page gives absolute limits, not a ratio), gpt-oss, embeddings, image and audio models. The page's newer
revisions (2026) move the per-model figures into per-tier include files; check your deployment's RPM in the portal.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = [
    "DEFAULT_RPM_PER_1000_TPM",
    "RPM_PER_1000_TPM",
    "SOURCE",
    "rpm_for",
    "rpm_per_1000_tpm",
]

SOURCE = (
    "https://learn.microsoft.com/en-us/azure/ai-foundry/openai/quotas-limits "
    "(Azure OpenAI in Azure AI Foundry Models quotas and limits, ms.date 2025-07-11; read 2026-12-06)"
)

#: Azure's ratio for chat models the table does not name ("Older chat models: 1 unit = 6 RPM, 1,000 TPM").
DEFAULT_RPM_PER_1000_TPM = Fraction(6)

#: model name (as deployed, without its version date) -> RPM per 1,000 TPM.
RPM_PER_1000_TPM: dict[str, Fraction] = {
    # capacity-unit table ("o-series rate limits")
    "o1": Fraction(1, 6),
    "o1-preview": Fraction(1, 6),
    "o3": Fraction(1),
    "o4-mini": Fraction(1),
    "o3-mini": Fraction(1, 10),
    "o1-mini": Fraction(1, 10),
    "o3-pro": Fraction(1, 10),
    # tier tables
    "gpt-4.1": Fraction(1),
    "gpt-4.1-mini": Fraction(1),
    "gpt-4.1-nano": Fraction(1),
    "gpt-4.5": Fraction(1),
    "gpt-4.5-preview": Fraction(1),
    "codex-mini": Fraction(1),
    "model-router": Fraction(1),
    "computer-use-preview": Fraction(10),
    "gpt-4o": Fraction(6),
    "gpt-4o-mini": Fraction(6),
    "gpt-4": Fraction(6),
}

_VERSION = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})$")  # o3-mini-2025-01-31, gpt-4-0613


def rpm_per_1000_tpm(model: str) -> tuple[Fraction, bool]:
    """``(ratio, known)``: the model's RPM per 1,000 TPM, and whether the table names it (else the default 6)."""
    name = model.strip().lower()
    if name in RPM_PER_1000_TPM:
        return RPM_PER_1000_TPM[name], True
    bare = _VERSION.sub("", name)
    if bare in RPM_PER_1000_TPM:
        return RPM_PER_1000_TPM[bare], True
    return DEFAULT_RPM_PER_1000_TPM, False


def rpm_for(tpm: int, model: str = "", ratio: float | Fraction | None = None) -> int:
    """A deployment's requests per minute: ``tpm`` x the ratio (``ratio`` if given, else the model's), at least 1."""
    per_1000 = Fraction(ratio).limit_denominator(10**6) if ratio is not None else rpm_per_1000_tpm(model)[0]
    return max(1, math.floor(Fraction(tpm) * per_1000 / 1000))
