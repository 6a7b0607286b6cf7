"""Retry hints of a 429: the precedence retry-after-ms > retry-after seconds > HTTP-date > body wording."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediation.aoai.hints import hint_from_body, hint_from_headers, retry_hint

NOW = 1_700_000_000.0
DATE_IN_30 = email.utils.formatdate(NOW + 30, usegmt=True)
BODY = "Requests to the ChatCompletions_Create Operation ... Please retry after 7 seconds."


@pytest.mark.parametrize(
    ("headers", "body", "seconds", "source"),
    [
        ({"retry-after-ms": "1500", "retry-after": "2"}, BODY, 1.5, "retry-after-ms"),
        ({"Retry-After-Ms": "250.5"}, None, 0.2505, "retry-after-ms"),
        ({"retry-after": "2"}, BODY, 2.0, "retry-after"),
        ({"retry-after": "0.5"}, None, 0.5, "retry-after"),  # non-standard fraction, as openai-python accepts
        ({"retry-after": DATE_IN_30}, BODY, 30.0, "http-date"),
        ({}, BODY, 7.0, "body"),
        ({"retry-after-ms": "soon", "retry-after": "oops"}, BODY, 7.0, "body"),  # unreadable headers: next source
        ({"retry-after-ms": "-5"}, None, None, None),
        ({"retry-after-ms": "nan", "retry-after": "inf"}, None, None, None),
        ({"x-ratelimit-reset-tokens": "55", "x-rate-limit-reset-tokens": "55"}, None, None, None),  # not a hint
    ],
)
def test_precedence(headers: dict[str, str], body: str | None, seconds: float | None, source: str | None) -> None:
    hint = retry_hint(headers, body, now=NOW)
    if seconds is None:
        assert hint is None
    else:
        assert hint is not None
        assert hint.source == source
        assert hint.seconds == pytest.approx(seconds)


def test_http_date_in_the_past_is_zero_and_without_now_uses_the_date_header() -> None:
    past = email.utils.formatdate(NOW - 100, usegmt=True)
    assert retry_hint({"retry-after": past}, now=NOW).seconds == 0.0  # type: ignore[union-attr]
    headers = {"retry-after": DATE_IN_30, "date": email.utils.formatdate(NOW, usegmt=True)}
    assert hint_from_headers(headers).seconds == pytest.approx(30.0)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "seconds"),
    [
        ("Please retry after 86400 seconds. Please go here", 86400.0),
        ("Rate limit is exceeded. Try again in 40 seconds.", 40.0),
        ("please RETRY AFTER 1 second.", 1.0),
        ("retry after 1500 milliseconds", 1.5),
        ("retry after 250ms", 0.25),
        ("try again in 2 minutes", 120.0),
        ("b'Please retry after 3 seconds'", 3.0),
    ],
)
def test_body_wordings(body: str, seconds: float) -> None:
    hint = hint_from_body(body)
    assert hint is not None and hint.seconds == pytest.approx(seconds)


def test_bytes_body() -> None:
    assert retry_hint({}, b'{"error": {"message": "Please retry after 4 seconds."}}').seconds == 4.0  # type: ignore[union-attr]


_header_values = st.one_of(st.text(max_size=40), st.floats(allow_nan=True).map(str), st.integers().map(str))


@given(
    headers=st.dictionaries(
        st.sampled_from(["retry-after", "retry-after-ms", "Retry-After", "date", "x-other"]), _header_values
    ),
    body=st.one_of(st.none(), st.text(max_size=200), st.binary(max_size=200)),
    now=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
)
def test_never_raises_and_never_negative(headers: dict[str, str], body: str | bytes | None, now: float | None) -> None:
    hint = retry_hint(headers, body, now=now)
    if hint is not None:
        assert hint.seconds >= 0
        assert hint.source in ("retry-after-ms", "retry-after", "http-date", "body")
