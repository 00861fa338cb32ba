"""Probe p4 of ``bench/safety_probes.py``: the exporter loses no record across a token rotation.

``serve`` starts on a fixed port with token A (scope ``ingest``). A client's
``hedgerow.client.telemetry.TelemetryExporter`` with token A submits ``--rate`` records per second
for ``--send-seconds``. A quarter of the way in, ``serve`` is stopped and started again on the same
port and store with token B only; the client is given token B 3 s after the new ``serve`` is up,
so its posts meet a closed port and then 401s meanwhile. At the end the exporter is flushed and
closed, and the calls in the store are counted against the records submitted.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from safety_probes_common import ProbeResult, Serve, count_calls, fresh_store, store_kind

from hedgerow.client.telemetry import TelemetryExporter
from tests.conftest import make_call

TOKEN_A = "safety-probe-token-a-0123456789abcdef"
TOKEN_B = "safety-probe-token-b-fedcba9876543210"
LAG_S = 3.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def send_through_rotation(url: str, workdir: Path, rate: int, send_s: float) -> dict[str, Any]:
    """Submit records while ``serve`` restarts with a new token; returns the counts and the timeline (s from start)."""
    port = free_port()
    old = Serve(url, workdir, "p4_a", env={"HEDGEROW_TOKENS": f"{TOKEN_A}:ingest"}, port=port)
    base = await asyncio.to_thread(old.started)
    new: list[Serve] = []
    timeline: dict[str, float] = {}
    exporter = TelemetryExporter(base, token=TOKEN_A, batch_size=200, flush_interval_s=0.5, close_timeout_s=60.0)
    exporter.start()
    start = time.monotonic()

    async def rotate() -> None:
        await asyncio.sleep(send_s / 4)
        await asyncio.to_thread(old.stop)
        timeline["old_serve_stopped_s"] = round(time.monotonic() - start, 2)
        second = Serve(url, workdir, "p4_b", env={"HEDGEROW_TOKENS": f"{TOKEN_B}:ingest"}, port=port)
        new.append(second)
        await asyncio.to_thread(second.started)
        timeline["new_serve_up_s"] = round(time.monotonic() - start, 2)
        await asyncio.sleep(LAG_S)
        exporter.set_token(TOKEN_B)
        timeline["client_token_changed_s"] = round(time.monotonic() - start, 2)

    rotation = asyncio.create_task(rotate())
    submitted = 0
    try:
        while (elapsed := time.monotonic() - start) < send_s:
            while submitted < int(elapsed * rate):
                exporter.submit(make_call(f"p4-{uuid.uuid4().hex}", route="rotation"))
                submitted += 1
            await asyncio.sleep(0.02)
        timeline["sending_stopped_s"] = round(time.monotonic() - start, 2)
        await rotation
        flushed = await exporter.flush(timeout_s=120)
        await exporter.aclose()
    finally:
        for serve in [old, *new]:
            await asyncio.to_thread(serve.stop)
    return {
        "submitted": submitted,
        "flushed": flushed,
        "exporter_dropped": exporter.dropped,
        "exporter_by_reason": exporter.dropped_by_reason,
        "timeline": timeline,
    }


def probe_rotation(args: argparse.Namespace, workdir: Path) -> list[ProbeResult]:
    """Run the rotation on the store of ``args.db``; one result (records lost)."""
    with fresh_store(args.db, workdir, "p4") as url:
        detail = asyncio.run(send_through_rotation(url, workdir, args.rate, args.send_seconds))
        detail["stored"] = count_calls(url)
    detail["lost"] = detail["submitted"] - detail["stored"]
    return [
        ProbeResult(
            probe="p4 token rotation",
            store=store_kind(args.db),
            figure=f"{detail['lost']} lost of {detail['submitted']} submitted",
            target="0 lost",
            passed=detail["lost"] == 0 and detail["submitted"] > 0,
            detail=detail,
        )
    ]
