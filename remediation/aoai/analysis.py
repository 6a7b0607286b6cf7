"""``invoke aoai.diagnose``: 429 storms from request logs or an Azure Monitor metrics export → facts and findings.

Inputs (detected from the text):

- **the client's request records** (JSON lines with ``"kind": "aoai-request"``, :mod:`remediation.aoai.records`):
  each record counts its ``attempts`` as answers, ``throttled`` of them 429, its ``hints_s`` as Retry-After values,
  ``est_tokens`` as the tokens asked for and ``total_tokens`` as processed;
- **response logs**: JSON lines with a status (``status``/``status_code``/``statusCode``), optional ``headers``
  (``retry-after-ms``, ``retry-after``, ``policy-id``, ...), ``usage``, a ``body``/``error``, a time (``ts``/``time``/
  ``timestamp``: epoch seconds or milliseconds, or ISO 8601) and a ``deployment``. A 429 line without a token count
  (``est_tokens``/``request_tokens``) is counted at the median size of the successful requests;
- **an Azure Monitor metrics export** (``az monitor metrics list`` / the Metrics REST API JSON, PT1M grain):
  ``TokenTransaction`` (or ``ProcessedPromptTokens`` + ``GeneratedTokens``) as processed tokens, ``AzureOpenAIRequests``
  split by the ``StatusCode`` dimension as answers and 429s. Metrics carry no Retry-After and no demand beyond what
  was processed: a minute at the limit with 429s is the burst's evidence there.

Facts: the 429 share overall and per minute, the Retry-After distribution (slightly over / over / far over / above
the cap), the peak tokens per minute against the limit, the burst (first and last minute over the limit). Findings
come from :mod:`remediation.aoai.rules`.

A figure the input cannot give is ``null`` in the facts (the text says ``unknown`` or ``n/a``), never 0: answers and
429s of an export without ``AzureOpenAIRequests``, tokens of an export without token metrics or of logs without any
token count, the tokens asked for in any metrics export, the 429 share of a minute without answers.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from remediation.aoai import text as text_mod
from remediation.aoai.hints import retry_hint
from remediation.aoai.rules import MinuteLoad, Throttle, describe_hint, load_findings, throttle_findings
from remediation.aoai.settings import AoaiSettings
from remediation.core.errors import AoaiError
from remediation.core.findings import Finding

__all__ = ["Analysis", "analyse"]

_MAX_MINUTES = 7 * 24 * 60  # a week of minutes: beyond that the input is not one incident


@dataclass(frozen=True)
class Analysis:
    kind: str  # aoai-requests | aoai-metrics
    facts: dict[str, Any]
    findings: tuple[Finding, ...]

    def to_dict(self) -> dict[str, Any]:
        keys = ("id", "scenario", "severity", "summary", "evidence", "remedy")
        return {
            "kind": self.kind,
            "facts": self.facts,
            "findings": [{k: f.to_dict()[k] for k in keys} for f in self.findings],
        }


@dataclass
class _Minute:
    requests: int = 0
    throttled: int = 0
    processed: int = 0
    offered: int = 0


def _timestamp(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value) / 1000.0 if value > 1e12 else float(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    return None


def _label(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, tz=UTC).strftime("%Y-%m-%dT%H:%MZ")


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


def _first(data: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in data and data[key] is not None:
            return data[key]
    return None


def analyse(
    text: str,
    settings: AoaiSettings,
    tpm_limit: int | None = None,
    deployment: str | None = None,
    source: str = "<input>",
) -> Analysis:
    """Read ``text`` (request records, response logs or a metrics export) and diagnose it.

    Raises :class:`~remediation.core.errors.AoaiError` naming ``source`` when nothing in it is a request or a metric, or
    when it is over the input cap (:func:`remediation.core.parsers.check_size`).
    """
    from remediation.core.parsers import check_size

    check_size(text, source, AoaiError)
    limit = settings.tpm_limit if tpm_limit is None else tpm_limit
    stripped = text.strip()
    if not stripped:
        raise AoaiError(f"nothing to diagnose: {source} is empty")
    document: Any = None
    if stripped.startswith("{") and "\n{" not in stripped:
        try:
            document = json.loads(stripped)
        except (ValueError, RecursionError):  # RecursionError: nested too deep ("[[[[..."), no document either
            document = None
    if isinstance(document, Mapping) and isinstance(document.get("value"), list):
        return _metrics(document, settings, limit, deployment, source)
    return _requests(stripped.splitlines(), settings, limit, deployment, source)


# --- request logs -------------------------------------------------------------------------------------------


def _requests(
    lines: Iterable[str], settings: AoaiSettings, limit: int, deployment: str | None, source: str
) -> Analysis:
    entries: list[dict[str, Any]] = []
    skipped = 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            skipped += 1
            continue
        if not isinstance(entry, dict):
            skipped += 1
            continue
        status = _int(_first(entry, "status", "status_code", "statusCode"))
        when = _timestamp(_first(entry, "ts", "time", "timestamp", "TimeGenerated"))
        if status is None or when is None:
            skipped += 1
            continue
        name = _first(entry, "deployment", "model_deployment", "ModelDeploymentName")
        if deployment is not None and name is not None and str(name) != deployment:
            continue
        entry["_status"], entry["_ts"] = status, when
        entries.append(entry)
    if not entries:
        raise AoaiError(
            f"{source}: no request records (JSON lines with a status and a time) and no Azure Monitor metrics "
            "export found; pass the client's request log or `az monitor metrics list ... --output json`"
        )
    ok_sizes = [
        _int((e.get("usage") or {}).get("total_tokens")) or _int(e.get("total_tokens")) or 0
        for e in entries
        if e["_status"] < 400
    ]
    median_size = int(statistics.median([s for s in ok_sizes if s] or [0]))
    minutes: dict[int, _Minute] = defaultdict(_Minute)
    throttles: list[Throttle] = []
    answers = 0
    client_records = 0
    without_tokens = 0  # answers whose line gives no token count (their tokens are not in the sums)
    for entry in entries:
        bucket = minutes[int(entry["_ts"] // 60)]
        name = _first(entry, "deployment", "model_deployment", "ModelDeploymentName")
        if entry.get("kind") == "aoai-request":
            client_records += 1
            attempts = max(_int(entry.get("attempts")) or 0, 0)
            throttled = max(_int(entry.get("throttled")) or 0, 0)
            hints = [h for h in (entry.get("hints_s") or []) if isinstance(h, int | float)]
            bucket.requests += attempts
            bucket.throttled += throttled
            answers += attempts
            if entry.get("outcome") == "ok":
                bucket.processed += _int(entry.get("total_tokens")) or _int(entry.get("est_tokens")) or 0
            if _int(entry.get("est_tokens")) is None and _int(entry.get("total_tokens")) is None:
                without_tokens += attempts
            bucket.offered += _int(entry.get("est_tokens")) or 0
            for index in range(throttled):
                hint = float(hints[index]) if index < len(hints) else None
                throttles.append(
                    Throttle(
                        hint,
                        "unknown",
                        str(name) if name else None,
                        False,
                        f"request {entry.get('request_id', '?')}: 429 #{index + 1}"
                        + (f", Retry-After {hint:g} s" if hint is not None else ""),
                    )
                )
            continue
        status = entry["_status"]
        answers += 1
        bucket.requests += 1
        raw_usage = entry.get("usage")
        usage: Mapping[str, Any] = raw_usage if isinstance(raw_usage, Mapping) else {}
        tokens = _int(_first(usage, "total_tokens")) or _int(
            _first(entry, "est_tokens", "request_tokens", "total_tokens")
        )
        if tokens is None and (status != 429 or not median_size):
            without_tokens += 1
        if status == 429:
            bucket.throttled += 1
            bucket.offered += tokens or median_size
            raw_headers = entry.get("headers")
            header_map: Mapping[str, Any] = raw_headers if isinstance(raw_headers, Mapping) else {}
            headers = {str(k).lower(): str(v) for k, v in header_map.items()}
            body = _first(entry, "body", "error", "message")
            body_text = body if isinstance(body, str) else json.dumps(body) if body is not None else ""
            found = retry_hint(headers, body_text)
            parsed = text_mod.parse(body_text + "\n" + "\n".join(f"{k}: {v}" for k, v in headers.items()))
            evidence = parsed.message or "HTTP 429" + (f" (policy-id {parsed.policy_id})" if parsed.policy_id else "")
            throttles.append(
                Throttle(
                    found.seconds if found else None,
                    parsed.limit_kind,
                    str(name) if name else parsed.deployment,
                    parsed.capacity,
                    evidence,
                )
            )
        else:
            bucket.offered += tokens or 0
            if status < 400:
                bucket.processed += tokens or 0
    kind = "aoai-requests"
    known = {"answers", "hints"} | ({"processed", "offered"} if without_tokens < answers else set())
    return _conclude(
        kind,
        minutes,
        throttles,
        answers,
        settings,
        limit,
        deployment,
        {
            "records": len(entries),
            "client_records": client_records,
            "skipped_lines": skipped,
            "answers_without_tokens": without_tokens,
        },
        frozenset(known),
    )


# --- Azure Monitor ------------------------------------------------------------------------------------------


def _dimension(series: Mapping[str, Any], name: str) -> str | None:
    for item in series.get("metadatavalues") or []:
        if not isinstance(item, Mapping):
            continue
        dim = item.get("name")
        dim_name = dim.get("value") if isinstance(dim, Mapping) else dim
        if isinstance(dim_name, str) and dim_name.lower() == name.lower():
            value = item.get("value")
            return None if value is None else str(value)
    return None


def _metrics(
    document: Mapping[str, Any], settings: AoaiSettings, limit: int, deployment: str | None, source: str
) -> Analysis:
    minutes: dict[int, _Minute] = defaultdict(_Minute)
    seen: set[str] = set()
    token_metrics = {"tokentransaction"}
    split_tokens = {"processedprompttokens", "generatedtokens"}
    for metric in document.get("value") or []:
        if not isinstance(metric, Mapping):
            continue
        raw_name = metric.get("name")
        name = str(raw_name.get("value") if isinstance(raw_name, Mapping) else raw_name or "").lower()
        for series in metric.get("timeseries") or []:
            if not isinstance(series, Mapping):
                continue
            dep = _dimension(series, "ModelDeploymentName")
            if deployment is not None and dep is not None and dep != deployment:
                continue
            status = _dimension(series, "StatusCode")
            for point in series.get("data") or []:
                if not isinstance(point, Mapping):
                    continue
                when = _timestamp(point.get("timeStamp"))
                value = _first(point, "total", "count", "average")
                number = _int(value)
                if when is None or number is None:
                    continue
                bucket = minutes[int(when // 60)]
                if name in token_metrics or name in split_tokens:
                    seen.add(name)
                    bucket.processed += number
                elif name == "azureopenairequests":
                    seen.add(name)
                    bucket.requests += number
                    if status == "429":
                        bucket.throttled += number
    if "tokentransaction" in seen and seen & split_tokens:  # both given: TokenTransaction already has them
        raise AoaiError(f"{source}: the export has TokenTransaction and its parts; export one of them")
    if not seen:
        raise AoaiError(
            f"{source}: an Azure Monitor export without TokenTransaction or AzureOpenAIRequests; export "
            "`--metric TokenTransaction AzureOpenAIRequests --interval PT1M --aggregation Total`"
        )
    throttles = [
        Throttle(
            None,
            "unknown",
            deployment,
            False,
            f"{_label(minute)}: {bucket.throttled} of {bucket.requests} AzureOpenAIRequests with StatusCode 429",
            count=bucket.throttled,
        )
        for minute, bucket in sorted(minutes.items())
        if bucket.throttled
    ]
    answers = sum(b.requests for b in minutes.values())
    known = ({"answers"} if "azureopenairequests" in seen else set()) | (
        {"processed"} if seen & (token_metrics | split_tokens) else set()
    )  # never "offered" nor "hints": metrics hold what was processed, not what was asked for nor Retry-After
    return _conclude(
        "aoai-metrics",
        minutes,
        throttles,
        answers,
        settings,
        limit,
        deployment,
        {"metrics": sorted(seen), "interval": document.get("interval")},
        frozenset(known),
    )


# --- facts and findings -------------------------------------------------------------------------------------


def _histogram(hints: list[float], settings: AoaiSettings) -> dict[str, int]:
    out = {"slightly over the limit": 0, "over the limit": 0, "far over the limit": 0, "above the cap": 0}
    for hint in hints:
        label = describe_hint(hint, settings)
        out["above the cap" if label.startswith("above") else label] += 1
    return out


def _conclude(
    kind: str,
    minutes: dict[int, _Minute],
    throttles: list[Throttle],
    answers: int,
    settings: AoaiSettings,
    limit: int,
    deployment: str | None,
    extra: dict[str, Any],
    known: frozenset[str] = frozenset({"answers", "hints", "processed", "offered"}),
) -> Analysis:
    """Facts and findings; ``known`` names the figures the input gives (answers, hints, processed, offered): the
    others are ``None`` in the facts, never 0."""
    first, last = min(minutes), max(minutes)
    if last - first > _MAX_MINUTES:
        raise AoaiError(f"the input spans {(last - first) // 1440} days; diagnose one incident (a week at most)")
    loads = []
    for minute in range(first, last + 1):  # no gaps: a quiet minute is a minute
        bucket = minutes.get(minute, _Minute())
        loads.append(MinuteLoad(_label(minute), bucket.requests, bucket.throttled, bucket.processed, bucket.offered,
                                answers_known="answers" in known, processed_known="processed" in known,
                                offered_known="offered" in known))
    hints = [t.hint_s for t in throttles if t.hint_s is not None]
    total_429 = sum(m.throttled for m in loads)
    peak = max(loads, key=lambda m: max(m.offered_tokens, m.processed_tokens))
    stormy = [m for m in loads if m.requests and 100.0 * m.throttled / m.requests >= settings.warn_share_pct]
    period = f" from {stormy[0].label} to {stormy[-1].label}" if stormy else ""
    has_answers, has_processed, has_offered = ("answers" in known, "processed" in known, "offered" in known)

    def share(throttled: int, requests: int, digits: int) -> float | None:
        return round(100.0 * throttled / requests, digits) if has_answers and requests else None

    facts: dict[str, Any] = {
        "deployment": deployment,
        "answers": answers if has_answers else None,
        "throttled": total_429 if has_answers else None,
        "share_429_pct": share(total_429, answers, 2),
        "first_minute": loads[0].label,
        "last_minute": loads[-1].label,
        "retry_after": {
            "count": len(hints) if "hints" in known else None,
            "median_s": statistics.median(hints) if hints else None,
            "max_s": max(hints) if hints else None,
            "histogram": _histogram(hints, settings) if "hints" in known else None,
        },
        "tpm_limit": limit or None,
        "peak_minute": peak.label,
        "peak_offered_tokens": peak.offered_tokens if has_offered else None,
        "peak_processed_tokens": peak.processed_tokens if has_processed else None,
        "peak_vs_limit": (
            round(max(peak.offered_tokens, peak.processed_tokens) / limit, 2)
            if limit and (has_offered or has_processed)
            else None
        ),
        "minutes": [
            {
                "minute": m.label,
                "answers": m.requests if has_answers else None,
                "throttled": m.throttled if has_answers else None,
                "share_429_pct": share(m.throttled, m.requests, 1),
                "processed_tokens": m.processed_tokens if has_processed else None,
                "offered_tokens": m.offered_tokens if has_offered else None,
            }
            for m in loads
        ],
        **extra,
    }
    findings = throttle_findings(throttles, answers, settings, period) + load_findings(loads, limit, settings)
    return Analysis(kind, facts, tuple(findings))
