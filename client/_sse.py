"""Server-sent events from the raw bytes of a response body, a whole read at a time.

The attempt reader of ``hedgerow.client.hedging`` feeds each piece of body it reads to
``SseDecoder.feed`` and gets back every event the piece completed, as one list: no async
generator per line or per event, no text decoding of the stream as a whole (an event's ``data``
stays UTF-8 bytes, which JSON parsers read directly). The client reads every chunk of a streamed
answer through here, so it is written for the common shape first (``data: {...}`` lines ending in
``\\n``) and falls back to the general rules for the rest.

Parsing follows the WHATWG HTML "event stream interpretation"
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

* a line ends at ``\\r\\n``, ``\\r`` or ``\\n``, also when the two bytes of a ``\\r\\n`` arrive in
  two reads: a ``\\r`` ends its line at once (so a body whose last event ends in ``\\r\\r`` gives
  that event without waiting for bytes that never come), and a ``\\n`` that opens the next read
  right after it is the second half of the same line end; a UTF-8 byte order mark at the start of
  the stream is skipped;
* a line starting with ``:`` is a comment; otherwise the field name runs to the first ``:`` (the
  whole line without one) and one space after the colon is dropped from the value;
* ``data`` lines of one event are joined with ``\\n``; ``event`` names the event; ``id`` and
  ``retry`` and unknown fields are ignored (a hedged call never reconnects);
* a blank line ends the event. An event is produced when it has data or an ``event`` name (an
  ``event: error`` without data is still an error), and is dropped otherwise.

An unfinished last event (no blank line before the body ends) is dropped, as the standard says;
an unfinished last *line* is kept by ``flush`` only in the sense that it never makes an event.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

__all__ = ["SseDecoder", "SseEvent"]

#: One event: its ``event`` name (``""`` when not named) and its ``data`` (UTF-8 bytes).
SseEvent = tuple[str, bytes]

_BOM: Final = b"\xef\xbb\xbf"


class SseDecoder:
    """Incremental SSE parser: ``feed(piece)`` returns the events that ``piece`` completed.

    Holds back the unfinished last line until the next piece, and remembers a piece that ended in
    ``\\r`` (a line end already) so that a ``\\n`` opening the next piece is not a second one; memory
    is bounded by the caller (``_attempt_io.EventSizeCap`` caps the bytes between two
    blank lines).
    """

    __slots__ = ("_cr", "_data", "_event", "_rest", "_started")

    def __init__(self) -> None:
        self._rest = b""  # bytes after the last complete line ("\n"-normalised)
        self._cr = False  # the last piece ended in "\r": a "\n" opening the next one is its pair
        self._data: list[bytes] = []  # data lines of the event being read
        self._event = ""  # its event name
        self._started = False  # past the byte order mark check

    def feed(self, piece: bytes) -> list[SseEvent]:
        """Parse one more piece of the body.

        Args:
            piece: the next bytes of the body, as read (any split, even inside a character or
                between the ``\\r`` and ``\\n`` of a line end).

        Returns:
            The events completed by ``piece``, in order (often empty, often many).
        """
        return list(self.events(piece))

    def events(self, piece: bytes) -> Iterator[SseEvent]:
        """Parse one more piece of the body lazily: each event is parsed when it is asked for.

        The same events as ``feed``; a reader that hands the first token on before the rest of a
        burst (a whole answer in one read) does not wait for the rest to be parsed. The iterator
        must be read to its end (or dropped, which drops the rest of the piece's events) before
        the next piece is given.

        Args:
            piece: as for ``feed``.

        Yields:
            The events completed by ``piece``, in order.
        """
        if not piece:  # an empty read: nothing to parse, and a pending "\r" stays pending
            return
        text = self._rest + piece if self._rest else piece
        if self._cr:  # the "\r" ended its line, so nothing was held back: text is the piece
            self._cr = False
            if text.startswith(b"\n"):
                text = text[1:]
        if not self._started:
            if len(text) < len(_BOM) and _BOM.startswith(text):
                self._rest = text  # could still be the start of a byte order mark
                return
            self._started = True
            if text.startswith(_BOM):
                text = text[len(_BOM) :]
        if b"\r" in text:
            self._cr = text.endswith(b"\r")  # maybe the first half of a "\r\n" split between reads
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            cut = text.rfind(b"\n")
            self._rest = text[cut + 1 :]
        else:
            cut = text.rfind(b"\n")
            self._rest = text[cut + 1 :]
        if cut < 0:
            return
        events: list[SseEvent] = []
        if not self._data and not self._event:
            # The common shape: whole events of one "data:" line each, "\n"-separated.
            start = 0
            end = cut + 1
            while True:
                stop = text.find(b"\n\n", start, end)
                if stop < 0:
                    break
                if text.startswith(b"data:", start) and text.find(b"\n", start, stop) < 0:
                    # One copy of the value, sliced from the text (text[stop] is a line end).
                    begin = start + 6 if text[start + 5] == 32 else start + 5  # 32: one space dropped
                    yield ("", text[begin:stop])
                else:
                    self._lines(text[start:stop].split(b"\n"), events)
                    self._end_event(events)
                    yield from events
                    events.clear()
                start = stop + 2
            if start < end:  # complete lines after the last blank line ("\n"-terminated)
                self._lines(text[start : end - 1].split(b"\n"), events)
                yield from events
            return
        self._lines(text[:cut].split(b"\n"), events)
        yield from events

    def _lines(self, lines: list[bytes], events: list[SseEvent]) -> None:
        """Interpret complete lines (without their line ends) in order."""
        for line in lines:
            if not line:
                self._end_event(events)
            elif line.startswith(b":"):
                continue
            else:
                name, colon, value = line.partition(b":")
                if colon and value.startswith(b" "):
                    value = value[1:]
                if name == b"data":
                    self._data.append(value)
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace")

    def _end_event(self, events: list[SseEvent]) -> None:
        """A blank line: produce the event read so far (when it has data or a name), start anew."""
        if self._data or self._event:
            events.append((self._event, b"\n".join(self._data)))
            self._data = []
            self._event = ""
