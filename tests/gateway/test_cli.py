"""``hedgerow gateway`` as a subprocess: a bad config exits 2 naming the file and key path; off
loopback without keys it refuses to start; a config file in front of a slow and a fast replica
serves the openai SDK (the fast one wins), its log never shows the upstream key, and with
``--api`` the records are posted to the api."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from hedgerow.sim import ReplicaThread
from tests.client.scripted_server import Script, ScriptedServer
from tests.gateway.conftest import FAKE_UPSTREAM_KEY
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")}
    out["PYTHONPATH"] = str(ROOT)
    out.update(extra)
    return out


def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "gateway", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(**extra_env),
        check=False,
    )


class Gateway:
    """``hedgerow gateway ARGS`` running until the end of the ``with`` (SIGINT, then waited)."""

    def __init__(self, *args: str, **extra_env: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hedgerow.cli", "gateway", *args, "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(**extra_env),
        )
        self.stdout = self.stderr = ""
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Gateway:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the gateway did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.stdout, self.stderr = self.proc.communicate(timeout=30)


def write_config(tmp_path: Path, slow: str, fast: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
[models."gpt-fast"]
route = "cli-route"
hedge_after_s = 0.3
budget = 1.0

[[models."gpt-fast".upstreams]]
name = "slow"
base_url = "{slow}"
api_key_env = "SLOW_KEY"
model = "slow-model"

[[models."gpt-fast".upstreams]]
name = "fast"
base_url = "{fast}"
"""
    )
    return path


@pytest.fixture(scope="module")
def config_file(tmp_path_factory, replicas: tuple[ReplicaThread, ReplicaThread]) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    slow, fast = replicas
    yield write_config(tmp_path_factory.mktemp("gw"), slow.base_url, fast.base_url)


