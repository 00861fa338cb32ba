"""Requests refused from their head, through a real ``hedgerow serve`` on loopback.

Forged writes (a cross-site ``text/plain`` or form post, a foreign ``Origin`` or
``Sec-Fetch-Site: cross-site``, a DNS-rebound ``Host``) are refused while the legitimate ones (the
exporter's JSON batch, the CLI's ``routes set``, its body-less ``POST /v1/controller/run``, the
console's own form) work; with tokens, a request without one is answered 401 before its body is
read; a 16 MB body of empty records is refused 413 without the server building it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import CallFactory
from tests.serve_process import peak_rss_bytes, running_serve

MIB = 1024 * 1024
FORM = {
    "enabled": "on",
    "budget": "5%",
    "default_hedge_after_s": "2",
    "min_hedge_after_s": "0.05",
    "max_hedge_after_s": "30",
    "pinned_hedge_after_s": "",
}
EVIL = "http://evil.example:8400"


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'guard.db'}"


def _detail(response: httpx.Response) -> dict[str, Any]:
    detail: dict[str, Any] = response.json()["detail"]
    return detail


async def _routes(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await client.get("/v1/routes")
    assert response.status_code == 200, response.text
    routes: list[dict[str, Any]] = response.json()["routes"]
    return routes


def _cli(api: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")}
    env["HEDGEROW_API_URL"] = api
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


async def test_forged_writes_are_refused_and_legitimate_ones_work(tmp_path: Path, call_factory: CallFactory) -> None:
    records = [call_factory(f"g{i}", route="r").to_dict() for i in range(3)]
    async with running_serve(_sqlite(tmp_path), tmp_path, HEDGEROW_CONTROLLER_INTERVAL_S="3600") as served:
        own = served.base  # http://127.0.0.1:PORT
        async with httpx.AsyncClient(base_url=own, timeout=30) as client:
            # a cross-site text/plain post (no preflight in a browser): refused, nothing stored
            forged = await client.post(
                "/v1/calls",
                content=httpx.Request("POST", own, json={"calls": records}).content,
                headers={"content-type": "text/plain"},
            )
            assert forged.status_code == 415, forged.text
            assert _detail(forged)["field"] == "content-type"
            assert "application/json" in _detail(forged)["message"]
            form_post = await client.post("/v1/controller/run", data={"a": "b"})
            assert form_post.status_code == 415
            assert await _routes(client) == []

            # JSON, but from a page of another site: refused by its Origin / Sec-Fetch-Site
            foreign = await client.post("/v1/calls", json={"calls": records}, headers={"origin": EVIL})
            assert foreign.status_code == 403 and _detail(foreign)["field"] == "origin", foreign.text
            run = await client.post("/v1/controller/run", headers={"origin": "null"})
            assert run.status_code == 403 and _detail(run)["field"] == "origin"
            fetch = await client.post("/v1/controller/run", headers={"sec-fetch-site": "cross-site"})
            assert fetch.status_code == 403 and _detail(fetch)["field"] == "sec-fetch-site"
            assert await _routes(client) == []

            # the exporter's batch (JSON, no Origin) is stored
            stored = await client.post("/v1/calls", json={"calls": records})
            assert stored.status_code == 202, stored.text
            # a body-less POST without a content type (the CLI's controller run) runs
            assert (await client.post("/v1/controller/run")).status_code == 200
            # the same origin (a console page's fetch) is its own
            assert (await client.post("/v1/controller/run", headers={"origin": own})).status_code == 200

            # DNS rebinding: the server addressed by another name; reads and writes refused
            rebound = {"host": f"evil.example:{served.port}"}
            for method, path, kwargs in (
                ("GET", "/v1/routes", {}),
                ("PATCH", "/v1/routes/r", {"params": {"model": "m1"}, "json": {"budget": 0.5}}),
                ("POST", "/ui/routes/r", {"params": {"model": "m1"}, "data": FORM | {"budget": "50%"}}),
            ):
                answer = await client.request(method, path, headers=rebound, **kwargs)
                assert answer.status_code == 400, (method, path, answer.text)
                assert _detail(answer) == {
                    "field": "host",
                    "message": "host not allowed: 'evil.example' (HEDGEROW_ALLOWED_HOSTS)",
                }
            # the console's form, posted from another site: refused
            for headers in ({"origin": EVIL}, {"sec-fetch-site": "cross-site"}):
                answer = await client.post(
                    "/ui/routes/r", params={"model": "m1"}, data=FORM | {"budget": "50%"}, headers=headers
                )
                assert answer.status_code == 403, (headers, answer.text)
            route = (await client.get("/v1/routes/r", params={"model": "m1"})).json()
            assert route["budget"] != 0.5

            # the console's own form (same origin, as a browser sends it) applies
            posted = await client.post(
                "/ui/routes/r",
                params={"model": "m1"},
                data=FORM | {"budget": "7%"},
                headers={"origin": own, "sec-fetch-site": "same-origin"},
            )
            assert posted.status_code == 303, posted.text
            # loopback names with any port are answered
            for name in (f"localhost:{served.port}", "127.0.0.1", f"[::1]:{served.port}"):
                assert (await client.get("/v1/routes", headers={"host": name})).status_code == 200, name

        # the CLI's PATCH (JSON, no Origin) applies
        result = await asyncio.to_thread(_cli, own, "routes", "set", "r", "--model", "m1", "--budget", "0.09")
        assert result.returncode == 0, result.stderr
        async with httpx.AsyncClient(base_url=own, timeout=30) as client:
            route = (await client.get("/v1/routes/r", params={"model": "m1"})).json()
            assert route["budget"] == 0.09


async def test_configured_hosts_and_origins_are_answered(tmp_path: Path) -> None:
    async with (
        running_serve(
            _sqlite(tmp_path),
            tmp_path,
            HEDGEROW_CONTROLLER_INTERVAL_S="3600",
            HEDGEROW_ALLOWED_HOSTS="hedgerow.internal, 10.1.2.3",
            HEDGEROW_ALLOWED_ORIGINS="https://ops.example",
        ) as served,
        httpx.AsyncClient(base_url=served.base, timeout=30) as client,
    ):
        for host in ("hedgerow.internal", "HEDGEROW.internal:8443", "10.1.2.3:80"):
            assert (await client.get("/v1/routes", headers={"host": host})).status_code == 200, host
        assert (await client.get("/v1/routes", headers={"host": "other.internal"})).status_code == 400
        allowed = await client.post(
            "/v1/controller/run", headers={"origin": "https://ops.example", "sec-fetch-site": "cross-site"}
        )
        assert allowed.status_code == 200, allowed.text
        refused = await client.post("/v1/controller/run", headers={"origin": "https://ops.example:8443"})
        assert refused.status_code == 403


def _head(method: str, port: int, path: str, length: int, extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


async def _answer_without_body(port: int, path: str, extra: str = "", method: str = "POST") -> tuple[int, bytes]:
    """Declare a 10 MB body, send 10 bytes of it, and read the answer (the rest never comes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_head(method, port, path, 10 * MIB, extra) + b'{"calls":[')
        await writer.drain()
        data = b""
        try:  # the server's body timeout is 600 s: an answer within 60 s did not wait for the body
            async with asyncio.timeout(60):
                while chunk := await reader.read(65536):
                    data += chunk
        except ConnectionResetError:
            pass
        assert data.startswith(b"HTTP/1.1 "), data[:200]
        return int(data.split(b" ", 2)[1]), data
    finally:
        writer.close()


