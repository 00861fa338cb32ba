"""``hedgerow serve --gateway FILE``: one process with the store, the controller, the console and
the gateway. The gateway hedges (slow primary, fast backup), its records reach this api's store,
the route shows on the console, its ``hedgerow_gateway_*`` metrics are served at the gateway's
``/metrics`` and at the api's, and one SIGTERM stops both servers (the lease released)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from hedgerow.sim import ReplicaThread
from tests.gateway.conftest import FAKE_UPSTREAM_KEY
from tests.gateway.test_cli import env, write_config
from tests.helpers import free_port


def test_serve_embeds_the_gateway_and_stores_its_records(
    tmp_path: Path, replicas: tuple[ReplicaThread, ReplicaThread]
) -> None:
    slow, fast = replicas
    config = write_config(tmp_path, slow.base_url, fast.base_url)
    gateway_port = free_port()
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "hedgerow.cli", "serve", "--db", f"sqlite+aiosqlite:///{tmp_path / 's.db'}",
                "--port", "0", "--gateway", str(config), "--gateway-port", str(gateway_port),
            ],
            stdout=stdout,
            stderr=stderr,
            env=env(SLOW_KEY=FAKE_UPSTREAM_KEY),
        )  # fmt: skip
        try:
            api = gateway = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (api is None or gateway is None):
                assert proc.poll() is None, err.read_text()
                text = out.read_text()
                found_api = re.search(r"api listening on (http://127\.0\.0\.1:\d+)", text)
                found_gateway = re.search(r"gateway: listening on (http://127\.0\.0\.1:\d+/v1)", text)
                api = found_api.group(1) if found_api else None
                gateway = found_gateway.group(1) if found_gateway else None
                time.sleep(0.1)
            assert api is not None and gateway == f"http://127.0.0.1:{gateway_port}/v1", out.read_text()
            with openai.OpenAI(base_url=gateway, api_key="unused", max_retries=0) as client:
                raw = client.chat.completions.with_raw_response.create(
                    model="gpt-fast", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=5
                )
                assert raw.headers["x-hedgerow-winner"] == "fast" and raw.headers["x-hedgerow-hedged"] == "true"
                assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            routes: list[tuple[str, str]] = []
            deadline = time.monotonic() + 30  # the exporter flushes every 2 s
            while time.monotonic() < deadline and not routes:
                routes = [(r["route"], r["model"]) for r in httpx.get(f"{api}/v1/routes", timeout=10).json()["routes"]]
                time.sleep(0.3)
            assert routes == [("cli-route", "gpt-fast")]
            page = httpx.get(f"{api}/ui/routes", timeout=10).text
            assert "cli-route" in page and FAKE_UPSTREAM_KEY not in page
            calls = httpx.get(f"{api}/v1/routes/cli-route/calls", params={"model": "gpt-fast"}, timeout=10)
            assert calls.status_code == 200 and FAKE_UPSTREAM_KEY not in calls.text
            # the gateway's own family, served by the embedded gateway's port and by the api's
            labels = 'key="",model="gpt-fast",outcome="ok",route="cli-route",status="200"'
            line = "hedgerow_gateway_requests_total{" + labels + "} 1.0"
            for scrape_url in (f"http://127.0.0.1:{gateway_port}/metrics", f"{api}/metrics"):
                scrape = httpx.get(scrape_url, timeout=10).text
                assert line in scrape, (scrape_url, scrape[-3000:])
                assert "hedgerow_gateway_request_duration_seconds_count" in scrape
                assert FAKE_UPSTREAM_KEY not in scrape
            assert "hedgerow_calls_total" in scrape  # the api's own series are still there
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    log = out.read_text() + err.read_text()
    assert log.count("Finished server process") == 2, log[-2000:]  # the gateway's and the api's
    assert "lease_released" in log
    assert FAKE_UPSTREAM_KEY not in log


def test_serve_with_a_bad_gateway_config_or_busy_port_exits_before_making_a_store(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[models.fast]\nhedge_afer_s = 0.5\nupstreams = [{name = "a", base_url = "http://127.0.0.1:9/v1"}]\n'
    )
    store = tmp_path / "s.db"
    command = [sys.executable, "-m", "hedgerow.cli", "serve", "--db", f"sqlite+aiosqlite:///{store}", "--port", "0"]
    done = subprocess.run(
        [*command, "--gateway", str(bad)], capture_output=True, text=True, timeout=60, env=env(), check=False
    )
    assert done.returncode == 2, done.stderr
    assert "hedge_afer_s" in done.stderr and "cannot serve" not in done.stderr
    good = write_config(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = subprocess.run(
            [*command, "--gateway", str(good), "--gateway-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(SLOW_KEY=FAKE_UPSTREAM_KEY),
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "cannot serve" not in done.stderr
    assert not store.exists()  # refused before the api started: no store was made
