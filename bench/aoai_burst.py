"""Benchmark: a launch burst on two Azure OpenAI deployments: our client, openai-python as shipped, LiteLLM's Router.

    .venv/bin/python bench/aoai_burst.py [--rounds 3] [--part scaled|real|both] [--json FILE] [--smoke]
    .venv/bin/pip install -e '.[bench]'      # LiteLLM, for the real-time part (else that part says why it is skipped)

**The service** is the local stand-in (``lab/services/aoai.py``, real HTTP on loopback), and it does not take the
clients' view of tokens: its rate limiter charges what Azure's quota page says the service estimates at admission
(prompt text by its character count, ``max_tokens``, ``best_of``), here the characters of the messages as sent / 4,
while the clients count with tiktoken (ours) or not at all. No client is told the real limits: every limiter here is
configured **10 % off** the service's, the way a quota drifts from what a config file says (another application
shares the deployment, a portal change nobody copied):

- ``ours (+10 %)``: :func:`remediation.aoai.http_client` over both deployments, told 10 % *more* TPM (and RPM) than
  the service gives; ``ours (-10 %)``: told 10 % less.
- ``openai-python``: one ``openai.AzureOpenAI`` per deployment, requests split 2:1 to match the limits (the best
  static split a user could make), the SDK's retry as shipped (``max_retries=2``, honours ``retry-after-ms`` up to 120
  s): what most code does.
- ``LiteLLM Router (+10 %)``: a client-side limiter a user would pick: ``litellm.Router`` with both deployments, their
  ``tpm``/``rpm`` 10 % high, ``routing_strategy="usage-based-routing-v2"`` (routes by the tokens each deployment has
  used this minute and skips one at its limit), ``num_retries=3`` and ``retry_after=5`` (a retry waits at least 5 s;
  without it the three retries are spent within a second).

Two parts, each ``--rounds`` times (figures: the median of the rounds, and the range):

1. **scaled** (``--window 6``: the service's minute lasts 6 s, its hints are in those seconds, and our client's
   windows and deadline are set on the same clock): 2,000 requests (seeded sizes: ~190 prompt tokens, ``max_tokens``
   100-300) from 64 threads against 80,000 + 40,000 TPM: ours (+10 %), ours (-10 %), openai-python; then the
   "86400" case: ``swedencentral`` really gives half what the clients were told and its 429s say "retry after 86400
   seconds" (600 requests), ours vs openai-python.
2. **real** (a 60 s minute: LiteLLM counts per wall-clock minute, so it cannot be run on a scaled clock): 240 requests
   from 16 threads against 16,000 + 8,000 TPM (about four minutes of quota), ours (+10 %), openai-python and LiteLLM
   at the same time, each against its own instance of the stand-in (the load is light: a few requests a second).

Reported per run: **sustained goodput** (the tokens the service charged for the requests it admitted in the whole
minutes after the first, as a share of the combined limit: a fresh minute's quota is spent at once by any client, and
the last partial minute is the burst running out), **429 answers** the service sent, p50/p99 latency of the calls,
and the calls that succeeded, **failed** with an error, or were **lost** (no answer within 10 service minutes).
Not a test: the figures go into the README.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.services.aoai import FakeAzureOpenAI, FakeDeployment  # noqa: E402
from lab.services.aoai_burst import BurstResult, run_burst, workload  # noqa: E402
from remediation.aoai.client import ClientConfig, Deployment, http_client  # noqa: E402

V = "2024-10-21"
OFF = 1.10  # the configured limits are 10 % off the service's (+10 %; the -10 % run divides)
LAG_S = 0.25  # real seconds from send to the stand-in's admission on a loaded 2-core machine (not scaled)

Send = Callable[[dict[str, Any]], int]


def told(limits: dict[str, int], factor: float) -> dict[str, int]:
    return {name: round(tpm * factor) for name, tpm in limits.items()}


def sdk(url: str, http: httpx.Client, deployment: str | None = None, max_retries: int = 2) -> Any:
    client: Any = http  # the SDK types http_client as httpx2.Client; it accepts httpx's
    return openai.AzureOpenAI(azure_endpoint=url, api_key="bench", api_version=V, azure_deployment=deployment,
                              http_client=client, max_retries=max_retries)


def number(body: dict[str, Any]) -> int:
    return int(body["messages"][1]["content"].split()[1].rstrip(":"))


def send_with(pick: Callable[[int], Any]) -> Send:
    def send(body: dict[str, Any]) -> int:
        answer = pick(number(body)).chat.completions.create(model="gpt-4o", **body)
        return int(answer.usage.total_tokens) if answer.usage else 0

    return send


def ours(url: str, window: float, tpm: dict[str, int]) -> Send:
    config = ClientConfig(tpm_window_s=window, rpm_window_s=window / 6, retry_after_cap_s=window,
                          backoff_base_s=window / 60, backoff_max_s=window / 2, deadline_s=10 * window,
                          admission_lag_s=LAG_S)
    names = list(tpm)
    pool = [Deployment(name, url, tpm[name], weight=2 if i == 0 else 1) for i, name in enumerate(names)]
    client = sdk(url, http_client(pool, config, sink=lambda record: None))
    return send_with(lambda i: client)


def openai_python(url: str, names: list[str]) -> Send:
    clients = {name: sdk(url, httpx.Client(timeout=600), name) for name in names}
    return send_with(lambda i: clients[names[1] if i % 3 == 2 else names[0]])


def litellm_router(url: str, tpm: dict[str, int]) -> Send | str:
    """LiteLLM's Router over both deployments, or why it cannot run here."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the cost map at import
    try:
        import litellm
        from litellm import Router
    except ImportError as exc:
        return f"LiteLLM is not installed ({exc}); pip install -e '.[bench]'"
    litellm.suppress_debug_info = True
    model_list = [
        {
            "model_name": "gpt-4o",
            "litellm_params": {"model": f"azure/{name}", "api_base": url, "api_key": "bench", "api_version": V},
            "model_info": {"base_model": "azure/gpt-4o"},
            "tpm": limit,
            "rpm": limit * 6 // 1000,
        }
        for name, limit in tpm.items()
    ]
    # the documented setup for rate-limit-aware routing, with retries that wait (at least retry_after seconds)
    router = Router(model_list=model_list, routing_strategy="usage-based-routing-v2", num_retries=3, retry_after=5)

    def send(body: dict[str, Any]) -> int:
        answer: Any = router.completion(model="gpt-4o", **body)
        return int(answer.usage.total_tokens) if answer.usage else 0

    return send


