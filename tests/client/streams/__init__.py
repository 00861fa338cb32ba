"""Recorded, byte-exact SSE responses of real OpenAI-compatible servers, and what each must give.

Each ``<name>.sse`` file next to this module is the exact body one server shape sends (line
endings, comments, JSON spacing and escaping as that server writes them); it is read in binary
and never re-encoded. ``CASES`` is the table of expectations: for every file, the answer text,
reasoning text, tool calls, finish reason, token counts, record status, and which event's arrival
is the TTFT and which the TTFO.

An *event* is one block of the file ending in a blank line (a ``data:`` event or a comment such
as ``: ping``). The test server writes event ``i`` at ``schedule_s()[i]`` seconds after it received
the request: events named in ``at_s`` at that time, every other event ``GAP_S`` after the one
before it. The timelines put non-token events (role-only chunk, empty contents, keep-alives,
Azure's prompt-filter chunk) in the first ~0.2 s, the first token at 0.6 s and, for reasoning
models, the first answer token at 1.2 s, so a client that counts the wrong event is off by at
least 0.4 s, far more than scheduling noise on a loaded machine.

Where the shapes come from:

- ``openai``, ``role_only``, ``empty_contents``, ``no_usage``, ``no_done``, ``tool_calls``,
  ``refusal``, ``keepalive``, ``crlf``, ``data_nospace``: OpenAI's chat-completions stream (role
  chunk with ``content: ""`` and ``refusal: null``, ``usage: null`` on every chunk and a final
  ``choices: []`` usage chunk under ``stream_options.include_usage``), each varied in one respect.
- ``azure``: Azure OpenAI (alphabetically ordered keys; a first chunk with ``choices: []`` and
  ``prompt_filter_results``; a trailing chunk with ``content_filter_offsets`` and no ``delta``).
- ``reasoning_content``: DeepSeek's reasoner (``: keep-alive`` comments while queued,
  ``reasoning_content`` deltas, usage on the finish chunk).
- ``reasoning``: OpenRouter (``: OPENROUTER PROCESSING`` comments, ``reasoning`` deltas).
- ``llama_cpp_python``: ``python -m llama_cpp.server`` behind sse-starlette (CRLF line endings,
  ``json.dumps`` spacing and ``\\u`` escapes, a role-only chunk sent together with the first token,
  no usage, ``: ping - <time>`` comments every 15 s).
- ``llama_server``: llama.cpp's C++ ``llama-server`` (sorted keys, role chunk with
  ``content: null`` together with the first token, a ``choices: []`` usage chunk with ``timings``).
- ``vllm``: vLLM (role chunk ``{"role":"assistant","content":""}`` with the first token, a finish
  chunk with ``stop_reason``, and a ``choices: []`` usage chunk under ``include_usage``).

Shapes the client once got wrong (issue 12), each with its rule in ``hedgerow.client.chunks``:

- ``content_parts``: Mistral's Magistral models (``delta.content`` as a list of typed parts:
  ``thinking`` parts holding text parts, then a ``text`` part, then plain strings).
- ``json_labelled`` / ``no_content_type``: an SSE body labelled ``Content-Type: application/json``
  (seen behind proxies) or not labelled at all; the openai SDK reads both.
- ``empty_finish``: ``finish_reason: ""`` on every chunk until the real one (Baidu's ERNIE
  OpenAI-compatible endpoint and others).
- ``n2``: an ``n: 2`` request; the choices interleave by ``index`` and choice 0 finishes first.
- ``choice_usage``: usage inside ``choices[0].usage`` on the finish chunk (Moonshot's Kimi), no
  top-level usage.
- ``whitespace_first``: a first content of ``"\\n\\n"`` (a token: the model generated it).

Shapes of 2025-26 public bug reports (issue 34), each with its rule in ``hedgerow.client.chunks``
or the attempt reader of ``hedgerow.client.hedging``:

- ``null_frame``: ``data: null`` between the reasoning and the answer, as some gateways send it
  (reported against gateways in front of DeepSeek and MiniMax reasoning models): skipped, not an
  event and not yielded; the answer after it is kept.
- ``null_tool_calls``: ``tool_calls: [null]``, ``[null, null]`` and ``[{"index": 0}]`` before the
  first text (MiniMax through OpenAI-compatible gateways): not tokens, so the hedge timer runs on.
- ``reasoning_mirrored``: every reasoning delta carries the same text in ``reasoning`` and
  ``reasoning_content`` (StepFun's API, and routers that fill both fields for compatibility; see
  MoonshotAI/kimi-code#3928 and vllm-project/vllm#34030): the text is assembled once.
- ``gemini_tool_calls``: Gemini's OpenAI-compatible endpoint: two complete calls in one chunk,
  neither with an ``index``, the first with ``extra_content.google.thought_signature`` (the next
  turn fails with 400 without it), then ``finish_reason: "stop"`` (AstrBotDevs/AstrBot#6661,
  THU-MAIC/OpenMAIC#1556).
- ``tool_index_missing``: Gemini's indexless fragments split across deltas, a delta carrying only
  a thought signature, then a second call with its own id (open-webui/computer#224).
- ``tool_index_shifted``: tool-call indices counted from 1 (mistral.rs-style servers).
- ``tool_index_colliding``: every call sent at index 0, each with its own id (Cerebras and some
  DeepSeek-compatible endpoints).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.client.scripted_server import Script

__all__ = ["CASES", "CASES_BY_NAME", "GAP_S", "StreamCase", "chunked", "data_chunks", "split_events"]

#: Seconds between two events whose time the case does not name.
GAP_S = 0.02

_HERE = Path(__file__).parent
_LINE_END = re.compile(rb"\r\n|\r|\n")


def split_events(raw: bytes) -> list[bytes]:
    """Cut an SSE body into its events, each ending with its blank line (joined they give ``raw``).

    Args:
        raw: the byte-exact body.

    Returns:
        The blocks in order; trailing bytes after the last blank line form one more block.
    """
    blocks: list[bytes] = []
    start = 0
    line_end: int | None = None
    for match in _LINE_END.finditer(raw):
        if line_end is not None and match.start() == line_end:
            blocks.append(raw[start : match.end()])
            start = match.end()
            line_end = None
        else:
            line_end = match.end()
    if start < len(raw):
        blocks.append(raw[start:])
    return blocks


def data_chunks(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of the ``data:`` fields of ``raw``, in order, without ``[DONE]``.

    This is the oracle for what a client must yield: one dict per ``data:`` event (a ``data: null``
    frame carries no object and yields nothing).
    """
    chunks = []
    for line in _LINE_END.split(raw):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].removeprefix(b" ").decode("utf-8")
        if payload != "[DONE]" and (chunk := json.loads(payload)) is not None:  # data: null is no chunk
            chunks.append(chunk)
    return chunks


