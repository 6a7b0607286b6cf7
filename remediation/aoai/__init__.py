"""Azure OpenAI under rate limits (runbook S4): a client that keeps throughput under the limits, a diagnoser for
429 storms, and the alert and APIM templates.

- :mod:`remediation.aoai.client`: :class:`Deployment`, :class:`ClientConfig`, :class:`AoaiTransport` (an httpx
  transport), :func:`http_client` (for ``openai.AzureOpenAI(http_client=...)``), :func:`azure_openai`;
- :mod:`remediation.aoai.hints`, :mod:`remediation.aoai.tokens`, :mod:`remediation.aoai.admission`: the pure parts
  (retry hints, token estimates, admission windows);
- :mod:`remediation.aoai.text`, :mod:`remediation.aoai.kind`: pasted 429 text, ``invoke diagnose`` kind ``aoai-429``;
- :mod:`remediation.aoai.analysis`, :mod:`remediation.aoai.rules`: ``invoke aoai.diagnose``;
- :mod:`remediation.aoai.templates`: Azure Monitor metric alerts and the APIM backend pool, as data.

The names below are imported on first use, so ``invoke diagnose`` does not load httpx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from remediation.aoai.client import AoaiTransport, ClientConfig, Deployment, azure_openai, http_client
    from remediation.aoai.records import ClientStats, JsonLinesSink, LogSink, RequestRecord
    from remediation.aoai.settings import AoaiSettings

__all__ = [
    "AoaiSettings",
    "AoaiTransport",
    "ClientConfig",
    "ClientStats",
    "Deployment",
    "JsonLinesSink",
    "LogSink",
    "RequestRecord",
    "azure_openai",
    "http_client",
]

_WHERE = {
    "AoaiTransport": "client",
    "ClientConfig": "client",
    "Deployment": "client",
    "azure_openai": "client",
    "http_client": "client",
    "ClientStats": "records",
    "JsonLinesSink": "records",
    "LogSink": "records",
    "RequestRecord": "records",
    "AoaiSettings": "settings",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"remediation.aoai.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'remediation.aoai' has no attribute {name!r}")