def test_a_bad_config_file_exits_2_naming_file_and_key_path(tmp_path: Path, config_file: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(config_file.read_text().replace('name = "fast"\nbase_url = "', 'name = "fast"\nbase_url = "x'))
    done = run(str(bad), SLOW_KEY=FAKE_UPSTREAM_KEY)
    assert done.returncode == 2
    assert done.stderr.startswith(f"hedgerow: {bad}: models.gpt-fast.upstreams[1].base_url: must be an http(s) URL")
    missing = run(str(config_file))
    assert missing.returncode == 2
    assert "models.gpt-fast.upstreams[0].api_key_env: the environment variable SLOW_KEY is not set" in missing.stderr
    assert run().returncode == 2


def test_off_loopback_without_keys_refuses_to_start(config_file: Path) -> None:
    done = run(str(config_file), "--host", "0.0.0.0", SLOW_KEY=FAKE_UPSTREAM_KEY)
    assert done.returncode == 2
    assert "off loopback the gateway needs keys" in done.stderr


def test_tokens_with_the_gateway_scope_are_keys_and_off_loopback_one_is_required(
    replicas: tuple[ReplicaThread, ReplicaThread],
) -> None:
    _, fast = replicas
    flags = ("--upstream", f"fast={fast.base_url}", "--host", "0.0.0.0")
    ingest_only = run(*flags, HEDGEROW_TOKENS="tok-ingest-only-0123456789:ingest+read")
    assert ingest_only.returncode == 2 and "off loopback the gateway needs keys" in ingest_only.stderr
    short = run(*flags, HEDGEROW_TOKENS="gw-short:gateway")
    assert short.returncode == 2
    assert "HEDGEROW_TOKENS: token 1 has the gateway scope and 8 characters, fewer than 16" in short.stderr
    assert "gw-short" not in short.stderr
    per_key = run(*flags, "--max-concurrent-per-key", "0", HEDGEROW_TOKENS="tok-gateway-0123456789ab:gateway")
    assert per_key.returncode == 2 and "--max-concurrent-per-key: must be 1 or more" in per_key.stderr
    token = "tok-gateway-0123456789ab"
    with Gateway(*flags, HEDGEROW_TOKENS=f"ci={token}:gateway,tok-read-0123456789abcd:read") as gateway:
        chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
        url = gateway.base_url + "/chat/completions"
        assert httpx.post(url, json=chat, timeout=30).status_code == 401
        read_only = {"Authorization": "Bearer tok-read-0123456789abcd"}
        assert httpx.post(url, json=chat, headers=read_only, timeout=30).status_code == 401
        answer = httpx.post(url, json=chat, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert answer.status_code == 200 and answer.headers["x-hedgerow-winner"] == "fast"
    assert "client=ci" in gateway.stderr  # the token's name is the record's caller
    assert token not in gateway.stdout + gateway.stderr


def test_a_config_file_serves_the_sdk_and_hides_the_key(config_file: Path) -> None:
    key = "gw-cli-key-0123456789abcdef"
    with Gateway(str(config_file), SLOW_KEY=FAKE_UPSTREAM_KEY, HEDGEROW_GATEWAY_KEYS=f"tests={key}") as gateway:
        with openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-fast", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=5
            )
            assert raw.headers["x-hedgerow-winner"] == "fast"
            assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        with (
            openai.OpenAI(base_url=gateway.base_url, api_key="wrong-key", max_retries=0) as client,
            pytest.raises(openai.AuthenticationError),
        ):
            client.models.list()
    assert gateway.proc.returncode == 130, gateway.stderr  # SIGINT, after a clean shutdown
    assert "listening on" in gateway.stdout and "/v1 (1 model)" in gateway.stdout, gateway.stdout
    assert "gateway_call" in gateway.stderr and "winner=backup" in gateway.stderr
    assert FAKE_UPSTREAM_KEY not in gateway.stdout + gateway.stderr
    assert key not in gateway.stdout + gateway.stderr


async def test_upstream_flags_and_api_records(replicas: tuple[ReplicaThread, ReplicaThread]) -> None:
    import asyncio

    _, fast = replicas
    accepted = Script(status=202, content_type="application/json", pieces=[(0, b'{"accepted": 1}')])
    async with ScriptedServer(accepted) as api:
        args = ("--upstream", f"fast={fast.base_url}", "--api", api.base_url.removesuffix("/v1"))
        gateway = await asyncio.to_thread(Gateway(*args).__enter__)
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                models = await http.get(gateway.base_url + "/models")  # any model: passed to the primary
                assert models.status_code == 200 and models.headers["x-hedgerow-winner"] == "fast"
                answer = await http.post(
                    gateway.base_url + "/chat/completions",
                    json={"model": "anything", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
                )
                assert answer.status_code == 200 and answer.headers["x-hedgerow-winner"] == "fast"
        finally:
            await asyncio.to_thread(gateway.__exit__)
    posted = [r for r in api.requests if r.path == "/v1/calls"]
    assert posted, [r.path for r in api.requests]
    calls = [c for r in posted for c in (r.body or {}).get("calls", [])]
    assert [(c["route"], c["model"]) for c in calls] == [("default.unary", "anything")]
    assert gateway.proc.returncode == 130
    assert json.dumps(calls).count("fast") >= 1
    assert "/v1 (any model)" in gateway.stdout, gateway.stdout


def test_an_idle_caller_connection_outlives_the_clients_keep_alive(config_file: Path) -> None:
    """The gateway keeps an idle connection open past httpx's 5 s keep-alive (uvicorn's default
    would close it at 5 s, and a request sent at that moment failed): the caller ends it."""
    with Gateway(str(config_file), SLOW_KEY=FAKE_UPSTREAM_KEY) as gateway:
        limits = httpx.Limits(keepalive_expiry=60.0)
        with httpx.Client(timeout=30, limits=limits) as http:
            seen: list[tuple[str, int] | None] = []

            def note(response: httpx.Response) -> None:  # the local address of the connection used
                stream = response.extensions.get("network_stream")
                seen.append(stream.get_extra_info("client_addr") if stream is not None else None)

            http.event_hooks["response"] = [note]
            assert http.get(gateway.base_url + "/models").status_code == 200
            time.sleep(6.5)
            assert http.get(gateway.base_url + "/models").status_code == 200
    assert seen[0] is not None and seen == [seen[0], seen[0]]  # the same connection, still open
