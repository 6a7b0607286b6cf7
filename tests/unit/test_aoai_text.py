"""Pasted Azure OpenAI 429s: the §5 samples of the field-text corpus, the aoai-429 kind of `invoke diagnose`, and
the parser's properties (it never raises)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.aoai import text
from remediation.core.parsers import detect_kind
from remediation.host.diagnose import diagnose
from tests.corpus import blocks as _load

BLOCKS: dict[str, list[str]] = _load()

# what the corpus's "Facts:" lines state for each §5 sample (limit_kind in the words)
FACTS: dict[str, dict[str, object]] = {
    "5.2": {
        "retry_after_seconds": None,
        "limit_kind": "tokens",
        "deployment": None,
        "reset_tokens_seconds": 55.0,
        "region": "West US",
        "policy_id": "DeploymentRatelimit-Token",
    },
    "5.4": {
        "retry_after_seconds": 86400.0,
        "limit_kind": "requests",
        "deployment": None,
        "operation": "Embeddings_Create",
        "api_version": "2024-02-15-preview",
        "tier": "OpenAI S0",
    },
    "5.6": {
        "retry_after_seconds": 2.0,
        "limit_kind": "requests",
        "deployment": "text-embedding-3-small",
        "model": "text-embedding-3-small",
        "region": "East US 2",
        "operation": "Embeddings_Create",
        "api_version": "2024-12-01-preview",
        "error_code": "RateLimitReached",
    },
    "5.8": {
        "retry_after_seconds": 86400.0,
        "limit_kind": "tokens",
        "deployment": None,
        "operation": "ChatCompletions_Create",
        "api_version": "2023-05-15",
        "tier": "AIServices S0",
    },
    "5.10": {
        "retry_after_seconds": 86400.0,
        "limit_kind": "tokens",
        "deployment": None,
        "api_version": "2024-08-01-preview",
    },
    "5.12": {
        "retry_after_seconds": 54.0,
        "limit_kind": "requests",
        "deployment": None,
        "operation": "Embeddings_Create",
        "api_version": "2023-06-01-preview",
    },
    "5.14": {"retry_after_seconds": 40.0, "limit_kind": "unknown", "deployment": None},
    "5.16": {"retry_after_seconds": 20.0, "limit_kind": "unknown", "deployment": None, "capacity": True},
}
FINDINGS = {
    "5.2": {"AOAI-429-001"},
    "5.4": {"AOAI-429-001", "AOAI-429-002"},
    "5.6": {"AOAI-429-001"},
    "5.8": {"AOAI-429-001", "AOAI-429-002"},
    "5.10": {"AOAI-429-001", "AOAI-429-002"},
    "5.12": {"AOAI-429-001"},
    "5.14": {"AOAI-429-001"},
    "5.16": {"AOAI-429-003"},
}


def test_every_section_5_sample_is_covered() -> None:
    assert {s for s in BLOCKS if s.startswith("5.")} == set(FACTS) | {"5.18"}


@pytest.mark.parametrize("section", sorted(FACTS))
def test_corpus_facts(section: str) -> None:
    sample = BLOCKS[section][0]
    assert detect_kind(sample) == "aoai-429"
    result = diagnose(sample)
    facts = result.facts
    for key in ("retry_after_seconds", "limit_kind", "deployment"):
        assert key in facts
    for key, value in FACTS[section].items():
        assert facts[key] == value, (section, key)
    assert {f.id for f in result.findings} == FINDINGS[section]
    assert all(f.scenario.value == "S4" and f.evidence for f in result.findings)
    json.dumps(result.to_dict())


def test_resource_manager_throttle_is_not_azure_openai() -> None:
    # §5.18: same status and retry-after header, another service (ARM); not claimed by aoai-429
    assert text.score(BLOCKS["5.18"][0]) == 0
    assert detect_kind(BLOCKS["5.18"][0]) != "aoai-429"


@pytest.mark.parametrize("section", ["1.2", "2.4", "3.1", "4A.1", "4C.1"])
def test_other_kinds_text_is_not_taken(section: str) -> None:
    assert text.score(BLOCKS[section][0]) == 0


@pytest.mark.parametrize(
    ("sample", "seconds", "source", "kind", "deployment"),
    [
        # headers beat the body; retry-after-ms beats retry-after (a JS object dump of headers)
        (
            "status: 429,\n'retry-after-ms': '1500',\n'retry-after': '2',\nmessage: 'Please retry after 7 seconds.'"
            " Azure OpenAI",
            1.5,
            "retry-after-ms",
            "unknown",
            None,
        ),
        (
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 6\r\npolicy-id: DeploymentRatelimit-Call\r\n\r\n"
            '{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API '
            "version 2024-10-21 have exceeded call rate limit of your current OpenAI S0 pricing tier. "
            "Please retry after "
            '9 seconds."}}',
            6.0,
            "retry-after",
            "requests",
            None,
        ),
        (
            "POST https://x.openai.azure.com/openai/deployments/gpt-4o-prod/chat/completions"
            "?api-version=2024-10-21 429\n"
            "Retry-After: Wed, 21 Oct 2015 07:28:30 GMT\nDate: Wed, 21 Oct 2015 07:28:00 GMT\n"
            "exceeded token rate limit",
            30.0,
            "http-date",
            "tokens",
            "gpt-4o-prod",
        ),
        (
            "openai.RateLimitError: Error code: 429 - tokens per minute (TPM) exceeded for deployment_id=chat-eu; "
            "retry after 12 seconds",
            12.0,
            "body",
            "tokens",
            "chat-eu",
        ),
    ],
)
def test_variants(sample: str, seconds: float, source: str, kind: str, deployment: str | None) -> None:
    parsed = text.parse(sample)
    assert text.score(sample) > 0
    assert (parsed.retry_after_seconds, parsed.hint_source, parsed.limit_kind, parsed.deployment) == (
        pytest.approx(seconds),
        source,
        kind,
        deployment,
    )


def test_http_date_without_a_date_header_keeps_the_date_and_no_seconds() -> None:
    parsed = text.parse("429 Too Many Requests\nretry-after: Wed, 21 Oct 2015 07:28:30 GMT\nAzure OpenAI")
    assert parsed.retry_after_seconds is None
    assert parsed.retry_after_date == "Wed, 21 Oct 2015 07:28:30 GMT"


def test_newer_wording_with_escaped_json_inside_a_string() -> None:
    inner = json.dumps(
        {
            "error": {
                "code": "RateLimitReached",
                "message": (
                    "Your requests to gpt-4o for gpt4o-westeu in West Europe have exceeded the token rate limit "
                    "for your current AIServices S0 pricing tier. This request was for ChatCompletions_Create "
                    "under Azure OpenAI API version "
                    "2024-10-21. Please retry after 5 seconds."
                ),
            }
        }
    )
    outer = json.dumps({"error": {"message": f"HTTP 429: {inner}", "code": 429}})
    facts = diagnose(outer).facts
    assert (facts["retry_after_seconds"], facts["limit_kind"], facts["deployment"], facts["region"]) == (
        5.0,
        "tokens",
        "gpt4o-westeu",
        "West Europe",
    )


REAL = [
    "openai.RateLimitError: Error code: 429 - {'error': {'code': '429', 'message': 'Requests to the "
    "ChatCompletions_Create Operation under Azure OpenAI API version 2024-08-01-preview have exceeded token rate limit "
    "of your current OpenAI S0 pricing tier. Please retry after 86400 seconds.'}}",
    "Rate limit is exceeded. Try again in 40 seconds.",
    "(b'retry-after-ms', b'1200'), (b'x-ratelimit-remaining-tokens', b'0'), "
    "(b'policy-id', b'DeploymentRatelimit-Token')",
    "'retry-after': '5',",
    "Retry-After: Wed, 21 Oct 2015 07:28:00 GMT",
    "/openai/deployments/gpt-4o/chat/completions",
    '\\"message\\": \\"Your requests to a for b in c have exceeded the call rate limit\\"',
    "The system is currently experiencing high demand and cannot process your request.",
]
spliced = st.lists(st.one_of(st.sampled_from(REAL), st.text(max_size=120)), max_size=20).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(spliced)
def test_parser_and_scorer_never_raise(sample: str) -> None:
    parsed = text.parse(sample)
    assert parsed.limit_kind in text.LIMIT_KINDS
    assert parsed.retry_after_seconds is None or parsed.retry_after_seconds >= 0
    assert text.score(sample) >= 0
    if parsed.is_429 or text.score(sample):
        facts, findings = diagnose(sample, kind="aoai-429").facts, diagnose(sample, kind="aoai-429").findings
        assert {"retry_after_seconds", "limit_kind", "deployment"} <= set(facts)
        assert all(f.id.startswith("AOAI-") for f in findings)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000))
def test_arbitrary_text(sample: str) -> None:
    parsed = text.parse(sample)
    assert isinstance(parsed.evidence, tuple)
