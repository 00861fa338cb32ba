"""``POST /v1/calls`` parses a batch a slice at a time, with the same answers as in one piece.

``parse_batch_yielding`` (the endpoint's parser) validates records ``VALIDATE_SLICE`` at a time
and yields to the event loop in between; ``parse_batch`` validates the whole body at once. Both
must take the same batches and refuse every bad one with the same 413/422 (status, field,
index, message), whatever the mistake and wherever in the batch it is.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from fastapi.responses import JSONResponse

from hedgerow.api.calls import VALIDATE_SLICE, parse_batch, parse_batch_yielding
from hedgerow.controller.store.cpu_turns import CpuTurns
from tests.conftest import make_call

MAX_CALLS = 1000


def batch(n: int) -> list[dict[str, Any]]:
    """``n`` valid records (dicts of the wire format)."""
    return [make_call(f"req-{i}").to_dict() for i in range(n)]


def answer_of(result: Any) -> Any:
    """What a client sees of a parse: the answer's status and body, or the records taken."""
    if isinstance(result, JSONResponse):
        return result.status_code, json.loads(bytes(result.body))
    return [record.model_dump() for record in result.calls]


def both(body: bytes) -> tuple[Any, Any]:
    return answer_of(parse_batch(body, MAX_CALLS)), answer_of(asyncio.run(parse_batch_yielding(body, MAX_CALLS)))


def with_change(index: int, path: tuple[str | int, ...], value: Any, n: int = 2 * VALIDATE_SLICE + 7) -> bytes:
    """A batch of ``n`` records whose record ``index`` has ``value`` at ``path`` (``...``: removed)."""
    calls = batch(n)
    target: Any = calls[index]
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps({"calls": calls}).encode()


def test_a_good_batch_gives_the_same_records() -> None:
    one, sliced = both(json.dumps({"calls": batch(2 * VALIDATE_SLICE + 7)}).encode())
    assert isinstance(one, list) and len(one) == 2 * VALIDATE_SLICE + 7 and one == sliced


@pytest.mark.parametrize("index", [0, VALIDATE_SLICE - 1, VALIDATE_SLICE, 2 * VALIDATE_SLICE + 6])
@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("ttft_s",), "fast"),
        (("ttft_s",), -1.0),
        (("completion_tokens",), 1.5),
        (("completion_tokens",), True),
        (("started_at",), "yesterday"),
        (("started_at",), "2026-11-29T08:00:00"),
        (("route",), "a\u202eb"),
        (("route",), None),
        (("request_id",), ...),
        (("colour",), "red"),
        (("attempts", 0, "outcome"), "maybe"),
        (("attempts", 0, "start_s"), "0"),
        (("hedged",), "yes"),
    ],
)
def test_a_bad_record_gets_the_same_answer_wherever_it_is(index: int, path: tuple[str | int, ...], value: Any) -> None:
    one, sliced = both(with_change(index, path, value))
    assert isinstance(one, tuple) and one[0] in (413, 422)
    assert sliced == one


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"[]",
        b'{"calls": {}}',
        b'{"calls": [], "extra": 1}',
        b'{"calls": [1]}',
        b'{"calls": [NaN]}',
        b'{"calls": [{"ttft_s": 1e999}]}',
        json.dumps({"calls": batch(3)}).encode().replace(b'"req-1"', b'"req-\\ud800"'),
        json.dumps({"calls": [{}] * (MAX_CALLS + 1)}).encode(),
    ],
)
def test_a_bad_shape_gets_the_same_answer(body: bytes) -> None:
    one, sliced = both(body)
    assert sliced == one


def test_the_event_loop_runs_between_slices() -> None:
    # A ticker every millisecond, and a 1,000-record batch parsed beside it: in one piece the
    # ticker waits for the whole validation; a slice at a time it runs between slices.
    body = json.dumps({"calls": batch(1000)}).encode()

    async def ticks_during(parse: Any) -> int:
        count = 0
        done = False

        async def ticker() -> None:
            nonlocal count
            while not done:
                await asyncio.sleep(0)
                count += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        started = time.perf_counter()
        await parse()
        assert time.perf_counter() - started < 60
        done = True
        await task
        return count

    async def whole() -> None:
        parse_batch(body, MAX_CALLS)

    async def sliced() -> None:
        await parse_batch_yielding(body, MAX_CALLS)

    assert asyncio.run(ticks_during(whole)) <= 2
    assert asyncio.run(ticks_during(sliced)) >= 1000 // VALIDATE_SLICE - 1


def test_batches_parsed_within_one_turn_take_it_in_turn_and_still_free_the_loop() -> None:
    # two 500-record batches at once with one CPU turn: the second waits for the first to be
    # validated, and the loop runs other tasks between every slice of both
    bodies = [json.dumps({"calls": batch(500)}).encode().replace(b'"req-', prefix) for prefix in (b'"a-', b'"b-')]

    async def run() -> tuple[list[Any], CpuTurns, int]:
        turns = CpuTurns(1)
        count = 0
        done = False

        async def ticker() -> None:
            nonlocal count
            while not done:
                await asyncio.sleep(0)
                count += 1

        task = asyncio.create_task(ticker())
        parsed = await asyncio.gather(*(parse_batch_yielding(body, MAX_CALLS, turns) for body in bodies))
        done = True
        await task
        return list(parsed), turns, count

    parsed, turns, ticks = asyncio.run(run())
    assert [answer_of(p) for p in parsed] == [answer_of(parse_batch(body, MAX_CALLS)) for body in bodies]
    assert (turns.taken, turns.waited) == (2, 1)
    assert ticks >= 2 * (500 // VALIDATE_SLICE) - 2
