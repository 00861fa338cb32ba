"""The bytes handed back for a hedged call: the winner's SSE chunks re-framed, and model renames.

Behind :class:`hedgerow.client.transport.HedgingTransport`: ``ChatByteStream`` is the body of a
hedged streaming response (the winner's chunks framed as ``data:`` events, ``event:`` names for the
Responses API); ``renamed_chunk`` and ``renamed_answer`` put the caller's model name back
(``rewrite_model``) on a streamed chunk or a whole answer; ``dumps`` is their compact JSON.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from hedgerow.client._call_stream import CallStream, RawChunk
from hedgerow.client.errors import HedgeError, StallTimeout, TotalTimeout

__all__ = ["ChatByteStream", "dumps", "renamed_answer", "renamed_chunk"]


class ChatByteStream(httpx.AsyncByteStream):
    """The body of a hedged streaming response: the winner's chunks, one piece per read of its
    body, each chunk as ``data: <its bytes>`` (Responses API calls: ``event: <name>`` first, and no
    ``[DONE]``, as OpenAI sends them), then ``[DONE]``. A chunk is re-encoded only to give it the
    caller's model name (``model``).

    Closing it (the response closed by the app or the SDK) ends the call; errors of the call
    after the first token surface as httpx transport errors (see the module table).
    """

    def __init__(
        self,
        call: CallStream,
        iterator: AsyncIterator[list[RawChunk]],
        first: list[RawChunk] | None,
        *,
        withhold_usage: bool,
        request: httpx.Request,
        model: str | None = None,
    ) -> None:
        self._call = call
        self._iterator = iterator
        self._first = first
        self._withhold_usage = withhold_usage
        self._responses = call.api == "responses"
        self._request = request
        self._model = model
        self._closed = False

    def _encode(self, batch: list[RawChunk]) -> bytes:
        """The SSE bytes of one read's chunks (``b""`` when every one is withheld)."""
        if len(batch) == 1 and not self._responses and self._model is None and not self._withhold_usage:
            data = batch[0][2]  # the common piece: one chunk, passed on as it is
            if b"\n" not in data:
                return b"data: " + data + b"\n\n"
        parts: list[bytes] = []
        for chunk, name, data in batch:
            if self._withhold_usage and chunk.get("choices") == [] and chunk.get("usage") is not None:
                continue
            if self._model is not None:
                data = renamed_chunk(chunk, data, self._model, self._responses)
            if self._responses:
                kind = name or chunk.get("type")
                if isinstance(kind, str) and kind:
                    parts += (b"event: ", kind.encode(), b"\n")
            if b"\n" in data:  # data of several lines: one data field per line
                data = data.replace(b"\n", b"\ndata: ")
            parts += (b"data: ", data, b"\n\n")
        return b"".join(parts)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if self._first is not None:
                data = self._encode(self._first)
                if data:
                    yield data
            async for batch in self._iterator:
                data = self._encode(batch)
                if data:
                    yield data
            await self._close(None)  # the call ended well: record it before the app sees the end
            if not self._responses:
                yield b"data: [DONE]\n\n"
        except (StallTimeout, TotalTimeout) as exc:
            await self._close(exc)
            raise httpx.ReadTimeout(str(exc), request=self._request) from exc
        except HedgeError as exc:
            await self._close(exc)
            raise httpx.ReadError(str(exc), request=self._request) from exc
        except BaseException as exc:
            await self._close(None if isinstance(exc, GeneratorExit) else exc)
            raise

    async def _close(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        await self._call.__aexit__(None if exc is None else type(exc), exc, None)

    async def aclose(self) -> None:
        """End the call: an unfinished call is recorded ``cancelled`` and every attempt closed."""
        await self._close(None)


def dumps(document: Any) -> bytes:
    """Compact JSON bytes of ``document`` (orjson; ``json`` for what orjson refuses)."""
    try:
        return orjson.dumps(document)
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def renamed_chunk(chunk: dict[str, Any], data: bytes, model: str, responses: bool) -> bytes:
    """``data`` of a streamed chunk with its model name set to ``model``: re-encoded when the chunk
    names another model (chat: ``model``; Responses: ``response.model``), else unchanged."""
    if responses:
        inner = chunk.get("response")
        if isinstance(inner, dict) and "model" in inner and inner["model"] != model:
            return dumps({**chunk, "response": {**inner, "model": model}})
        return data
    if "model" in chunk and chunk["model"] != model:
        return dumps({**chunk, "model": model})
    return data


def renamed_answer(content: bytes, model: str) -> bytes:
    """A whole answer with its top-level ``model`` set to ``model``; unchanged when it has none
    or is not a JSON object."""
    try:
        document = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if not isinstance(document, dict) or "model" not in document or document["model"] == model:
        return content
    document["model"] = model
    return dumps(document)
