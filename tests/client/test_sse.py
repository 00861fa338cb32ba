"""``SseDecoder`` (``hedgerow.client._sse``): the events of a body, however its bytes are split.

Each body is fed whole, one byte at a time, and split in two at every position; every way must
give the listed events. The bodies cover the common shape's fast path (one ``data:`` line per
event, with and without the space after the colon, empty values) and the general rules it hands
over to (several lines, named events, comments, CR and CRLF line ends, a byte order mark).
"""

from __future__ import annotations

import pytest

from hedgerow.client._sse import SseDecoder, SseEvent

CASES: dict[str, tuple[bytes, list[SseEvent]]] = {
    "one data line per event": (b'data: {"a":1}\n\ndata: [DONE]\n\n', [("", b'{"a":1}'), ("", b"[DONE]")]),
    "no space after the colon": (b'data:{"a":1}\n\n', [("", b'{"a":1}')]),
    "only the first space is dropped": (b"data:  x\n\n", [("", b" x")]),
    "empty value, with and without the space": (b"data:\n\ndata: \n\n", [("", b""), ("", b"")]),
    "two data lines are joined": (b"data: a\ndata: b\n\ndata: c\n\n", [("", b"a\nb"), ("", b"c")]),
    "a named event": (b"event: error\ndata: {}\n\n", [("error", b"{}")]),
    "a name without data": (b"event: error\n\n", [("error", b"")]),
    "comments and unknown fields": (b": ping\n\nid: 7\nretry: 5\ndata: x\n\n", [("", b"x")]),
    "a field name without a colon": (b"data\n\n", [("", b"")]),
    "a line that only looks like data": (b"datum: x\n\ndata: y\n\n", [("", b"y")]),
    "CRLF line ends": (b"data: a\r\n\r\ndata: b\r\n\r\n", [("", b"a"), ("", b"b")]),
    "CR line ends": (b"data: a\r\rdata: b\r\rdata: c\r", [("", b"a"), ("", b"b")]),
    "CR line ends to the last byte": (b"data: a\r\rdata: b\r\r", [("", b"a"), ("", b"b")]),
    "CRLF and CR mixed": (b"data: a\r\n\rdata: b\r\r\n", [("", b"a"), ("", b"b")]),
    "a byte order mark": (b"\xef\xbb\xbfdata: a\n\n", [("", b"a")]),
    "an unfinished last event is dropped": (b"data: a\n\ndata: b\n", [("", b"a")]),
}


def decode(pieces: list[bytes]) -> list[SseEvent]:
    decoder = SseDecoder()
    events: list[SseEvent] = []
    for piece in pieces:
        events.extend(decoder.events(piece))
    return events


@pytest.mark.parametrize("name", list(CASES))
def test_the_events_do_not_depend_on_how_the_body_is_split(name: str) -> None:
    body, expected = CASES[name]
    assert decode([body]) == expected
    assert decode([body[i : i + 1] for i in range(len(body))]) == expected
    for cut in range(1, len(body)):
        assert decode([body[:cut], body[cut:]]) == expected, cut


def test_feed_returns_the_same_events_as_a_list() -> None:
    body, expected = CASES["two data lines are joined"]
    assert SseDecoder().feed(body) == expected
