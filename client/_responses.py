"""The Responses API (``POST /v1/responses``): what counts as a token, and assembling an answer.

A streamed response is a sequence of typed SSE events (``event: <type>`` and a JSON ``data``
with the same ``type``), ending with ``response.completed`` (or ``response.incomplete`` /
``response.failed``) and the end of the body; there is no ``[DONE]``. For the race
(``hedgerow.client._race``) each event is classified like a chat chunk (``ChunkKind``):

* **first token** = the first output delta of any kind with a non-empty ``delta``:
  ``response.output_text.delta``, ``response.refusal.delta`` (answer tokens),
  ``response.function_call_arguments.delta`` (an answer token, as a chat tool call),
  ``response.reasoning_text.delta`` and ``response.reasoning_summary_text.delta`` (reasoning
  tokens: TTFT, not TTFO);
* ``keepalive`` events and the lifecycle events (``response.created``, ``response.in_progress``,
  ``response.output_item.added``, ``response.content_part.added``, the ``*.done`` events) are not
  tokens;
* ``response.completed`` finishes the answer (``finish_reason`` ``completed``), and so does a
  ``response.incomplete`` after a delta (``incomplete``, like chat's ``length``); its
  ``response.usage`` gives the token counts (``input_tokens`` → prompt, ``output_tokens`` →
  completion, ``input_tokens_details.cached_tokens`` → cached prompt tokens);
* ``response.failed``, an ``error`` event, or a ``response.incomplete`` *before* any delta fail
  the attempt (``error_type`` ``response_failed``, ``sse_error``, ``response_incomplete``):
  before the first token that fails over, after it the call fails (``StreamError``), as for
  chat streams. ``attempt_failure`` makes that judgement for the attempt reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from hedgerow.client.chunks import ChunkKind
from hedgerow.client.errors import AttemptError

__all__ = [
    "ANSWER_DELTAS",
    "REASONING_DELTAS",
    "ResponsesAssembler",
    "attempt_failure",
    "chat_usage",
    "classify_event",
]

#: Delta events carrying answer tokens.
ANSWER_DELTAS: Final = frozenset(
    {"response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta"}
)
#: Delta events carrying reasoning tokens.
REASONING_DELTAS: Final = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})

_NOT_A_TOKEN: Final = ChunkKind(False, False, None, None)
_ANSWER: Final = ChunkKind(True, True, None, None)
_REASONING: Final = ChunkKind(True, False, None, None)


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """A Responses ``usage`` object in chat-completions terms (``prompt_tokens``,
    ``completion_tokens``, ``prompt_tokens_details.cached_tokens``), or None if not an object."""
    if not isinstance(usage, dict):
        return None
    mapped: dict[str, Any] = {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
    }
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        mapped["prompt_tokens_details"] = {"cached_tokens": details["cached_tokens"]}
    return mapped


def classify_event(event: dict[str, Any]) -> ChunkKind:
    """Classify one parsed Responses stream event (the module docstring gives the rules).

    Args:
        event: the JSON object of one SSE ``data:`` field.

    Returns:
        A ``ChunkKind``; a finishing event has ``finished == (0,)`` and the response's usage.
    """
    kind = event.get("type")
    if kind in ANSWER_DELTAS or kind in REASONING_DELTAS:
        delta = event.get("delta")
        if not isinstance(delta, str) or not delta:
            return _NOT_A_TOKEN
        return _ANSWER if kind in ANSWER_DELTAS else _REASONING
    if kind == "response.completed" or kind == "response.incomplete":
        response = event.get("response")
        usage = chat_usage(response.get("usage")) if isinstance(response, dict) else None
        reason = "completed" if kind == "response.completed" else "incomplete"
        return ChunkKind(False, False, reason, usage, (0,))
    return _NOT_A_TOKEN


def attempt_failure(event: dict[str, Any], delta_seen: bool) -> AttemptError | None:
    """The failure an event means for its attempt, or None.

    Args:
        event: a parsed Responses stream event.
        delta_seen: whether the attempt already sent an output delta.
    """
    kind = event.get("type")
    if kind == "error":
        return AttemptError("sse_error", f"Responses error event: {_excerpt(event)}")
    if kind == "response.failed":
        response = event.get("response")
        error = response.get("error") if isinstance(response, dict) else None
        return AttemptError("response_failed", f"response.failed: {_excerpt(error)}")
    if kind == "response.incomplete" and not delta_seen:
        return AttemptError("response_incomplete", "response.incomplete before any output delta")
    return None


def _excerpt(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:200]


@dataclass
class ResponsesAssembler:
    """Accumulates a streamed response: output text, reasoning text, function-call arguments
    (by ``item_id``), and the final ``response`` object of ``response.completed``/``incomplete``.

    Feed it every event of the winning attempt with ``add``.
    """

    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    arguments: dict[str, str] = field(default_factory=dict)
    response: dict[str, Any] | None = None

    def add(self, event: dict[str, Any]) -> None:
        """Fold one event (a parsed dict) into the answer."""
        kind = event.get("type")
        delta = event.get("delta")
        if isinstance(delta, str):
            if kind in ("response.output_text.delta", "response.refusal.delta"):
                self.text_parts.append(delta)
            elif kind in REASONING_DELTAS:
                self.reasoning_parts.append(delta)
            elif kind == "response.function_call_arguments.delta":
                key = str(event.get("item_id", ""))
                self.arguments[key] = self.arguments.get(key, "") + delta
        elif kind in ("response.completed", "response.incomplete") and isinstance(event.get("response"), dict):
            self.response = event["response"]

    @property
    def text(self) -> str:
        """The output text (output_text and refusal deltas joined)."""
        return "".join(self.text_parts)

    @property
    def reasoning_text(self) -> str:
        """The reasoning text (reasoning and reasoning-summary deltas joined)."""
        return "".join(self.reasoning_parts)

    @property
    def usage(self) -> dict[str, Any] | None:
        """The final response's ``usage`` object (Responses terms), if any."""
        usage = self.response.get("usage") if self.response is not None else None
        return usage if isinstance(usage, dict) else None
