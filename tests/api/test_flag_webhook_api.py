"""``serve`` posts its ticks' flag changes to ``HEDGEROW_FLAG_WEBHOOK_URL`` (a real receiver)."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.api.conftest import MakeApi
from tests.conftest import CallFactory
from tests.controller.flag_workload import slow_backup_calls
from tests.controller.webhook_receiver import WebhookReceiver


async def test_serve_posts_a_ticks_flag_changes_once(make_api: MakeApi, call_factory: CallFactory) -> None:
    """Through the api: records in, ``POST /v1/controller/run`` (the lease holder's tick), one post;
    a second tick with the same flags posts nothing more."""
    now = datetime.now(UTC)
    records = slow_backup_calls(call_factory, "api-slow-backup", now, seed=11)
    with WebhookReceiver() as receiver:
        async with make_api(flag_webhook_url=receiver.url, report_webhook_format="json") as (app, api):
            body = {"calls": [r.to_dict() for r in records]}
            assert (await api.post("/v1/calls", json=body)).json()["accepted"] == 300
            assert (await api.post("/v1/controller/run")).json()["ran"] is True
            await app.state.scheduler.flag_webhook.drain(timeout_s=10)
            assert (await api.post("/v1/controller/run")).json()["ran"] is True
            await app.state.scheduler.flag_webhook.drain(timeout_s=10)
        [posted] = receiver.delivered
    flags = {(c["route"], c["flag"], c["change"]) for c in posted["changes"]}
    assert ("chat", "backups_rarely_win", "raised") in flags
