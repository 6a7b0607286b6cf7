"""Pasted Azure OpenAI 429 text (SDK exception, JSON body, header dump, httpcore trace) → :class:`RateLimitText`.

Field text reaches us in many wrappings: a JSON body, a Python ``repr`` of it (single quotes), JSON escaped inside
a JSON string (``\\"``), a LiteLLM message with literal ``\\n``, a .NET exception, a JavaScript object dump of the
headers, an httpcore trace of ``(b'name', b'value')`` tuples. The parser undoes the escapes once, then reads:

- the **retry hint** by :mod:`remediation.aoai.hints`' precedence: ``retry-after-ms`` > ``retry-after`` seconds >
  ``retry-after`` HTTP-date (measured from the text's own ``Date`` header; without one the date is kept and the
  seconds are ``None``) > the body's "retry after N seconds" / "Try again in N seconds";
- the **limit kind**: ``tokens`` for a "token rate limit", tokens per minute or the ``DeploymentRatelimit-Token``
  policy; ``requests`` for a "call rate limit", requests per minute or ``DeploymentRatelimit-Call``; else
  ``unknown`` (a capacity / peak-load 429 is ``unknown``: it is not the caller's quota);
- the **deployment** when the text names it: the newer wording ("Your requests to MODEL for DEPLOYMENT in REGION"),
  a ``/openai/deployments/NAME/`` path, a ``deployment``/``ModelDeploymentName`` field. A proxy's model group is not
  a deployment;
- operation, API version, pricing tier, region, error code, the ``x-ratelimit-*`` headers.

:func:`score` says how much a text looks like an Azure OpenAI 429. An Azure Resource Manager throttle (the same 429
and ``retry-after``, but ``x-ms-ratelimit-remaining-subscription-*`` headers and no Azure OpenAI marker) scores 0:
it is another service. :func:`parse` never raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from remediation.aoai.hints import BODY_HINT, hint_from_body, http_date_seconds

__all__ = ["LIMIT_KINDS", "RateLimitText", "parse", "score"]

LIMIT_KINDS = ("tokens", "requests", "unknown")

_I = re.IGNORECASE
_HEADER_NAMES = (
    r"retry-after-ms|retry-after|x-rate-?limit-[a-z]+(?:-[a-z]+)*|policy-id|x-ms-region|apim-request-id|"
    r"x-request-id|date"
)
# name, then a separator, then the value: 'name': 'v' / "name": "v" / (b'name', b'v') / name: v / name=v
_HEADER = re.compile(
    r"(?<![\w-])b?['\"]?(" + _HEADER_NAMES + r")['\"]?\s*(?::|=|,)\s*b?(?:'([^'\n]*)'|\"([^\"\n]*)\"|"
    r"([A-Za-z]{3},\s*[0-9]{1,2}\s+[A-Za-z]{3}\s+[0-9]{4}\s+[0-9:]{8}(?:\s*(?:GMT|UTC|[+-][0-9]{4}))?|[^\s,;)}\]]+))",
    _I,
)
# a region's display name, unquoted: words of letters and digits on one line ("East US 2"), not the next header
_REGION_WORDS = re.compile(r"[A-Za-z0-9]+(?:[ \t]+[A-Za-z0-9]+)*(?![\w:=-])")
_STATUS_429 = re.compile(r"(?<![0-9.])429(?![0-9.])|Too Many Requests|RateLimit(?:Error|Reached|Exceeded)", _I)
_RATE_WORDS = re.compile(r"rate[ _-]?limit|throttl|too many requests|quota", _I)
_AOAI_MARKERS = re.compile(
    r"Azure\s*OpenAI|aka\.ms/oai|pricing tier|Operation under|openai\.|/openai/deployments/|DeploymentRatelimit|"
    r"x-ratelimit-remaining-(?:tokens|requests)|x-rate-limit-reset-tokens|retry-after-ms|RateLimitReached|"
    r"azure-openai|AzureException|Provisioned Throughput|ChatCompletions_Create|Embeddings_Create|"
    r"Rate limit is exceeded",
    _I,
)
_OTHER_SERVICE = re.compile(
    r"x-ms-ratelimit-remaining-(?:subscription|tenant|resource)|Microsoft-IIS|x-aspnet-version|"
    r"x-ms-routing-request-id|x-ms-correlation-request-id",
    _I,
)
_CLASSIC = re.compile(
    r"Requests to the\s+(?P<op>[A-Za-z_]+)\s+Operation under Azure OpenAI API"
    r"(?:\s+version\s+(?P<ver>[0-9A-Za-z._-]+))?\s+have exceeded\s+(?:the\s+)?"
    r"(?P<kind>token|call|request)s?\s+rate limit"
    r"(?:\s+(?:of|for)\s+your current\s+(?P<tier>[A-Za-z0-9 ]+?)\s+pricing tier)?",
    _I,
)
_NEWER = re.compile(
    r"Your requests to\s+(?P<model>[^\s'\"]+)\s+for\s+(?P<dep>[^\s'\"]+)\s+in\s+(?P<region>[A-Za-z0-9 ]+?)"
    r"\s+have exceeded"
    r"\s+(?:the\s+)?(?P<kind>token|call|request)s?\s+rate limit"
    r"(?:\s+(?:of|for)\s+your current\s+(?P<tier>[A-Za-z0-9 ]+?)\s+pricing tier)?",
    _I,
)
_OPERATION = re.compile(r"(?:This request was for|Requests to the)\s+(?P<op>[A-Za-z]+_[A-Za-z]+)", _I)
_API_VERSION = re.compile(
    r"API version\s+(?P<ver>[0-9]{4}-[0-9]{2}-[0-9]{2}(?:-preview)?)|api-version=([0-9A-Za-z.-]+)", _I
)
_KIND_TOKENS = re.compile(r"token rate limit|tokens per minute|\bTPM\b|DeploymentRatelimit-Token", _I)
_KIND_REQUESTS = re.compile(
    r"call rate limit|request rate limit|requests per minute|\bRPM\b|DeploymentRatelimit-Call", _I
)
_CAPACITY = re.compile(
    r"high demand|peak load|currently overloaded|NoCapacity|capacity (?:is )?(?:exceeded|unavailable)|"
    r"server is (?:busy|overloaded)",
    _I,
)
_DEPLOYMENT_PATH = re.compile(r"/openai/deployments/([A-Za-z0-9._-]{1,64})(?=[/?\s'\"]|$)")
_DEPLOYMENT_FIELD = re.compile(
    r"(?<![\w-])['\"]?(?:deployment(?:_id|_name|Name|Id)?|ModelDeploymentName|azure_deployment)['\"]?"
    r"\s*(?::|=|\beq\b)\s*['\"]?([A-Za-z0-9][A-Za-z0-9._-]{0,63})",
    _I,
)
_CODE = re.compile(r"['\"]code['\"]\s*:\s*['\"]?([A-Za-z0-9_]+)", _I)
_MAX_TEXT = 200_000


@dataclass(frozen=True)
class RateLimitText:
    """What a pasted Azure OpenAI 429 says."""

    is_429: bool
    retry_after_seconds: float | None  # the value the text states (header or body), in seconds
    hint_source: str | None  # retry-after-ms | retry-after | http-date | body
    retry_after_date: str | None  # an HTTP-date Retry-After, as written
    limit_kind: str  # tokens | requests | unknown
    deployment: str | None
    model: str | None
    operation: str | None  # e.g. ChatCompletions_Create, Embeddings_Create
    api_version: str | None
    tier: str | None  # e.g. "OpenAI S0", "AIServices S0"
    region: str | None
    error_code: str | None  # "429", "RateLimitReached", ...
    policy_id: str | None  # e.g. DeploymentRatelimit-Token
    capacity: bool  # peak load / high demand: the service's capacity, not the caller's quota
    reset_tokens_seconds: float | None  # x-ratelimit-reset-tokens (also the hyphenated x-rate-limit-...)
    remaining_tokens: int | None
    remaining_requests: int | None
    message: str | None  # the rate-limit sentence, for evidence
    evidence: tuple[str, ...]


_EMPTY = RateLimitText(
    False,
    None,
    None,
    None,
    "unknown",
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    False,
    None,
    None,
    None,
    None,
    (),
)


def _unescape(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\\r\\n", "\n")
    for _ in range(3):  # JSON inside JSON inside a repr: undo a few levels
        before = text
        text = text.replace('\\\\"', '"').replace('\\"', '"').replace("\\'", "'").replace("\\n", "\n")
        if text == before:
            break
    return text


def _headers(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in _HEADER.finditer(text):
        name = match.group(1).lower()
        value = next((g for g in match.group(2, 3, 4) if g is not None), "").strip()
        if name == "x-ms-region" and match.group(4) is not None:
            # an unquoted display name has spaces ("x-ms-region: East US"): its words, up to the next header
            words = _REGION_WORDS.match(text, match.start(4))
            value = words.group(0) if words else value
        if name == "date" and not re.match(r"[A-Za-z]{3},", value):
            continue  # "date": only an HTTP-date, not a JSON field or a word
        found.setdefault(name, value)
    return found


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m)?\b", value)
    if not match:
        return None
    number = float(match.group(1))
    unit = match.group(2) or "s"
    return number / 1000.0 if unit == "ms" else number * 60.0 if unit == "m" else number


def _evidence(text: str, spans: list[tuple[int, int]]) -> tuple[str, ...]:
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 150:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    lines: list[str] = []
    for start, end in merged:
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        line = text[line_start : line_end if line_end >= 0 else len(text)].strip()
        if len(line) > 600:  # one long log line: keep the part around the match
            line = text[max(line_start, start - 100) : min(end + 100, len(text))].strip()
        if line and line not in lines:
            lines.append(line)
    return tuple(lines[:8])


def score(text: str) -> int:
    """How much ``text`` looks like an Azure OpenAI 429 (0: not at all)."""
    try:
        text = _unescape(text[:_MAX_TEXT])
        status = len(_STATUS_429.findall(text)[:3])
        words = 1 if _RATE_WORDS.search(text) else 0
        if status == 0 and not words:
            return 0
        aoai = len(_AOAI_MARKERS.findall(text)[:3])
        if aoai == 0 and _OTHER_SERVICE.search(text):
            return 0  # another Azure service's throttle (Resource Manager): not ours
        hint = 1 if BODY_HINT.search(text) else 0
        headers = _headers(text)
        header_hits = sum(1 for n in headers if n.startswith(("retry-after", "x-ratelimit", "x-rate-limit")))
        total = 3 * status + 2 * words + 8 * aoai + 5 * hint + 3 * min(header_hits, 3)
        if aoai == 0 and not (status and (hint or header_hits)):
            return 0  # "rate limit" alone, without a 429 and a hint, is not enough to claim the text
        return total
    except Exception:  # a scorer never raises
        return 0


def parse(text: str) -> RateLimitText:
    """Read a pasted 429; never raises (text that says nothing gives a result with ``None`` fields)."""
    try:
        return _parse(text)
    except Exception:  # a parser never raises: text it cannot read says nothing
        return _EMPTY


# ---------------------------------------------------------------------------------------------------------------
# Rules. Each table is walked in order and the first rule that applies decides, as the old if-chains did.


@dataclass(frozen=True)
class _Seen:
    """What the rules read: the unescaped text, its headers and the rate-limit sentence (either wording)."""

    text: str
    headers: dict[str, str]
    newer: re.Match[str] | None  # "Your requests to MODEL for DEPLOYMENT in REGION have exceeded ..."
    wording: re.Match[str] | None  # the newer wording, else the classic "Requests to the OP Operation under ..."
    kind_word: str  # "token", "call", "request" from the wording, else ""
    policy: str | None  # the policy-id header
    capacity: bool  # peak load / high demand


@dataclass(frozen=True)
class _Hint:
    seconds: float | None
    source: str | None
    date: str | None  # an HTTP-date Retry-After, as written


@dataclass(frozen=True)
class _HintRule:
    """One source of the retry hint: ``read(seen)`` gives the hint it states, or None to ask the next source."""

    name: str
    read: Callable[[_Seen], _Hint | None]


def _hint_ms(seen: _Seen) -> _Hint | None:
    ms = _plain(seen.headers.get("retry-after-ms"))
    return _Hint(ms / 1000.0, "retry-after-ms", None) if ms is not None else None


def _hint_retry_after(seen: _Seen) -> _Hint | None:
    """Seconds, or an HTTP-date measured from the text's own Date header (kept, seconds None, without one)."""
    value = seen.headers.get("retry-after")
    if value is None:
        return None
    if _plain(value) is not None:
        return _Hint(_plain(value), "retry-after", None)
    if not re.match(r"\s*[A-Za-z]{3},", value):
        return None
    base = seen.headers.get("date")
    from email.utils import mktime_tz, parsedate_tz

    parsed_base = parsedate_tz(base) if base else None
    dated = http_date_seconds(value, float(mktime_tz(parsed_base)) if parsed_base else None)
    return _Hint(dated, "http-date", value) if dated is not None else _Hint(None, None, value)