def measure(svc: FakeAzureOpenAI, result: BurstResult, window: float, combined: int) -> dict[str, Any]:
    arrivals = list(svc.arrivals)
    admitted = [a for a in arrivals if a.admitted]
    start = min(a.at for a in arrivals)
    end = max(a.at for a in admitted)
    # sustained goodput: the whole minutes after the first (whose quota any client spends at once) up to the last
    # whole minute before the end; a rolling-minute limit L admits at most L in each of them
    whole = math.floor((end - start) / window)
    steady = sum(a.charge for a in admitted if start + window <= a.at < start + whole * window)
    return {
        "goodput_pct": round(100.0 * steady / ((whole - 1) * combined), 1) if whole >= 2 else None,
        "answers_429": sum(not a.admitted for a in arrivals),
        "answers": len(arrivals),
        "p50_s": round(result.latency(50), 2),
        "p99_s": round(result.latency(99), 2),
        "succeeded": result.succeeded,
        "failed": result.failed,
        "lost": result.lost(10 * window),
        "errors": result.errors(),
        "seconds": round(result.seconds, 1),
    }


def burst(name: str, svc: FakeAzureOpenAI, send: Send, bodies: list[dict[str, Any]], threads: int,
          window: float, combined: int) -> dict[str, Any]:
    svc.reset()
    time.sleep(window)  # a quiet minute before each run: every client starts with the full quota
    svc.reset()
    figures = measure(svc, run_burst(send, bodies, threads), window, combined)
    figures["run"] = name
    print(json.dumps(figures), flush=True)
    return figures


