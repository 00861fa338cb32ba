"""The simulated replica's request bodies: parse and check a chat-completions or Responses body.

Pure (no HTTP): :func:`parse_chat_body` and :func:`parse_responses_body` turn a decoded JSON body
into the request the engine runs, or raise :class:`BadRequest` naming the field; the prompt's
token count is ``hedgerow_prompt_tokens`` or about one token per 4 characters
(:func:`estimate_prompt_tokens`). The rules are in :mod:`hedgerow.sim.replica`'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHARS_PER_TOKEN",
    "MAX_OUTPUT_TOKENS",
    "BadRequest",
    "ChatRequest",
    "ResponsesRequest",
    "estimate_prompt_tokens",
    "parse_chat_body",
    "parse_responses_body",
]

#: Largest output length a request may ask for.
MAX_OUTPUT_TOKENS = 1_000_000
#: Characters per token when the prompt length is estimated from text (OpenAI's rule of thumb).
CHARS_PER_TOKEN = 4


class BadRequest(Exception):
    """A request body's field is missing or wrong; ``param`` names it (the 422's ``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _message_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRequest(f"{where}.content[{j}]", "must be an object")
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
        return "".join(parts)
    raise BadRequest(f"{where}.content", "must be a string, a list of parts, or null")


def estimate_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """Estimate a prompt's token count from its messages: about one token per 4 characters.

    Args:
        messages: chat messages (``content`` a string, a list of ``{"type": "text", "text": ...}``
            parts, or null).

    Returns:
        ceil(characters / 4), at least 1.
    """
    chars = sum(len(_message_text(m.get("content"), f"messages[{i}]")) for i, m in enumerate(messages))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A checked chat-completions request: what the engine runs and how the answer is shaped."""

    model: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A checked Responses API request: what the engine runs and how the answer is shaped."""

    model: str
    prompt_tokens: int
    output_tokens: int
    incomplete: bool  # max_output_tokens binds: the response ends incomplete
    stream: bool
    instructions: str | None
    max_output_tokens: int | None


def _input_text(value: Any) -> str:
    """The text of a Responses ``input``: a string, or a list of items (messages with a string or
    parts ``content``, tool outputs with an ``output`` string)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise BadRequest("input", "must be a string or a non-empty list of input items")
    texts = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}]", "must be an object")
        if "content" in item:
            texts.append(_message_text(item["content"], f"input[{i}]"))
        output = item.get("output")
        if isinstance(output, str):
            texts.append(output)
    return "".join(texts)


def _model(body: Any) -> str:
    """The ``model`` of a request body (a JSON object); raises ``BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    model = body.get("model")
    if model is None:
        raise BadRequest("model", "is required")
    if not isinstance(model, str) or not model:
        raise BadRequest("model", "must be a non-empty string")
    return model


def _check_output_fields(body: dict[str, Any], fields: tuple[str, ...]) -> None:
    """Each of ``fields`` present in ``body`` is a token count in [1, MAX_OUTPUT_TOKENS]."""
    for field in fields:
        v = body.get(field)
        if v is not None and not (_is_int(v) and 1 <= v <= MAX_OUTPUT_TOKENS):
            raise BadRequest(field, f"must be an integer in [1, {MAX_OUTPUT_TOKENS}], got {v!r}")


def _stream_flag(body: dict[str, Any]) -> bool:
    """``stream`` of a body: a boolean, absent or null meaning false."""
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise BadRequest("stream", f"must be a boolean, got {stream!r}")
    return stream


def _prompt_override(body: dict[str, Any]) -> int | None:
    """``hedgerow_prompt_tokens`` of a body (an integer >= 0), or None when absent."""
    prompt_tokens = body.get("hedgerow_prompt_tokens")
    if prompt_tokens is not None and not (_is_int(prompt_tokens) and prompt_tokens >= 0):
        raise BadRequest("hedgerow_prompt_tokens", f"must be an integer >= 0, got {prompt_tokens!r}")
    return prompt_tokens


def _output_tokens(limit: int | None, wanted: int | None, default_output_tokens: int) -> tuple[int, bool]:
    """Tokens to generate, and whether the client's ``limit`` cut the answer short.

    ``wanted`` (``hedgerow_output_tokens``, else ``default_output_tokens``) is the answer's natural
    length; a ``limit`` (``max_tokens`` and the like) not above ``wanted`` ends it at the limit.
    """
    if limit is None:
        return (wanted if wanted is not None else default_output_tokens), False
    if wanted is not None and wanted < limit:
        return wanted, False
    return limit, True


def parse_responses_body(body: Any, default_output_tokens: int) -> ResponsesRequest:
    """A ``POST /v1/responses`` body as the request to run.

    Args:
        body: the decoded JSON body.
        default_output_tokens: the answer's length when the body sets none.

    Raises:
        BadRequest: a field is missing or wrong (named).
    """
    model = _model(body)
    if body.get("input") is None:
        raise BadRequest("input", "is required")
    text = _input_text(body["input"])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions", f"must be a string or null, got {instructions!r}")
    _check_output_fields(body, ("max_output_tokens", "hedgerow_output_tokens"))
    stream = _stream_flag(body)
    prompt_tokens = _prompt_override(body)
    if prompt_tokens is None:
        chars = len(text) + len(instructions or "")
        prompt_tokens = max(1, math.ceil(chars / CHARS_PER_TOKEN))
    limit = body.get("max_output_tokens")
    output, incomplete = _output_tokens(limit, body.get("hedgerow_output_tokens"), default_output_tokens)
    return ResponsesRequest(model, prompt_tokens, output, incomplete, stream, instructions, limit)


def parse_chat_body(body: Any, default_output_tokens: int) -> ChatRequest:
    """A ``POST /v1/chat/completions`` body as the request to run.

    Args:
        body: the decoded JSON body.
        default_output_tokens: the answer's length when the body sets none.

    Raises:
        BadRequest: a field is missing or wrong (named).
    """
    model = _model(body)
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("messages", "is required")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", "must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]", "must be an object")
        if not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}].role", "is required and must be a string")
    _check_output_fields(body, ("max_completion_tokens", "max_tokens", "hedgerow_output_tokens"))
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest("n", f"only n=1 is supported, got {n!r}")
    stream = _stream_flag(body)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options", "must be an object or null")
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest("stream_options.include_usage", f"must be a boolean, got {include_usage!r}")
    override = _prompt_override(body)
    estimated = estimate_prompt_tokens(messages)  # validates the message contents either way
    prompt_tokens = estimated if override is None else override
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    output, cut = _output_tokens(limit, body.get("hedgerow_output_tokens"), default_output_tokens)
    return ChatRequest(model, prompt_tokens, output, "length" if cut else "stop", stream, include_usage)