def _hint_body(seen: _Seen) -> _Hint | None:
    body_hint = hint_from_body(seen.text)
    return _Hint(body_hint.seconds, "body", None) if body_hint is not None else None


_HINT_RULES: tuple[_HintRule, ...] = (
    _HintRule("retry-after-ms header (milliseconds)", _hint_ms),
    _HintRule("retry-after header: seconds or an HTTP-date", _hint_retry_after),
    _HintRule('the body: "retry after N seconds" / "Try again in N seconds"', _hint_body),
)


@dataclass(frozen=True)
class _KindRule:
    """``kind`` is the limit kind when ``applies(seen)``."""

    name: str
    applies: Callable[[_Seen], bool]
    kind: str  # tokens | requests | unknown


def _word_is(*words: str) -> Callable[[_Seen], bool]:
    return lambda seen: seen.kind_word in words


def _policy_says(*words: str) -> Callable[[_Seen], bool]:
    return lambda seen: bool(seen.policy) and any(w in (seen.policy or "").lower() for w in words)


def _text_says(pattern: re.Pattern[str]) -> Callable[[_Seen], bool]:
    return lambda seen: bool(pattern.search(seen.text))


_KIND_RULES: tuple[_KindRule, ...] = (
    _KindRule("the sentence says a token rate limit", _word_is("token"), "tokens"),
    _KindRule("the sentence says a call or request rate limit", _word_is("call", "request"), "requests"),
    _KindRule("the policy-id names tokens", _policy_says("token"), "tokens"),
    _KindRule("the policy-id names calls or requests", _policy_says("call", "request"), "requests"),
    _KindRule("a capacity 429 (peak load) is not the caller's quota", lambda seen: seen.capacity, "unknown"),
    _KindRule("tokens per minute, TPM, DeploymentRatelimit-Token", _text_says(_KIND_TOKENS), "tokens"),
    _KindRule("requests per minute, RPM, DeploymentRatelimit-Call", _text_says(_KIND_REQUESTS), "requests"),
)


