"""The official ``openai`` npm package under Node against the gateway, with nothing set but its
``baseURL`` and ``apiKey`` (the scripts in ``tests/gateway/node/``): chat and Responses, streamed
and not, in front of a slow primary and a fast backup, the backup's text arrives and
``X-Hedgerow-Winner`` names it; and end to end with ``--api`` of a real ``hedgerow serve``, the
call's one record is in the store and its route on the console.

Needs ``node`` on the PATH and ``npm ci --prefix tests/gateway/node`` done (``.ci/run`` does it);
otherwise every test here is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hedgerow.sim import ReplicaThread
from tests.gateway.conftest import FAKE_UPSTREAM_KEY, GatewayServer
from tests.gateway.test_cli import Gateway, write_config
from tests.serve_process import ServeProcess

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE = shutil.which("node")
#: Seconds one Node script may take (start-up, the race, the stream).
SCRIPT_TIMEOUT_S = 90

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed (the Node SDK tests need Node 20+ and npm)"),
    pytest.mark.skipif(
        not (NODE_DIR / "node_modules" / "openai").is_dir(),
        reason="tests/gateway/node/node_modules is missing: run `npm ci --prefix tests/gateway/node`",
    ),
]


def run_script(script: str, base_url: str, model: str = "gpt-fast", api_key: str = "caller-key") -> dict[str, Any]:
    """Run ``node tests/gateway/node/SCRIPT base_url model`` and return the JSON line it printed.

    Raises:
        AssertionError: the script exited non-zero or printed no JSON line (its stderr is shown).
    """
    assert NODE is not None
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "HEDGEROW_"))}
    environment["OPENAI_API_KEY"] = api_key
    done = subprocess.run(
        [NODE, str(NODE_DIR / script), base_url, model],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        cwd=NODE_DIR,
        env=environment,
        check=False,
    )
    assert done.returncode == 0, f"node {script} exited {done.returncode}: {done.stderr}"
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    return dict(json.loads(lines[0]))


@pytest.mark.parametrize(
    ("script", "api", "stream"),
    [
        ("chat_stream.mjs", "chat", True),
        ("chat.mjs", "chat", False),
        ("responses_stream.mjs", "responses", True),
        ("responses.mjs", "responses", False),
    ],
)
def test_node_sdk_call_is_won_by_the_backup(
    hedging_gateway: GatewayServer, script: str, api: str, stream: bool
) -> None:
    """The slow primary is passed over: the fast backup's text reaches the Node SDK, and the
    headers it exposes name the backup as the winner of a hedged race."""
    out = run_script(script, hedging_gateway.base_url)
    assert (out["api"], out["stream"], out["status"]) == (api, stream, 200)
    assert out["text"], out  # the fast replica's answer (the slow one's first token is seconds away)
    headers = out["headers"]
    assert headers["x-hedgerow-winner"] == "fast", out
    assert headers["x-hedgerow-hedged"] == "true", out
    assert headers["x-hedgerow-request-id"], out
    expected_type = "text/event-stream" if stream else "application/json"
    assert headers["content-type"].startswith(expected_type), out


def test_node_script_exits_non_zero_on_an_error(hedging_gateway: GatewayServer) -> None:
    """An unknown model is the SDK's NotFoundError: the script says so and exits 1 (so a broken
    gateway can never pass the tests above with an empty line)."""
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(NODE_DIR / "chat.mjs"), hedging_gateway.base_url, "gpt-nope"],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        cwd=NODE_DIR,
        env={**os.environ, "OPENAI_API_KEY": "caller-key"},
        check=False,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "NotFoundError (HTTP 404)" in done.stderr and done.stdout == ""


@pytest.mark.slow
def test_node_sdk_through_the_gateway_into_the_store(
    tmp_path: Path, replicas: tuple[ReplicaThread, ReplicaThread]
) -> None:
    """End to end: ``hedgerow gateway FILE --api URL`` of a real ``hedgerow serve``; after one
    streamed Node chat call the store holds that one call (won by the backup, hedged), ``GET
    /v1/routes`` lists its route and the console's routes page shows it."""
    slow, fast = replicas
    config = write_config(tmp_path, slow.base_url, fast.base_url)  # route "cli-route", model "gpt-fast"
    db_path = tmp_path / "store.db"
    served = ServeProcess(f"sqlite:///{db_path}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        with Gateway(str(config), "--api", served.url, SLOW_KEY=FAKE_UPSTREAM_KEY) as gateway:
            out = run_script("chat_stream.mjs", gateway.base_url)
        assert gateway.proc.returncode == 130, gateway.stderr  # SIGINT after a clean shutdown (records flushed)
        assert out["text"] and out["headers"]["x-hedgerow-winner"] == "fast", out
        request_id = out["headers"]["x-hedgerow-request-id"]

        with httpx.Client(base_url=served.url, timeout=30) as api:
            deadline = time.monotonic() + 30
            routes: list[dict[str, Any]] = []
            while time.monotonic() < deadline:  # the exporter's batch is written before the gateway exits
                routes = api.get("/v1/routes").json()["routes"]
                if routes:
                    break
                time.sleep(0.2)
            assert [(r["route"], r["model"]) for r in routes] == [("cli-route", "gpt-fast")], routes
            page = api.get("/ui/routes")
            assert page.status_code == 200 and "cli-route" in page.text

        with sqlite3.connect(db_path) as db:
            calls = db.execute("SELECT request_id, winner, hedged, status, api FROM calls").fetchall()
        assert calls == [(request_id, "backup", 1, "ok", "chat")], calls
    finally:
        served.stop()
