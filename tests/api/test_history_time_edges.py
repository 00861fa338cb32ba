"""``since``/``until`` at the calendar's edges: a 422 naming the parameter, never a 500.

A time such as ``0001-01-01T00:00+05:00`` or ``9999-12-31T23:59-05:00`` is valid ISO 8601 but has
no UTC equivalent within years 1..9999; the history api and the console's route page answered 500.
"""

from __future__ import annotations

import pytest

from tests.api.conftest import MakeApi

M = {"model": "m1"}
OVERFLOWING = ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"]
EDGES = ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00-05:00"]


@pytest.mark.parametrize("name", ["since", "until"])
async def test_times_past_the_calendar_in_utc_are_422_naming_the_parameter(make_api: MakeApi, name: str) -> None:
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        for text in OVERFLOWING:
            answer = await api.get("/v1/routes/r/history", params=M | {name: text})
            assert answer.status_code == 422, (text, answer.text)
            assert answer.json()["detail"]["field"] == name and "out of range" in answer.json()["detail"]["message"]
            page = await api.get("/ui/routes/r", params=M | {name: text})
            assert page.status_code == 422 and f"{name}: out of range" in page.text, (text, page.status_code)
        for text in EDGES:  # at the edge but within the calendar in UTC: answered
            answer = await api.get("/v1/routes/r/history", params=M | {name: text})
            assert answer.status_code == 200, (text, answer.text)
            assert (await api.get("/ui/routes/r", params=M | {name: text})).status_code == 200, text
