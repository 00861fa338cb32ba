"""What counts as a token in an OpenAI-compatible stream, and assembling a streamed answer.

First token (DESIGN.md "client", step 2): the first chunk with a non-empty ``delta.content``,
``delta.reasoning_content``, ``delta.reasoning``, ``delta.refusal`` or a non-empty
``delta.tool_calls`` (legacy completions: a non-empty ``choices[].text``). A role-only chunk, an
empty-string content, a chunk with ``choices: []`` (Azure's ``prompt_filter_results``, the final
usage chunk), SSE comments and ``[DONE]`` are not tokens. TTFO counts only *answer* tokens: all of
the above except the two reasoning fields.

Rules for shapes that vary between servers (each a case of ``tests/client/streams``):

* ``delta.content`` may be a list of typed parts (Mistral's reasoning models):
  ``{"type": "text", "text": ...}`` is answer text, ``{"type": "thinking", "thinking": [parts]}``
  (or a string) is reasoning text. A part with non-empty text is a token; other part types
  (images, references) are not.
* ``finish_reason: ""`` means "not finished" (some servers send it on every chunk), like null.
* A whitespace-only content (``" "``, ``"\n"``) is a token: the model generated it.
* ``usage`` may come inside ``choices[i].usage`` instead of at the top level; the top-level
  object wins when both are present.
* With ``n > 1`` each chunk names its choice by ``index``; ``ChunkKind.finished`` lists the
  indices that finished in the chunk, and the answer is complete only when every one of the
  ``n`` choices has finished (``hedgerow.client.hedging``). ``AnswerAssembler`` assembles choice 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AnswerAssembler", "ChunkKind", "cached_prompt_tokens", "classify_chunk"]

_REASONING_FIELDS = ("reasoning_content", "reasoning")


def cached_prompt_tokens(usage: dict[str, Any]) -> int | None:
    """The prompt tokens an upstream read from its prompt cache, from a ``usage`` object.

    OpenAI, Azure OpenAI and vLLM report ``usage.prompt_tokens_details.cached_tokens``;
    DeepSeek reports ``usage.prompt_cache_hit_tokens``. Returns None when neither is present
    (or not a non-negative integer).
    """
    details = usage.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    if value is None:
        value = usage.get("prompt_cache_hit_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


@dataclass(frozen=True, slots=True)
class ChunkKind:
    """How one chunk counts.

    Attributes:
        token: the chunk carries at least one generated token of any kind.
        answer: the chunk carries an answer (non-reasoning) token.
        finish_reason: the first non-empty ``finish_reason`` in the chunk, or None.
        usage: the chunk's ``usage`` object (top level, else the first ``choices[i].usage``)
            when present and not null.
        finished: the ``index`` of every choice with a non-empty ``finish_reason`` in the chunk
            (a choice without ``index`` is choice 0); empty when none finished.
    """

    token: bool
    answer: bool
    finish_reason: str | None
    usage: dict[str, Any] | None
    finished: tuple[int, ...] = ()


#: The kind of the common chunk (one unfinished choice with text content, no usage), shared.
_ANSWER_TOKEN = ChunkKind(True, True, None, None)


def _nonempty_text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _part_texts(parts: Any, reasoning: bool) -> list[tuple[str, bool]]:
    """The ``(text, is_reasoning)`` pieces of a typed-parts ``content`` list, in order.

    ``{"type": "text", "text": s}`` gives ``(s, reasoning)``; ``{"type": "thinking", "thinking":
    list-or-string}`` gives its texts as reasoning. Empty texts and other part types are skipped.
    """
    if isinstance(parts, str):
        return [(parts, reasoning)] if parts else []
    texts: list[tuple[str, bool]] = []
    if not isinstance(parts, list):
        return texts
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" and _nonempty_text(part.get("text")):
            texts.append((part["text"], reasoning))
        elif kind == "thinking":
            texts.extend(_part_texts(part.get("thinking"), True))
    return texts


def classify_chunk(chunk: dict[str, Any]) -> ChunkKind:
    """Classify one parsed ``chat.completion.chunk`` (or legacy ``text_completion``) dict.

    Args:
        chunk: the JSON object of one SSE ``data:`` line.

    Returns:
        A ``ChunkKind`` (the rules are in the module docstring); malformed parts (a non-list
        ``choices``, a non-dict ``delta``) count as no token rather than raising.
    """
    usage = chunk.get("usage")
    choices = chunk.get("choices")
    # The common chunk first: one choice, not finished, no usage, a non-empty string content.
    # It is an answer token whatever else its delta holds; the general rules below say the same.
    if usage is None and type(choices) is list and len(choices) == 1:
        choice = choices[0]
        if type(choice) is dict and not choice.get("finish_reason") and choice.get("usage") is None:
            delta = choice.get("delta")
            if type(delta) is dict:
                content = delta.get("content")
                if type(content) is str and content:
                    return _ANSWER_TOKEN
    token = answer = False
    finish_reason = None
    finished: tuple[int, ...] = ()
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if reason and isinstance(reason, str):
                if finish_reason is None:
                    finish_reason = reason
                index = choice.get("index", 0)
                finished = (*finished, index if isinstance(index, int) else 0)
            if usage is None:
                usage = choice.get("usage")
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                if _nonempty_text(content) or _nonempty_text(delta.get("refusal")):
                    token = answer = True
                elif isinstance(content, list):
                    for _text, is_reasoning in _part_texts(content, False):
                        token = True
                        answer = answer or not is_reasoning
                tool_calls = delta.get("tool_calls")
                if isinstance(tool_calls, list) and tool_calls:
                    token = answer = True
                if any(_nonempty_text(delta.get(name)) for name in _REASONING_FIELDS):
                    token = True
            elif _nonempty_text(choice.get("text")):
                token = answer = True
    return ChunkKind(token, answer, finish_reason, usage if isinstance(usage, dict) else None, finished)


@dataclass
class AnswerAssembler:
    """Accumulates the text, reasoning, tool calls and finish reason of a streamed answer.

    Feed it every chunk of the winning attempt with ``add``; tool-call fragments are joined by
    their ``index`` into complete calls (``{"id", "type", "function": {"name", "arguments"}}``).
    """

    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    tool_calls_by_index: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        """Fold one chunk (a parsed dict) into the answer."""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if not isinstance(usage, dict) and isinstance(choice.get("usage"), dict):
                self.usage = usage = choice["usage"]
            if choice.get("index", 0) not in (0, None):
                continue
            if _nonempty_text(choice.get("finish_reason")):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                if _nonempty_text(choice.get("text")):
                    self.text_parts.append(choice["text"])
                continue
            content = delta.get("content")
            if isinstance(content, list):
                for text, is_reasoning in _part_texts(content, False):
                    (self.reasoning_parts if is_reasoning else self.text_parts).append(text)
            elif isinstance(content, str) and content:
                self.text_parts.append(content)
            if _nonempty_text(delta.get("refusal")):
                self.text_parts.append(delta["refusal"])
            for name in _REASONING_FIELDS:
                if _nonempty_text(delta.get(name)):
                    self.reasoning_parts.append(delta[name])
            for fragment in delta.get("tool_calls") or []:
                if isinstance(fragment, dict):
                    self._add_tool_fragment(fragment)

    def _add_tool_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index", len(self.tool_calls_by_index))
        call = self.tool_calls_by_index.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if fragment.get("id"):
            call["id"] = fragment["id"]
        if fragment.get("type"):
            call["type"] = fragment["type"]
        function = fragment.get("function") or {}
        if isinstance(function, dict):
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    @property
    def text(self) -> str:
        """The answer text (content and refusal deltas joined)."""
        return "".join(self.text_parts)

    @property
    def reasoning_text(self) -> str:
        """The reasoning text (``reasoning_content``/``reasoning`` deltas and thinking parts joined)."""
        return "".join(self.reasoning_parts)

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The complete tool calls, in index order."""
        return [self.tool_calls_by_index[i] for i in sorted(self.tool_calls_by_index)]
