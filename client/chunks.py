"""What counts as a token in an OpenAI-compatible stream, and assembling a streamed answer.

First token (docs/DESIGN.md "client", step 2): the first chunk with a non-empty ``delta.content``,
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
* A ``tool_calls`` list is a token only when one of its items is a real fragment: an object with
  a non-empty ``id``, or a ``function`` with a non-empty ``name`` or ``arguments``. A list of
  ``null`` items, of empty objects or of objects carrying only an ``index`` or provider metadata
  (Gemini's ``extra_content``) is not.
* When one delta carries non-empty text in both ``reasoning_content`` and ``reasoning`` (routers
  that mirror one field into the other), equal texts are assembled once; different texts are
  both kept, ``reasoning_content`` first.
* Tool-call fragments are joined into calls by ``index``, repaired for servers that get it
  wrong: a fragment continues the call last seen at its ``index`` (without an integer ``index``,
  as Gemini sends them: the latest call), unless it carries an ``id`` other than that call's own,
  which starts a new call (several calls all sent at index 0); a fragment with no call to
  continue starts one. Indices need not start at 0 or be contiguous. Calls are listed in the
  order their first fragment arrived. Fields of a fragment other than ``index``, ``id``, ``type`` and
  ``function`` (``extra_content.google.thought_signature``, which Gemini needs back on the next
  turn) are kept on the call as received, a later fragment's value replacing an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AnswerAssembler",
    "ChunkKind",
    "cached_prompt_tokens",
    "classify_chunk",
    "real_tool_fragment",
    "reasoning_texts",
]

_REASONING_FIELDS = ("reasoning_content", "reasoning")
#: Keys of a tool-call fragment that the assembler joins; any other key is kept as received.
_TOOL_CALL_KEYS = frozenset({"index", "id", "type", "function"})


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


def real_tool_fragment(fragment: Any) -> bool:
    """Whether one item of a ``delta.tool_calls`` list carries generated output.

    Args:
        fragment: the item as parsed (any JSON value).

    Returns:
        True for an object with a non-empty string ``id``, or whose ``function`` object has a
        non-empty string ``name`` or ``arguments``; False for ``null``, non-objects, and objects
        carrying only an ``index``, a ``type`` or provider metadata.
    """
    if not isinstance(fragment, dict):
        return False
    if _nonempty_text(fragment.get("id")):
        return True
    function = fragment.get("function")
    return isinstance(function, dict) and (
        _nonempty_text(function.get("name")) or _nonempty_text(function.get("arguments"))
    )


def reasoning_texts(delta: dict[str, Any]) -> list[str]:
    """The reasoning texts of one delta, in assembly order.

    Args:
        delta: a ``choices[i].delta`` object.

    Returns:
        The non-empty ``reasoning_content`` and ``reasoning`` strings, in that order; one text
        when both carry the same one (a router mirroring one field into the other).
    """
    texts = [delta[name] for name in _REASONING_FIELDS if _nonempty_text(delta.get(name))]
    if len(texts) == 2 and texts[0] == texts[1]:
        return texts[:1]
    return texts


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
                if isinstance(tool_calls, list) and any(real_tool_fragment(item) for item in tool_calls):
                    token = answer = True
                if any(_nonempty_text(delta.get(name)) for name in _REASONING_FIELDS):
                    token = True
            elif _nonempty_text(choice.get("text")):
                token = answer = True
    return ChunkKind(token, answer, finish_reason, usage if isinstance(usage, dict) else None, finished)


@dataclass
class AnswerAssembler:
    """Accumulates the text, reasoning, tool calls and finish reason of a streamed answer.

    Feed it every chunk of the winning attempt with ``add``; tool-call fragments are joined into
    complete calls (``{"id", "type", "function": {"name", "arguments"}}`` plus any provider
    fields) by the rules of the module docstring.

    Attributes:
        text_parts / reasoning_parts: the answer and reasoning texts, in arrival order.
        calls: the tool calls, in the order their first fragment arrived.
        finish_reason / usage: the last non-empty finish reason and usage object seen.
    """

    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    #: the position in ``calls`` of the latest call seen at each wire ``index``
    _at_index: dict[int, int] = field(default_factory=dict, repr=False)

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
            self.reasoning_parts.extend(reasoning_texts(delta))
            tool_calls = delta.get("tool_calls")
            if isinstance(tool_calls, list):
                for fragment in tool_calls:
                    if isinstance(fragment, dict):
                        self._add_tool_fragment(fragment)

    def _add_tool_fragment(self, fragment: dict[str, Any]) -> None:
        """Fold one tool-call fragment into its call (the rules are in the module docstring)."""
        extra = {key: value for key, value in fragment.items() if key not in _TOOL_CALL_KEYS}
        if not real_tool_fragment(fragment) and not extra:
            return  # an empty object or a bare index: nothing to keep
        index = fragment.get("index")
        fragment_id = fragment.get("id") if _nonempty_text(fragment.get("id")) else None
        latest = len(self.calls) - 1 if self.calls else None
        position = self._at_index.get(index) if type(index) is int else latest
        if position is not None and fragment_id is not None:
            held = self.calls[position]["id"]
            if held is not None and held != fragment_id:
                position = None  # another call: a new id where a call with its own id is
        if position is None:
            position = len(self.calls)
            self.calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if type(index) is int:
            self._at_index[index] = position
        call = self.calls[position]
        if fragment_id is not None:
            call["id"] = fragment_id
        if _nonempty_text(fragment.get("type")):
            call["type"] = fragment["type"]
        function = fragment.get("function")
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                if _nonempty_text(function.get(key)):
                    call["function"][key] += function[key]
        call.update(extra)

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
        """The complete tool calls, in the order their first fragment arrived."""
        return list(self.calls)
