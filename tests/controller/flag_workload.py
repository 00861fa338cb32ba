"""A workload that makes the controller flag ``backups_rarely_win``: hedged calls whose backups never win."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from hedgerow.client.records import CallRecord
from tests.conftest import CallFactory


def slow_backup_calls(
    call_factory: CallFactory, prefix: str, now: datetime, seed: int, n: int = 300
) -> list[CallRecord]:
    """``n`` calls of route ``chat`` over the 25 min before ``now``: the primary answers in
    0.3 s + Exp(mean 0.5 s), a backup starts at 0.25 s and answers 5 s later, so it never wins."""
    rng = random.Random(seed)
    return [
        call_factory(
            f"{prefix}-{i}",
            route="chat",
            started_at=now - timedelta(seconds=rng.uniform(5.0, 1500.0)),
            primary_ttft_s=0.3 + rng.expovariate(2.0),
            hedge_after_s=0.25,
            backup_ttft_s=5.0,
        )
        for i in range(n)
    ]
