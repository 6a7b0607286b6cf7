"""A bounded burst of chat requests against the fake Azure OpenAI, for the demo, the tests and the benchmark.

:func:`workload` makes the requests (seeded: the same burst every run), :func:`run_burst` sends them from a fixed
number of threads through any callable (our client, or the OpenAI SDK alone) and keeps one :class:`Outcome` per
request; :class:`ResponseLog` is an httpx response hook that writes the JSON lines ``invoke aoai.diagnose`` reads
(status, headers, usage, deployment, time), with times on the service's (scaled) clock. Every loop here is bounded
by the number of requests; each request by its client's timeout.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["BurstResult", "Outcome", "ResponseLog", "run_burst", "workload"]

_WORDS = ("fleet", "gpu", "driver", "kernel", "quota", "token", "deployment", "region", "latency", "retry")


def workload(
    count: int, seed: int = 4, words: tuple[int, int] = (40, 320), max_tokens: tuple[int, int] = (100, 300)
) -> list[dict[str, Any]]:
    """``count`` chat request bodies of varied size (prompt words and ``max_tokens`` drawn from the ranges)."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not security
    bodies = []
    for i in range(count):
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(*words)))
        bodies.append(
            {
                "messages": [
                    {"role": "system", "content": "You triage GPU fleet incidents."},
                    {"role": "user", "content": f"request {i}: {text}"},
                ],
                "max_tokens": rng.randint(*max_tokens),
            }
        )
    return bodies


@dataclass(frozen=True)
class Outcome:
    ok: bool
    latency_s: float
    tokens: int  # total_tokens of the answer (0 when it failed)
    error: str | None  # the exception's class and first line


@dataclass(frozen=True)
class BurstResult:
    outcomes: tuple[Outcome, ...]
    seconds: float

    @property
    def succeeded(self) -> int:
        return sum(o.ok for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(not o.ok for o in self.outcomes)

    def lost(self, deadline_s: float) -> int:
        """Requests with no success and no error within ``deadline_s``."""
        return sum(o.latency_s > deadline_s for o in self.outcomes)

    def latency(self, pct: float) -> float:
        values = sorted(o.latency_s for o in self.outcomes)
        if not values:
            return 0.0
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[int(pct) - 1]

    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            if o.error:
                out[o.error.split(":")[0]] = out.get(o.error.split(":")[0], 0) + 1
        return out


def run_burst(send: Callable[[dict[str, Any]], int], bodies: Sequence[dict[str, Any]], threads: int) -> BurstResult:
    """Send every body with ``send`` (returns the answer's total tokens, raises on failure) from ``threads`` threads."""

    def one(body: dict[str, Any]) -> Outcome:
        start = time.monotonic()
        try:
            tokens = send(body)
        except Exception as exc:  # a failed request is an outcome, not a crash of the burst
            first = str(exc).splitlines()[0] if str(exc) else ""
            return Outcome(False, time.monotonic() - start, 0, f"{type(exc).__name__}: {first[:160]}")
        return Outcome(True, time.monotonic() - start, tokens, None)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="burst") as pool:
        outcomes = tuple(pool.map(one, bodies))
    return BurstResult(outcomes, time.monotonic() - start)


class ResponseLog:
    """An httpx response hook: one JSON line per answer (``event_hooks={"response": [log]}``).

    ``time_scale`` maps the real clock onto the service's: with a 3-second "minute" it is 20, so the log's minutes
    are the service's minutes and ``invoke aoai.diagnose`` compares them with the per-minute limit; the
    ``retry-after``/``retry-after-ms`` values are scaled the same way (the body's wording is kept as sent).
    """

    _KEEP = (
        "retry-after",
        "retry-after-ms",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "policy-id",
        "x-ms-region",
    )

    def __init__(self, path: Path, time_scale: float = 1.0, epoch: float | None = None) -> None:
        self.path = path
        self.time_scale = time_scale
        self.epoch = time.time() if epoch is None else epoch
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self.path.write_text("", encoding="utf-8")

    def _scaled(self, name: str, value: str) -> str:
        if name in ("retry-after", "retry-after-ms") and value.isdigit():
            return str(round(int(value) * self.time_scale))
        return value

    def __call__(self, response: httpx.Response) -> None:
        response.read()
        try:
            body = json.loads(response.content)
        except ValueError:
            body = {}
        parts = response.request.url.path.split("/")
        deployment = parts[parts.index("deployments") + 1] if "deployments" in parts else None
        entry = {
            "ts": self.epoch + (time.monotonic() - self._start) * self.time_scale,
            "status": response.status_code,
            "deployment": deployment,
            "headers": {k: self._scaled(k, response.headers[k]) for k in self._KEEP if k in response.headers},
            "usage": body.get("usage") if isinstance(body, dict) else None,
            "error": body.get("error") if isinstance(body, dict) and response.status_code >= 400 else None,
        }
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