def chunked(pieces: list[tuple[float, bytes]], *, terminate: bool = True) -> list[tuple[float, bytes]]:
    """Frame timed body pieces with HTTP/1.1 chunked transfer encoding (one HTTP chunk each).

    Args:
        pieces: ``(delay_s, bytes)`` pairs of the body.
        terminate: end with the zero-length chunk; False cuts the body off mid-message.
    """
    framed = [(delay, b"%x\r\n%s\r\n" % (len(data), data)) for delay, data in pieces if data]
    if terminate:
        framed.append((0.0, b"0\r\n\r\n"))
    return framed


@dataclass(frozen=True)
class StreamCase:
    """One recorded stream and what a client must make of it.

    Attributes:
        name: the file stem (``<name>.sse``).
        at_s: arrival time (s after the request) of the events it names, by event index.
        ttft_event: index of the event whose arrival is the first token (any kind).
        ttfo_event: index of the event whose arrival is the first answer (non-reasoning) token.
        last_token_event: index of the event carrying the last token (its arrival is e2e; the
            finish, usage and filter chunks after it must not move e2e).
        text: the assembled answer text (content and refusal deltas).
        reasoning_text: the assembled ``reasoning_content``/``reasoning`` text.
        tool_calls: the complete tool calls.
        finish_reason: the stream's finish reason.
        prompt_tokens: from the usage object, or None where the stream has none.
        completion_tokens: from the usage object, else the number of token-carrying chunks.
        status: the record's status.
        min_max_itl_s: a lower bound on the record's ``max_itl_s`` (gaps filled only by
            comments must still count as gaps), or None.
        content_type: the response's Content-Type header (None: no such header).
        request: fields the request body adds to ``tests.helpers.BODY`` (``{"n": 2}``).
    """

    name: str
    at_s: Mapping[int, float]
    ttft_event: int
    ttfo_event: int
    last_token_event: int
    text: str
    prompt_tokens: int | None
    completion_tokens: int
    reasoning_text: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()
    finish_reason: str = "stop"
    status: str = "ok"
    min_max_itl_s: float | None = None
    content_type: str | None = "text/event-stream"
    request: Mapping[str, Any] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def raw(self) -> bytes:
        """The byte-exact body."""
        if "raw" not in self._cache:
            self._cache["raw"] = (_HERE / f"{self.name}.sse").read_bytes()
        raw: bytes = self._cache["raw"]
        return raw

    def events(self) -> list[bytes]:
        """The body cut into events."""
        return split_events(self.raw())

    def chunks(self) -> list[dict[str, Any]]:
        """Every JSON chunk of the stream, in order (what ``stream_chat`` must yield)."""
        return data_chunks(self.raw())

    def schedule_s(self) -> list[float]:
        """Arrival time of every event, seconds after the request."""
        times: list[float] = []
        for index in range(len(self.events())):
            if index in self.at_s:
                times.append(self.at_s[index])
            else:
                times.append(times[-1] + GAP_S if times else 0.0)
        return times

    def ttft_at_s(self, scale: float = 1.0) -> float:
        """Scripted arrival of the first token, seconds."""
        return self.schedule_s()[self.ttft_event] * scale

    def ttfo_at_s(self, scale: float = 1.0) -> float:
        """Scripted arrival of the first answer token, seconds."""
        return self.schedule_s()[self.ttfo_event] * scale

    def e2e_at_s(self, scale: float = 1.0) -> float:
        """Scripted arrival of the last token, seconds."""
        return self.schedule_s()[self.last_token_event] * scale

    def pieces(self, scale: float = 1.0) -> list[tuple[float, bytes]]:
        """The events as ``(delay after the previous write, bytes)``, times multiplied by ``scale``."""
        pieces = []
        previous = 0.0
        for at, data in zip(self.schedule_s(), self.events(), strict=False):
            pieces.append((max(0.0, (at - previous) * scale), data))
            previous = at
        return pieces

    def script(self, scale: float = 1.0) -> Script:
        """A ``Script`` serving this stream with HTTP chunked encoding, as real servers do."""
        return Script(
            pieces=chunked(self.pieces(scale)), headers={"Transfer-Encoding": "chunked"}, content_type=self.content_type
        )

    def body(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The request body of this case: ``base`` with ``request``'s fields."""
        return {**base, **self.request}

    def usage(self) -> dict[str, Any] | None:
        """The last usage object of the stream: top-level, else inside a choice."""
        found = None
        for chunk in self.chunks():
            if isinstance(chunk.get("usage"), dict):
                found = chunk["usage"]
                continue
            for choice in chunk.get("choices") or []:
                if isinstance(choice.get("usage"), dict):
                    found = choice["usage"]
        return found


T_FIRST = 0.6  # the first token
T_ANSWER = 1.2  # the first answer token of a reasoning model

CASES: tuple[StreamCase, ...] = (
    # Role chunk {"role":"assistant","content":"","refusal":null} at 0 s; "usage": null on every
    # chunk; multi-byte UTF-8 (ü, ß, 世界, 🌿); a choices: [] usage chunk, late (1.3 s); [DONE].
    StreamCase(
        "openai",
        at_s={1: T_FIRST, 7: 1.3},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=5,
        text="Grüße, 世界 🌿!",
        prompt_tokens=14,
        completion_tokens=5,
    ),
    # A role-only first chunk, without any content key.
    StreamCase(
        "role_only",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=3,
        text="Hello there.",
        prompt_tokens=9,
        completion_tokens=3,
    ),
    # "content": "" in the role chunk and in three more chunks before the first real content.
    StreamCase(
        "empty_contents",
        at_s={4: T_FIRST},
        ttft_event=4,
        ttfo_event=4,
        last_token_event=5,
        text="Okay",
        prompt_tokens=8,
        completion_tokens=2,
    ),
    # No usage anywhere: completion tokens are the four counted content chunks.
    StreamCase(
        "no_usage",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=4,
        text="One two three four",
        prompt_tokens=None,
        completion_tokens=4,
        finish_reason="length",
    ),
    # [DONE] missing: the body ends right after the finish_reason chunk.
    StreamCase(
        "no_done",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=2,
        text="Done soon",
        prompt_tokens=None,
        completion_tokens=2,
    ),
    # Only tool calls: two parallel calls, each from a header fragment and argument fragments.
    StreamCase(
        "tool_calls",
        at_s={0: T_FIRST},
        ttft_event=0,
        ttfo_event=0,
        last_token_event=6,
        text="",
        prompt_tokens=60,
        completion_tokens=31,
        finish_reason="tool_calls",
        tool_calls=(
            {
                "id": "call_Wq1bX",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
            },
            {"id": "call_Zr7pK", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}},
        ),
    ),
    # A refusal streamed in delta.refusal (answer tokens; the answer text joins them).
    StreamCase(
        "refusal",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=3,
        text="I'm sorry, I can't help with that.",
        prompt_tokens=20,
        completion_tokens=10,
    ),
    # ": ping" at 0, 0.1, 0.2 s, the first token at 0.6 s, a ping at 0.9 s, the next token at 1.2 s:
    # the gap between the tokens is 0.6 s (0.3 s if a ping were taken for a token).
    StreamCase(
        "keepalive",
        at_s={1: 0.1, 2: 0.2, 3: T_FIRST, 4: 0.9, 5: 1.2},
        ttft_event=3,
        ttfo_event=3,
        last_token_event=5,
        text="Pong!",
        prompt_tokens=None,
        completion_tokens=2,
        min_max_itl_s=0.45,
    ),
    # CRLF line endings everywhere.
    StreamCase(
        "crlf",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=2,
        text="Überstraße",
        prompt_tokens=5,
        completion_tokens=2,
    ),
    # "data:{...}" without the space after the colon.
    StreamCase(
        "data_nospace",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=2,
        text="No space",
        prompt_tokens=4,
        completion_tokens=2,
    ),
    # Azure: choices: [] with prompt_filter_results first; a content_filter_offsets chunk without
    # delta last (late, at 1.3 s, as the asynchronous content filter sends it); no usage.
    StreamCase(
        "azure",
        at_s={2: T_FIRST, 6: 1.3},
        ttft_event=2,
        ttfo_event=2,
        last_token_event=4,
        text="Hallo Welt.",
        prompt_tokens=None,
        completion_tokens=3,
    ),
    # DeepSeek: two ": keep-alive", the role chunk, reasoning_content from 0.6 s, content from 1.2 s,
    # usage on the finish chunk.
    StreamCase(
        "reasoning_content",
        at_s={3: T_FIRST, 6: T_ANSWER},
        ttft_event=3,
        ttfo_event=6,
        last_token_event=7,
        text="4.",
        reasoning_text="Hmm, 2+2 is 4.",
        prompt_tokens=11,
        completion_tokens=9,
    ),
    # OpenRouter: two ": OPENROUTER PROCESSING", reasoning from 0.6 s (with the role), content at 1.2 s.
    StreamCase(
        "reasoning",
        at_s={2: T_FIRST, 5: T_ANSWER},
        ttft_event=2,
        ttfo_event=5,
        last_token_event=6,
        text="Hi!",
        reasoning_text="The user greets me.",
        prompt_tokens=10,
        completion_tokens=12,
    ),
    # llama-cpp-python: the role-only chunk written together with the first token, a ping, no usage.
    StreamCase(
        "llama_cpp_python",
        at_s={0: T_FIRST, 1: T_FIRST, 4: 0.8, 5: 0.9},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=5,
        text="Bonjour à tous 👋",
        prompt_tokens=None,
        completion_tokens=4,
    ),
    # llama-server: role chunk (content: null) together with the first token; usage with timings.
    StreamCase(
        "llama_server",
        at_s={0: T_FIRST, 1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=4,
        text="Hola mundo¡!",
        prompt_tokens=13,
        completion_tokens=4,
    ),
    # vLLM: role chunk (content "") together with the first token; a finish chunk with content ""
    # and stop_reason; a choices: [] usage chunk.
    StreamCase(
        "vllm",
        at_s={0: T_FIRST, 1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=4,
        text="Ciao, mondo ☀️",
        prompt_tokens=21,
        completion_tokens=5,
    ),
)

CASES += (
    # Magistral: thinking parts from 0.6 s (reasoning), a text part at 1.2 s (the first answer).
    StreamCase(
        "content_parts",
        at_s={2: T_FIRST, 4: T_ANSWER},
        ttft_event=2,
        ttfo_event=4,
        last_token_event=5,
        text="Bonjour !",
        reasoning_text="The user says hello.",
        prompt_tokens=7,
        completion_tokens=12,
    ),
    StreamCase(
        "json_labelled",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=2,
        text="Labelled wrong",
        prompt_tokens=6,
        completion_tokens=2,
        content_type="application/json",
    ),
    StreamCase(
        "no_content_type",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=2,
        text="No label",
        prompt_tokens=6,
        completion_tokens=2,
        content_type=None,
    ),
    StreamCase(
        "empty_finish",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=3,
        text="Not finished yet.",
        prompt_tokens=5,
        completion_tokens=3,
    ),
    # n=2: the answer text is choice 0's; tokens (usage) and e2e cover both choices.
    StreamCase(
        "n2",
        at_s={2: T_FIRST},
        ttft_event=2,
        ttfo_event=2,
        last_token_event=6,
        text="Red",
        prompt_tokens=12,
        completion_tokens=4,
        request={"n": 2},
    ),
    StreamCase(
        "choice_usage",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=3,
        text="Usage inside the choice.",
        prompt_tokens=17,
        completion_tokens=4,
    ),
    StreamCase(
        "whitespace_first",
        at_s={1: T_FIRST, 2: 1.0},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=2,
        text="\n\nIndented",
        prompt_tokens=None,
        completion_tokens=2,
    ),
)


#: The thought signature on the first call of ``gemini_tool_calls.sse``.
GEMINI_SIGNATURE = "CpoCAdHtim9xQ2bZ8yR0kZ3mN4sT7uV1wX5yA6bC8dE0fG2hI4jK6lM8nO0pQ2rS4tU6vW8xY0zA="


def _call(call_id: str, name: str, arguments: str, **extra: Any) -> dict[str, Any]:
    """One assembled tool call as the client must give it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}, **extra}


CASES += (
    # Reasoning from 0.6 s, "data: null" after it, the answer at 1.2 s.
    StreamCase(
        "null_frame",
        at_s={1: T_FIRST, 4: T_ANSWER},
        ttft_event=1,
        ttfo_event=4,
        last_token_event=5,
        text="Four.",
        reasoning_text="Two plus two.",
        prompt_tokens=9,
        completion_tokens=6,
    ),
    # Three chunks whose tool_calls hold only nulls or a bare index in the first 0.04 s; text at 0.6 s.
    StreamCase(
        "null_tool_calls",
        at_s={3: T_FIRST},
        ttft_event=3,
        ttfo_event=3,
        last_token_event=4,
        text="Sure, done.",
        prompt_tokens=12,
        completion_tokens=3,
    ),
    StreamCase(
        "reasoning_mirrored",
        at_s={1: T_FIRST, 4: T_ANSWER},
        ttft_event=1,
        ttfo_event=4,
        last_token_event=5,
        text="Hello!",
        reasoning_text="The user waves.",
        prompt_tokens=8,
        completion_tokens=5,
    ),
    StreamCase(
        "gemini_tool_calls",
        at_s={0: T_FIRST},
        ttft_event=0,
        ttfo_event=0,
        last_token_event=0,
        text="",
        prompt_tokens=51,
        completion_tokens=24,
        tool_calls=(
            _call(
                "function-call-8d41f0c2",
                "get_weather",
                '{"city":"Paris"}',
                extra_content={"google": {"thought_signature": GEMINI_SIGNATURE}},
            ),
            _call("function-call-2b7e93a5", "get_time", '{"tz":"CET"}'),
        ),
    ),
    StreamCase(
        "tool_index_missing",
        at_s={0: T_FIRST},
        ttft_event=0,
        ttfo_event=0,
        last_token_event=4,
        text="",
        prompt_tokens=40,
        completion_tokens=19,
        tool_calls=(
            _call(
                "function-call-51c0",
                "search",
                '{"q":"hedged requests"}',
                extra_content={"google": {"thought_signature": "EtMBCtABAdHtim8Qv3pL"}},
            ),
            _call("function-call-51c1", "open", '{"n":1}'),
        ),
    ),
    StreamCase(
        "tool_index_shifted",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=4,
        text="",
        prompt_tokens=30,
        completion_tokens=22,
        finish_reason="tool_calls",
        tool_calls=(
            _call("Kc8aF2pQz", "add", '{"a": 2, "b": 3}'),
            _call("Lm4bG7rTx", "mul", '{"a": 4, "b": 5}'),
        ),
    ),
    StreamCase(
        "tool_index_colliding",
        at_s={1: T_FIRST},
        ttft_event=1,
        ttfo_event=1,
        last_token_event=4,
        text="",
        prompt_tokens=44,
        completion_tokens=28,
        finish_reason="tool_calls",
        tool_calls=(
            _call("call_0_1a2b", "get_weather", '{"city":"Oslo"}'),
            _call("call_1_3c4d", "get_weather", '{"city":"Rome"}'),
        ),
    ),
)

CASES_BY_NAME: dict[str, StreamCase] = {case.name: case for case in CASES}