@dataclass(frozen=True)
class _DeploymentRule:
    """Where the deployment is named: ``find(seen)`` gives the name and the span to cite (None: none to add)."""

    name: str
    find: Callable[[_Seen], tuple[str, tuple[int, int] | None] | None]


def _deployment_newer(seen: _Seen) -> tuple[str, tuple[int, int] | None] | None:
    return (seen.newer.group("dep"), None) if seen.newer else None


def _deployment_in(pattern: re.Pattern[str]) -> Callable[[_Seen], tuple[str, tuple[int, int] | None] | None]:
    def find(seen: _Seen) -> tuple[str, tuple[int, int] | None] | None:
        m = pattern.search(seen.text)
        return (m.group(1), m.span()) if m else None

    return find


_DEPLOYMENT_RULES: tuple[_DeploymentRule, ...] = (
    _DeploymentRule('the newer wording: "Your requests to MODEL for DEPLOYMENT in REGION"', _deployment_newer),
    _DeploymentRule("an /openai/deployments/NAME/ path", _deployment_in(_DEPLOYMENT_PATH)),
    _DeploymentRule("a deployment / ModelDeploymentName field", _deployment_in(_DEPLOYMENT_FIELD)),
)


def _parse(raw: str) -> RateLimitText:
    text = _unescape((raw or "")[:_MAX_TEXT])
    headers = _headers(text)
    classic = _CLASSIC.search(text)
    newer = _NEWER.search(text)
    wording = newer or classic
    kind_word = (wording.group("kind").lower() if wording else "") or ""
    capacity = bool(_CAPACITY.search(text))
    seen = _Seen(text, headers, newer, wording, kind_word, headers.get("policy-id"), capacity)
    spans: list[tuple[int, int]] = [wording.span()] if wording else []

    hint = next((h for rule in _HINT_RULES if (h := rule.read(seen)) is not None), _Hint(None, None, None))
    limit_kind = next((rule.kind for rule in _KIND_RULES if rule.applies(seen)), "unknown")
    named = next((d for rule in _DEPLOYMENT_RULES if (d := rule.find(seen)) is not None), None)
    deployment = named[0] if named else None
    if named and named[1] is not None:
        spans.append(named[1])
    model = newer.group("model") if newer else None
    region = (newer.group("region").strip() if newer else None) or headers.get("x-ms-region")

    operation = wording.group("op") if wording and wording.groupdict().get("op") else None
    if operation is None:
        op = _OPERATION.search(text)
        operation = op.group("op") if op else None
    version = wording.group("ver") if classic and wording is classic else None
    if version is None:
        ver = _API_VERSION.search(text)
        version = (ver.group("ver") or ver.group(2)) if ver else None
    tier = wording.group("tier").strip() if wording and wording.group("tier") else None
    code_match = _CODE.search(text)
    status_match = _STATUS_429.search(text)
    if status_match and not spans:
        spans.append(status_match.span())
    hint_match = BODY_HINT.search(text)
    if hint_match:
        spans.append(hint_match.span())
    for name in ("retry-after-ms", "retry-after", "policy-id"):
        for match in _HEADER.finditer(text):
            if match.group(1).lower() == name:
                spans.append(match.span())
                break
    cap_match = _CAPACITY.search(text)
    if cap_match:
        spans.append(cap_match.span())
    message = None
    if wording:
        end = text.find(".", wording.end())
        message = text[wording.start() : end + 1 if end >= 0 else wording.end()].strip()
    elif cap_match or hint_match:
        anchor = cap_match or hint_match
        assert anchor is not None
        start = max(text.rfind("\n", 0, anchor.start()) + 1, 0)
        message = text[start : anchor.end()].strip()[-300:]

    reset = headers.get("x-ratelimit-reset-tokens") or headers.get("x-rate-limit-reset-tokens")
    return RateLimitText(
        is_429=bool(status_match) or bool(wording),
        retry_after_seconds=hint.seconds,
        hint_source=hint.source,
        retry_after_date=hint.date,
        limit_kind=limit_kind,
        deployment=deployment,
        model=model,
        operation=operation,
        api_version=version,
        tier=tier,
        region=region,
        error_code=code_match.group(1) if code_match else None,
        policy_id=seen.policy,
        capacity=capacity,
        reset_tokens_seconds=_seconds(reset),
        remaining_tokens=_int(headers.get("x-ratelimit-remaining-tokens")),
        remaining_requests=_int(headers.get("x-ratelimit-remaining-requests")),
        message=message,
        evidence=_evidence(text, spans),
    )


def _plain(value: str | None) -> float | None:
    """A header value that is a plain non-negative number (``"5"``, ``"1500.5"``), else ``None``."""
    if value is None or not re.fullmatch(r"\s*[0-9]{1,15}(?:\.[0-9]{1,9})?\s*", value):
        return None
    return float(value)
