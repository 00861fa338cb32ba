"""The calls explorer's store query: keyset pages, filters, attempts, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.calls_filters import CALL_OUTCOMES, MAX_CALLS_LIMIT, decode_cursor, encode_cursor
from hedgerow.controller.errors import UnknownRoute
from hedgerow.controller.store.calls_query import recent_calls, retention_note
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings
from tests.controller.calls_seed import OUTCOME_CYCLE, WINNER_OF, explorer_records, record_of, with_clients

END = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


async def _ingest(sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord]) -> None:
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(Settings()))


async def _all_pages(sessionmaker: async_sessionmaker[AsyncSession], limit: int, **filters: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    after = None
    while True:
        async with sessionmaker() as session:
            page = await recent_calls(session, "r", "m1", limit=limit, after=after, **filters)
        pages.append([call["request_id"] for call in page.calls])
        if page.next_cursor is None:
            return pages
        after = decode_cursor(page.next_cursor)
        assert len(pages) < 100, "paging does not end"


async def test_pages_walk_every_call_newest_first_once(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _ingest(sessionmaker, explorer_records(END, 23))
    pages = await _all_pages(sessionmaker, 7)
    assert [len(p) for p in pages] == [7, 7, 7, 2]
    assert [rid for page in pages for rid in page] == [f"c{i:04d}" for i in range(23)]


async def test_a_page_of_exactly_the_rest_has_no_next_cursor(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _ingest(sessionmaker, explorer_records(END, 10))
    assert [len(p) for p in await _all_pages(sessionmaker, 5)] == [5, 5]
    assert [len(p) for p in await _all_pages(sessionmaker, 10)] == [10]


async def test_calls_stored_between_pages_shift_nothing(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """Keyset paging: a newer call stored after page 1 was read neither repeats nor hides a call
    on page 2 (an OFFSET would repeat the last call of page 1)."""
    await _ingest(sessionmaker, explorer_records(END, 10))
    async with sessionmaker() as session:
        first = await recent_calls(session, "r", "m1", limit=4)
    await _ingest(sessionmaker, [record_of("primary_won", "late", END + timedelta(seconds=5))])
    assert first.next_cursor is not None
    async with sessionmaker() as session:
        second = await recent_calls(session, "r", "m1", limit=4, after=decode_cursor(first.next_cursor))
    assert [c["request_id"] for c in first.calls] == ["c0000", "c0001", "c0002", "c0003"]
    assert [c["request_id"] for c in second.calls] == ["c0004", "c0005", "c0006", "c0007"]


async def test_calls_started_at_the_same_instant_are_ordered_by_id_across_pages(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    same = [record_of("primary_won", f"t{i}", END) for i in range(5)]
    await _ingest(sessionmaker, same)
    pages = await _all_pages(sessionmaker, 2)
    flat = [rid for page in pages for rid in page]
    assert sorted(flat) == [f"t{i}" for i in range(5)] and len(set(flat)) == 5
    assert [len(p) for p in pages] == [2, 2, 1]


@pytest.mark.parametrize("outcome", list(CALL_OUTCOMES))
async def test_the_outcome_filter_gives_exactly_the_calls_of_that_outcome(
    sessionmaker: async_sessionmaker[AsyncSession], outcome: str
) -> None:
    await _ingest(sessionmaker, explorer_records(END, 20))
    async with sessionmaker() as session:
        page = await recent_calls(session, "r", "m1", limit=50, outcome=outcome)
    index = OUTCOME_CYCLE.index(outcome)
    assert [c["request_id"] for c in page.calls] == [f"c{i:04d}" for i in range(index, 20, 5)]
    assert {c["outcome"] for c in page.calls} == {outcome}
    assert {c["winner_upstream"] for c in page.calls} == {WINNER_OF[outcome]}


async def test_the_winner_filter_names_the_upstream_whose_attempt_won(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await _ingest(sessionmaker, explorer_records(END, 20))
    async with sessionmaker() as session:
        backup_b = await recent_calls(session, "r", "m1", winner="b")
        primary_a = await recent_calls(session, "r", "m1", winner="a", outcome="primary_won")
        nobody = await recent_calls(session, "r", "m1", winner="zzz")
    assert {c["outcome"] for c in backup_b.calls} == {"hedge_won"} and len(backup_b.calls) == 4
    assert len(primary_a.calls) == 4 and nobody.calls == [] and nobody.next_cursor is None
    # a calls a lost to b: a appears in its attempts but is not the winner
    assert all(c["attempts"][0]["upstream"] == "a" for c in backup_b.calls)


async def test_the_client_filter_keeps_the_calls_of_one_client_exactly(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """Calls of gateway keys ``alice`` and ``Alice`` and calls without a client: ``client`` matches
    exactly (case too), pages on, and combines with the other filters."""
    await _ingest(sessionmaker, with_clients(explorer_records(END, 12), ["alice", "Alice", None]))
    async with sessionmaker() as session:
        first = await recent_calls(session, "r", "m1", limit=2, client="alice")
        assert first.next_cursor is not None
        rest = await recent_calls(session, "r", "m1", client="alice", after=decode_cursor(first.next_cursor))
        upper = await recent_calls(session, "r", "m1", client="Alice", outcome="hedge_won")
        nobody = await recent_calls(session, "r", "m1", client="ali")
    alice = [c["request_id"] for c in [*first.calls, *rest.calls]]
    assert alice == ["c0000", "c0003", "c0006", "c0009"]
    assert {c["client"] for c in [*first.calls, *rest.calls]} == {"alice"}
    assert [c["request_id"] for c in upper.calls] == ["c0001"]  # of c0001, c0004, c0007, c0010
    assert nobody.calls == []


async def test_since_and_until_bound_the_window_inclusively(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _ingest(sessionmaker, explorer_records(END, 30))
    async with sessionmaker() as session:
        page = await recent_calls(
            session, "r", "m1", since=END - timedelta(minutes=12), until=END - timedelta(minutes=3)
        )
    assert [c["request_id"] for c in page.calls] == [f"c{i:04d}" for i in range(3, 13)]


async def test_each_call_carries_its_attempts_in_start_order(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _ingest(
        sessionmaker, [record_of("hedge_won", "h", END), record_of("failover", "f", END - timedelta(seconds=1))]
    )
    async with sessionmaker() as session:
        page = await recent_calls(session, "r", "m1")
    hedge, failover = page.calls
    assert hedge["started_at"] == "2026-12-03T12:00:00.000000Z"
    assert hedge["outcome"] == "hedge_won" and hedge["winner"] == "backup" and hedge["winner_upstream"] == "b"
    primary, backup = hedge["attempts"]
    assert (primary["upstream"], primary["role"], primary["outcome"], primary["censored"]) == (
        "a",
        "primary",
        "cancelled",
        True,
    )
    assert primary["ttft_s"] is None and primary["end_s"] == 1.3
    assert (backup["upstream"], backup["role"], backup["outcome"], backup["censored"]) == ("b", "backup", "won", False)
    assert backup["start_s"] == 1.0 and backup["ttft_s"] == pytest.approx(0.3) and backup["completion_tokens"] == 20
    assert backup["prompt_tokens"] == 100  # estimated from the call's at ingest (a 2xx answer)
    assert failover["outcome"] == "failover" and failover["hedge_reason"] == "primary_error"
    assert failover["attempts"][0]["error_type"] == "http_503" and failover["attempts"][0]["status_code"] == 503


async def test_pages_cross_day_partitions(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """Calls over three UTC days (three partitions on PostgreSQL) page in one order."""
    records = [record_of("primary_won", f"d{i:02d}", END - timedelta(hours=7 * i)) for i in range(10)]
    await _ingest(sessionmaker, records)
    pages = await _all_pages(sessionmaker, 3)
    assert [rid for page in pages for rid in page] == [f"d{i:02d}" for i in range(10)]


async def test_other_routes_and_models_are_left_out(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _ingest(
        sessionmaker,
        [
            record_of("primary_won", "mine", END),
            record_of("primary_won", "other-model", END, model="m2"),
            record_of("primary_won", "other-route", END, route="q"),
        ],
    )
    async with sessionmaker() as session:
        page = await recent_calls(session, "r", "m1")
    assert [c["request_id"] for c in page.calls] == ["mine"]


async def test_bad_arguments_are_refused_by_name(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _ingest(sessionmaker, explorer_records(END, 1))
    async with sessionmaker() as session:
        with pytest.raises(UnknownRoute):
            await recent_calls(session, "nope", "m1")
        with pytest.raises(ValueError, match="limit: must be from 1 to 500"):
            await recent_calls(session, "r", "m1", limit=MAX_CALLS_LIMIT + 1)
        with pytest.raises(ValueError, match="outcome: unknown outcome 'won'"):
            await recent_calls(session, "r", "m1", outcome="won")
        with pytest.raises(ValueError, match="since: must not be after until"):
            await recent_calls(session, "r", "m1", since=END, until=END - timedelta(seconds=1))


def test_cursors_round_trip_and_junk_is_refused() -> None:
    moment = datetime(2026, 12, 3, 12, 0, 0, 123456, tzinfo=UTC)
    assert decode_cursor(encode_cursor(moment, 42)) == (moment, 42)
    for junk in ["", "x", "!!!", encode_cursor(moment, 1)[:-3], "a" * 500]:
        with pytest.raises(ValueError, match="not a cursor"):
            decode_cursor(junk)


def test_the_retention_note_speaks_only_for_windows_older_than_retention() -> None:
    now = END
    assert retention_note(None, now, 86_400 * 14) is None
    assert retention_note(now - timedelta(days=13), now, 86_400 * 14) is None
    note = retention_note(now - timedelta(days=15), now, 86_400 * 14)
    assert note is not None and "kept 14 days" in note and "2026-11-19 12:00 UTC" in note
    assert "6 hours" in (retention_note(now - timedelta(days=1), now, 6 * 3600) or "")
    assert retention_note(now - timedelta(days=1), now, 1e300) is None


async def test_a_filtered_page_examines_at_most_max_scan_calls_and_goes_on_from_there(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """Only calls 12 and older fail: with a bound of 5 calls examined a page, the first pages
    are empty with a cursor that moves 5 calls back each time, and every failed call is found."""
    records = [record_of("primary_won", f"c{i:02d}", END - timedelta(minutes=i)) for i in range(12)]
    records += [record_of("failed", f"c{i:02d}", END - timedelta(minutes=i)) for i in range(12, 20)]
    await _ingest(sessionmaker, records)
    found: list[str] = []
    stops: list[str | None] = []
    after = None
    for _ in range(20):
        async with sessionmaker() as session:
            page = await recent_calls(session, "r", "m1", limit=3, after=after, outcome="failed", max_scan=5)
        found += [c["request_id"] for c in page.calls]
        stops.append(page.scan_stopped_at)
        if page.next_cursor is None:
            break
        after = decode_cursor(page.next_cursor)
    assert found == [f"c{i:02d}" for i in range(12, 20)]
    assert stops[:2] == ["2026-12-03T11:56:00.000000Z", "2026-12-03T11:51:00.000000Z"]  # c04, c09: 5 calls each
    assert stops[-1] is None
    async with sessionmaker() as session:  # without a filter the page is the scan: no bound applies
        plain = await recent_calls(session, "r", "m1", limit=5, max_scan=5)
        with pytest.raises(ValueError, match="max_scan: must be at least limit"):
            await recent_calls(session, "r", "m1", limit=6, max_scan=5)
    assert len(plain.calls) == 5 and plain.scan_stopped_at is None
    assert plain.next_cursor is not None and decode_cursor(plain.next_cursor)[0] == END - timedelta(minutes=4)
