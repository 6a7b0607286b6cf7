"""What the client records: one structured record per request, and counters.

A :class:`RequestRecord` is written when a request ends (success, an HTTP error passed back, or the client giving
up): the deployment that answered, the estimated charge and the actual tokens from the response's ``usage``, the
time spent queued and in total, the attempts, the 429s and the retry hints seen. Records go to a *sink*: by default
the ``remediation.aoai.requests`` logger (one JSON object per log message), or :class:`JsonLinesSink` (a file that
``invoke aoai.diagnose`` reads back). API keys and message contents are never part of a record.

:class:`ClientStats` keeps the counters per deployment (sent, ok, 429s, cooldowns, tokens) for dashboards and tests.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ClientStats", "DeploymentCounters", "JsonLinesSink", "LogSink", "RequestRecord", "Sink"]

LOGGER = "remediation.aoai.requests"


@dataclass(frozen=True)
class RequestRecord:
    """One request through the client, as one JSON object."""

    ts: float  # epoch seconds when the request ended
    request_id: str
    operation: str  # the path after the deployment, e.g. chat/completions
    deployment: str | None  # the deployment that gave the final answer (None: never sent)
    region: str | None
    status: int  # final HTTP status seen by the caller (a give-up is 429)
    outcome: str  # ok | http_error | gave_up | too_large
    attempts: int  # HTTP requests sent
    throttled: int  # 429 answers among them
    hints_s: tuple[float, ...]  # the retry hints of those 429s, in seconds
    cooled: tuple[str, ...]  # deployments this request put into cooldown (a hint above the cap)
    est_prompt_tokens: int
    est_max_tokens: int
    est_tokens: int  # the admission charge: prompt + max_tokens
    prompt_tokens: int | None  # from usage
    completion_tokens: int | None
    total_tokens: int | None
    queued_s: float  # waiting for admission, all attempts
    latency_s: float  # from the call to the answer
    detail: str | None = None  # why the client gave up, or the error code

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hints_s"] = list(self.hints_s)
        data["cooled"] = list(self.cooled)
        data["kind"] = "aoai-request"
        return data


Sink = Callable[[RequestRecord], None]


class LogSink:
    """Records as JSON on the ``remediation.aoai.requests`` logger (INFO; WARNING when the client gave up)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(LOGGER)

    def __call__(self, record: RequestRecord) -> None:
        level = logging.WARNING if record.outcome in ("gave_up", "too_large") else logging.INFO
        if self.logger.isEnabledFor(level):
            self.logger.log(level, "%s", json.dumps(record.to_dict(), sort_keys=True))


class JsonLinesSink:
    """Records appended to a JSON-lines file (thread-safe); ``invoke aoai.diagnose FILE`` reads it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def __call__(self, record: RequestRecord) -> None:
        line = json.dumps(record.to_dict(), sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


@dataclass
class DeploymentCounters:
    sent: int = 0
    ok: int = 0
    throttled: int = 0  # 429 answers
    cooldowns: int = 0  # hints above the cap
    est_tokens: int = 0  # admission charges of the requests sent
    actual_tokens: int = 0  # usage.total_tokens of the answers
    synced_tokens: float = 0.0  # charges learned from the server's x-ratelimit-remaining-tokens


@dataclass
class ClientStats:
    """Counters since the client started. Read :meth:`snapshot` from any thread."""

    deployments: dict[str, DeploymentCounters] = field(default_factory=dict)
    requests: int = 0
    succeeded: int = 0
    gave_up: int = 0
    http_errors: int = 0
    queued_s: float = 0.0
    unmanaged: list[str] = field(default_factory=list)  # paths passed through unmanaged (v1, Responses), once each
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def for_deployment(self, name: str) -> DeploymentCounters:
        return self.deployments.setdefault(name, DeploymentCounters())

    @property
    def throttled(self) -> int:
        return sum(c.throttled for c in self.deployments.values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "succeeded": self.succeeded,
                "gave_up": self.gave_up,
                "http_errors": self.http_errors,
                "throttled": self.throttled,
                "queued_s": round(self.queued_s, 3),
                "unmanaged": list(self.unmanaged),
                "deployments": {name: asdict(c) for name, c in self.deployments.items()},
            }