def scaled_round(window: float, requests: int = 2000, threads: int = 64) -> list[dict[str, Any]]:
    limits = {"eastus": 80_000, "swedencentral": 40_000}
    combined = sum(limits.values())
    bodies = workload(requests, seed=2024)
    runs = []
    with FakeAzureOpenAI([FakeDeployment(n, t) for n, t in limits.items()], window_s=window, api_key="bench") as svc:
        runs.append(burst("scaled: ours (+10 %)", svc, ours(svc.url, window, told(limits, OFF)), bodies, threads,
                          window, combined))
        runs.append(burst("scaled: ours (-10 %)", svc, ours(svc.url, window, told(limits, 1 / OFF)), bodies, threads,
                          window, combined))
        runs.append(burst("scaled: openai-python", svc, openai_python(svc.url, list(limits)), bodies, threads, window,
                          combined))
    shared = [FakeDeployment("eastus", limits["eastus"]),
              FakeDeployment("swedencentral", limits["swedencentral"] // 2, retry_after_override_s=86400)]
    short = bodies[:requests * 3 // 10]
    with FakeAzureOpenAI(shared, window_s=window, api_key="bench") as svc:
        real = sum(d.tpm for d in shared)  # what the service really offers now; the clients were told `limits`
        runs.append(burst("86400: ours (told 120,000)", svc, ours(svc.url, window, limits), short, threads, window,
                          real))
        runs.append(burst("86400: openai-python", svc, openai_python(svc.url, list(limits)), short, threads, window,
                          real))
    return runs


def real_round() -> list[dict[str, Any]]:
    window = 60.0
    limits = {"eastus": 16_000, "swedencentral": 8_000}
    combined = sum(limits.values())
    bodies = workload(240, seed=2025)
    contenders: dict[str, Callable[[str], Send | str]] = {
        "real: ours (+10 %)": lambda url: ours(url, window, told(limits, OFF)),
        "real: openai-python": lambda url: openai_python(url, list(limits)),
        "real: LiteLLM Router (+10 %)": lambda url: litellm_router(url, told(limits, OFF)),
    }
    results: dict[str, dict[str, Any]] = {}
    services = {name: FakeAzureOpenAI([FakeDeployment(n, t) for n, t in limits.items()], window_s=window,
                                      api_key="bench") for name in contenders}
    for svc in services.values():
        svc.__enter__()
    try:
        sends = {name: make(services[name].url) for name, make in contenders.items()}
        for name, why in [(n, s) for n, s in sends.items() if isinstance(s, str)]:
            print(f"{name}: skipped: {why}", flush=True)
        threads = [
            threading.Thread(
                target=lambda n=name, s=send: results.__setitem__(n, burst(n, services[n], s, bodies, 16, window,
                                                                           combined)))
            for name, send in sends.items() if not isinstance(send, str)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20 * window)
    finally:
        for svc in services.values():
            svc.__exit__(None, None, None)
    return [results[n] for n in contenders if n in results]


def medians(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per run name: each figure's median over the rounds, and its range."""
    out = []
    for name in dict.fromkeys(r["run"] for runs in rounds for r in runs):
        rows = [r for runs in rounds for r in runs if r["run"] == name]
        row: dict[str, Any] = {"run": name, "rounds": len(rows)}
        for key in ("goodput_pct", "answers_429", "answers", "p50_s", "p99_s", "succeeded", "failed", "lost"):
            values = [r[key] for r in rows if r[key] is not None]
            row[key] = statistics.median(values) if values else None
            row[f"{key}_range"] = (min(values), max(values)) if values else None
        row["errors"] = sorted({e for r in rows for e in r["errors"]})
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    def cell(row: dict[str, Any], key: str, unit: str = "") -> str:
        value, span = row[key], row[f"{key}_range"]
        if value is None:
            return "n/a (< 2 min)"
        low, high = span
        spread = "" if low == high else f" ({low:g}-{high:g})"
        return f"{value:g}{unit}{spread}"

    lines = ["| run | goodput | 429 answers | p50 | p99 | succeeded | failed | lost |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {cell(r, 'goodput_pct', ' %')} | {cell(r, 'answers_429')} of "
                     f"{r['answers']:g} | {cell(r, 'p50_s', ' s')} | {cell(r, 'p99_s', ' s')} | "
                     f"{cell(r, 'succeeded')} | {cell(r, 'failed')} | {cell(r, 'lost')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part", choices=("scaled", "real", "both"), default="both")
    ap.add_argument("--window", type=float, default=6.0, help="seconds in the scaled part's minute (60 = Azure)")
    ap.add_argument("--json", type=Path, help="write every run and the medians here too")
    ap.add_argument("--smoke", action="store_true",
                    help="a few seconds: one round of the scaled part, 120 requests from 8 threads, a 1 s minute "
                         "(that the bench still runs; its figures mean nothing)")
    args = ap.parse_args()
    requests, threads = 2000, 64
    if args.smoke:
        args.rounds, args.part, args.window, requests, threads = 1, "scaled", 1.0, 120, 8
    rounds: list[list[dict[str, Any]]] = []
    for i in range(args.rounds):
        print(f"--- round {i + 1} of {args.rounds}", flush=True)
        runs: list[dict[str, Any]] = []
        if args.part in ("scaled", "both"):
            runs += scaled_round(args.window, requests, threads)
        if args.part in ("real", "both"):
            runs += real_round()
        rounds.append(runs)
    rows = medians(rounds)
    print()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "medians": rows}, indent=2))


if __name__ == "__main__":
    main()