async def test_a_request_without_a_token_is_refused_before_its_body(tmp_path: Path, call_factory: CallFactory) -> None:
    ingest, admin = "ingest-token-0123456789", "admin-token-0123456789"
    async with running_serve(
        _sqlite(tmp_path),
        tmp_path,
        HEDGEROW_TOKENS=f"{ingest}:ingest,{admin}:admin",
        HEDGEROW_BODY_READ_TIMEOUT_S="600",
        HEDGEROW_CONTROLLER_INTERVAL_S="3600",
    ) as served:
        code, raw = await _answer_without_body(served.port, "/v1/calls")
        assert code == 401, raw[:300]
        assert b"www-authenticate: Bearer" in raw.lower().replace(b"bearer", b"Bearer")
        assert b'"field": "authorization"' in raw and b"missing or invalid bearer token" in raw
        code, raw = await _answer_without_body(served.port, "/v1/calls", "Authorization: Bearer wrong-token\r\n")
        assert code == 401, raw[:300]
        # a valid token without the endpoint's scope: 403, body unread as well
        code, raw = await _answer_without_body(
            served.port, "/v1/routes/r?model=m", f"Authorization: Bearer {ingest}\r\n", method="PATCH"
        )
        assert code == 403 and b"token lacks scope" in raw, raw[:300]
        code, raw = await _answer_without_body(served.port, "/v1/controller/run", f"Authorization: Bearer {ingest}\r\n")
        assert code == 403 and b"token lacks scope" in raw, raw[:300]
        # with its token the batch is read and stored
        async with httpx.AsyncClient(base_url=served.base, timeout=30) as client:
            records = [call_factory("t1").to_dict()]
            answer = await client.post(
                "/v1/calls", json={"calls": records}, headers={"authorization": f"Bearer {ingest}"}
            )
            assert answer.status_code == 202, answer.text


async def test_a_body_of_millions_of_empty_records_is_refused_unbuilt(
    tmp_path: Path, call_factory: CallFactory
) -> None:
    count = (16_000_000 - 12) // 3
    body = b'{"calls":[' + b"{}," * (count - 1) + b"{}]}"
    async with running_serve(_sqlite(tmp_path), tmp_path, HEDGEROW_CONTROLLER_INTERVAL_S="3600") as served:
        pid = served.process.pid
        async with httpx.AsyncClient(base_url=served.base, timeout=120) as client:
            valid = await client.post("/v1/calls", json={"calls": [call_factory("w1").to_dict()]})
            assert valid.status_code == 202, valid.text
            before = peak_rss_bytes(pid)
            refused = await client.post("/v1/calls", content=body, headers={"content-type": "application/json"})
            assert refused.status_code == 413, refused.text[:300]
            assert _detail(refused)["field"] == "calls"
            assert "max_batch_calls=1000" in _detail(refused)["message"]
            growth = peak_rss_bytes(pid) - before
            # the body itself is 16 MB (held while it is buffered and read); building its
            # 5.3 million records took +780 MB
            assert growth < 80 * MIB, f"peak RSS grew {growth / MIB:.0f} MB"
            records = [call_factory(f"v{i}").to_dict() for i in range(200)]
            assert (await client.post("/v1/calls", json={"calls": records})).status_code == 202
