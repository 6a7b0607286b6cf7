"""Benchmark: a bounded launch burst against two Azure OpenAI deployments, our client vs openai-python's own retry.

    .venv/bin/python bench/aoai_burst.py [--requests 2000] [--threads 64] [--window 6] [--json FILE]

The local stand-in (lab/services/aoai.py, real HTTP on loopback) serves two deployments with known limits:
``eastus`` 80,000 TPM (480 RPM) and ``swedencentral`` 40,000 TPM (240 RPM), 120,000 TPM combined, enforced as Azure
does (prompt + max_tokens per rolling minute, RPM/6 per 10 s, 429 with Retry-After). Time is scaled: the service's
minute lasts ``--window`` seconds (6: ten times faster), its hints are in those seconds, and our client's windows,
cap and deadline are set on the same clock. The burst is ``--requests`` chat requests (seeded sizes: ~190 prompt
tokens, max_tokens 100-300, ~6.7 minutes of the combined quota) sent from ``--threads`` threads, in the same run:

1. **ours**: one ``openai.AzureOpenAI`` over :func:`remediation.aoai.http_client` with both deployments (weights 2:1);
2. **openai-python alone**: one ``openai.AzureOpenAI`` per deployment, requests split 2:1 to match the limits (the
   best static split), the SDK's built-in retry as shipped (``max_retries=2``, honours ``retry-after-ms`` up to 120 s);
3. the same with ``max_retries=10``;
4. scenario "86400": ``swedencentral``'s real quota is half what the clients were told (another application shares
   it) and its 429s say "retry after 86400 seconds", on a shorter burst, ours vs the SDK alone.

Reported per run: sustained goodput (the tokens the service admitted per minute over the whole minutes after the
first one, as a share of the combined limit: a fresh minute's quota is spent at once by any client, and the last
partial minute is the burst running out), 429 answers, p50/p99
latency, requests that succeeded, failed with a clear error, or were lost (no answer within the deadline of 10
service minutes). Targets (issue 12): goodput >= 90%, >= 80% fewer 429s than the SDK alone, zero lost.
Not a test: the figures go into the README.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
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
LIMITS = {"eastus": 80_000, "swedencentral": 40_000}
COMBINED = sum(LIMITS.values())
LAG_S = 0.25  # real seconds from send to the stand-in's admission on a loaded 2-core machine (not scaled)


def sdk(url: str, http: httpx.Client, deployment: str | None = None, max_retries: int = 2) -> Any:
    client: Any = http  # the SDK types http_client as httpx2.Client; it accepts httpx's
    return openai.AzureOpenAI(azure_endpoint=url, api_key="bench", api_version=V, azure_deployment=deployment,
                              http_client=client, max_retries=max_retries)


def send_with(pick: Callable[[int], Any]) -> Callable[[dict[str, Any]], int]:
    def send(body: dict[str, Any]) -> int:
        client = pick(int(body["messages"][1]["content"].split()[1].rstrip(":")))
        answer = client.chat.completions.create(model="gpt-4o", **body)
        return int(answer.usage.total_tokens) if answer.usage else 0

    return send


def ours(url: str, window: float, tpm: dict[str, int]) -> Any:
    config = ClientConfig(tpm_window_s=window, rpm_window_s=window / 6, retry_after_cap_s=window,
                          backoff_base_s=window / 60, backoff_max_s=window / 2, deadline_s=10 * window,
                          admission_lag_s=LAG_S)
    pool = [Deployment("eastus", url, tpm["eastus"], weight=2), Deployment("swedencentral", url, tpm["swedencentral"])]
    return sdk(url, http_client(pool, config, sink=lambda record: None))


def baseline(url: str, max_retries: int) -> Callable[[int], Any]:
    clients = {name: sdk(url, httpx.Client(timeout=600), name, max_retries) for name in LIMITS}
    return lambda i: clients["swedencentral" if i % 3 == 2 else "eastus"]


def measure(svc: FakeAzureOpenAI, result: BurstResult, window: float, deadline: float, combined: int
            ) -> dict[str, Any]:
    arrivals = list(svc.arrivals)
    admitted = [a for a in arrivals if a.admitted]
    start = min(a.at for a in arrivals)
    end = max(a.at for a in admitted)
    tokens = sum(a.charge for a in admitted)
    # sustained goodput: the whole minutes after the first (whose quota any client spends at once) up to the last
    # whole minute before the end; a rolling-minute limit L admits at most L in each of them
    whole = math.floor((end - start) / window)
    steady = sum(a.charge for a in admitted if start + window <= a.at < start + whole * window)
    return {
        "goodput_pct": round(100.0 * steady / ((whole - 1) * combined), 1) if whole >= 2 else None,
        "tokens_per_minute": round(tokens / max((end - start) / window, 1e-9)),
        "answers_429": sum(not a.admitted for a in arrivals),
        "answers": len(arrivals),
        "p50_s": round(result.latency(50), 2),
        "p99_s": round(result.latency(99), 2),
        "succeeded": result.succeeded,
        "failed": result.failed,
        "lost": result.lost(deadline),
        "errors": result.errors(),
        "seconds": round(result.seconds, 1),
    }


def run_one(name: str, svc: FakeAzureOpenAI, send: Callable[[dict[str, Any]], int], bodies: list[dict[str, Any]],
            threads: int, window: float, combined: int) -> dict[str, Any]:
    svc.reset()
    time.sleep(window)  # a quiet minute before each run: every client starts with the full quota
    svc.reset()
    figures = measure(svc, run_burst(send, bodies, threads), window, deadline=10 * window, combined=combined)
    figures["run"] = name
    print(json.dumps(figures), flush=True)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--window", type=float, default=6.0, help="seconds in the service's minute (60 = Azure)")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    window = args.window
    bodies = workload(args.requests, seed=2024)
    charge = sum(len(" ".join(m["content"] for m in b["messages"]).split()) + b["max_tokens"] for b in bodies)
    print(f"burst: {args.requests} requests, ~{charge:,} tokens charged (~{charge / sum(LIMITS.values()):.1f} minutes "
          f"of the combined {sum(LIMITS.values()):,} TPM); one minute = {window:g} s", flush=True)
    runs = []
    deployments = [FakeDeployment(name, tpm) for name, tpm in LIMITS.items()]
    with FakeAzureOpenAI(deployments, window_s=window, api_key="bench") as svc:
        client = ours(svc.url, window, LIMITS)
        runs.append(run_one("ours", svc, send_with(lambda i: client), bodies,
                            args.threads, window, COMBINED))
        runs.append(run_one("openai-python (max_retries=2)", svc, send_with(baseline(svc.url, 2)), bodies,
                            args.threads, window, COMBINED))
        runs.append(run_one("openai-python (max_retries=10)", svc, send_with(baseline(svc.url, 10)), bodies,
                            args.threads, window, COMBINED))
    shared = [FakeDeployment("eastus", LIMITS["eastus"]),
              FakeDeployment("swedencentral", LIMITS["swedencentral"] // 2, retry_after_override_s=86400)]
    short = bodies[: max(1, args.requests * 3 // 10)]
    with FakeAzureOpenAI(shared, window_s=window, api_key="bench") as svc:
        real = sum(d.tpm for d in shared)  # what the service really offers now
        told = ours(svc.url, window, LIMITS)  # configured with the quota it was told, not the one it gets
        runs.append(run_one("86400: ours", svc, send_with(lambda i: told), short,
                            args.threads, window, real))
        runs.append(run_one("86400: openai-python (max_retries=2)", svc, send_with(baseline(svc.url, 2)), short,
                            args.threads, window, real))
    print()
    print("| run | goodput | 429 answers | p50 | p99 | succeeded | failed | lost |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        goodput = "n/a (< 2 min)" if r["goodput_pct"] is None else f"{r['goodput_pct']}%"
        print(f"| {r['run']} | {goodput} | {r['answers_429']} of {r['answers']} | {r['p50_s']} s | "
              f"{r['p99_s']} s | {r['succeeded']} | {r['failed']} | {r['lost']} |")
    base = runs[1]["answers_429"]
    fewer = 100.0 * (1 - runs[0]["answers_429"] / base) if base else 0.0
    print(f"\n429s: ours {runs[0]['answers_429']} vs openai-python {base}: {fewer:.1f}% fewer")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
