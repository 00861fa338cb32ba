"""``SseDecoder`` (``hedgerow.client._sse``): the events of a body, however its bytes are split.

Each body is fed whole, one byte at a time, and split in two at every position; every way must
give the listed events. The bodies cover the common shape's fast path (one ``data:`` line per
event, with and without the space after the colon, empty values) and the general rules it hands
over to (several lines, named events, comments, CR and CRLF line ends, a byte order mark).
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- any body, any split: against a plain reading of the standard ---------------------------------

_LINE_END = re.compile(rb"\r\n|\r|\n")
_TOKENS = [b"data:", b"data: ", b"event: error", b"event:", b":", b"id: 1", b"x", b" ", b"{}", b"\r", b"\n", b"\r\n"]


def reference(body: bytes) -> list[SseEvent]:
    """The events of a whole ``body`` by the module's rules, read line by line (no fast path)."""
    body = body.removeprefix(b"\xef\xbb\xbf")
    lines = _LINE_END.split(body)[:-1]  # the part after the last line end is an unfinished line
    events: list[SseEvent] = []
    data: list[bytes] = []
    name = ""
    for line in lines:
        if not line:
            if data or name:
                events.append((name, b"\n".join(data)))
            data, name = [], ""
        elif not line.startswith(b":"):
            field, colon, value = line.partition(b":")
            value = value[1:] if colon and value.startswith(b" ") else value
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value.decode("utf-8", "replace")
    return events


@settings(max_examples=500, deadline=None)
@given(bom=st.booleans(), tokens=st.lists(st.sampled_from(_TOKENS), max_size=40), data=st.data())
def test_any_body_split_anywhere_even_into_empty_reads_gives_the_standards_events(
    bom: bool, tokens: list[bytes], data: st.DataObject
) -> None:
    body = (b"\xef\xbb\xbf" if bom else b"") + b"".join(tokens)
    # Cuts anywhere, and often right after a "\r" (the CRLF split); a cut drawn twice is an empty read.
    after_cr = [i + 1 for i, byte in enumerate(body) if byte == 13]
    anywhere = st.integers(min_value=0, max_value=len(body))
    where = st.one_of(anywhere, st.sampled_from(after_cr)) if after_cr else anywhere
    cuts = data.draw(st.lists(where, max_size=12), label="cuts")
    cuts += data.draw(st.lists(st.sampled_from(cuts), max_size=4), label="empty reads") if cuts else []
    bounds = [0, *sorted(cuts), len(body)]
    pieces = [body[start:end] for start, end in itertools.pairwise(bounds)]
    assert decode(pieces) == reference(body), pieces


def test_an_empty_read_between_the_cr_and_the_lf_of_a_line_end_changes_nothing() -> None:
    # The "\r" ended its line; the "\n" after the empty read is still its pair, not a blank line.
    assert decode([b"data: a\r", b"", b"\ndata: b\r\n\r\n"]) == [("", b"a\nb")]
