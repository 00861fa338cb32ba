"""Shared pieces of the gateway tests: the gateway served by uvicorn on a free loopback port in a
thread (``GatewayServer``), simulated replicas (one slow, one fast) and config helpers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp, GatewayConfig, RouteSpec
from hedgerow.sim import ReplicaConfig, ReplicaThread

#: A recognisable fake upstream key: it must appear in no response and no log line.
FAKE_UPSTREAM_KEY = "sk-upstream-SECRET-0123456789abcdef"
#: The gateway key of the tests that need one.
GATEWAY_KEY = "gw-test-key-0123456789abcdef"


class GatewayServer:
    """``app`` served by uvicorn on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", access_log=False, server_header=False, date_header=False
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True, name="gateway-test")

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self._sock]))

    @property
    def base_url(self) -> str:
        """The gateway's OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(15)
        self._sock.close()


def one_route(
    upstreams: list[Upstream],
    *,
    public: str = "gpt-fast",
    policy: HedgePolicy | None = None,
    keys: dict[str, str] | None = None,
    **limits: Any,
) -> GatewayConfig:
    """A configuration with one public model."""
    spec = RouteSpec(public, "gw-route", tuple(upstreams), policy or HedgePolicy(hedge_after_s=0.5, total_timeout_s=30))
    return GatewayConfig(routes={public: spec}, keys=keys or {}, source="test", **limits)


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[ReplicaThread, ReplicaThread]]:
    """(slow, fast) replicas: the slow one's first token comes after seconds, the fast one's at once."""
    with (
        ReplicaThread(ReplicaConfig(name="slow", slowdown=100.0)) as slow,
        ReplicaThread(ReplicaConfig(name="fast")) as fast,
    ):
        yield slow, fast


@pytest.fixture(scope="module")
def hedging_gateway(replicas: tuple[ReplicaThread, ReplicaThread]) -> Iterator[GatewayServer]:
    """A gateway whose model ``gpt-fast`` has the slow replica as primary and the fast as backup."""
    slow, fast = replicas
    config = one_route(
        [Upstream("slow", slow.base_url, api_key=FAKE_UPSTREAM_KEY), Upstream("fast", fast.base_url)],
        policy=HedgePolicy(hedge_after_s=0.3, budget=1.0, total_timeout_s=30),
    )
    with GatewayServer(GatewayApp(config)) as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The gateway tests share replicas per module: keep a module on one xdist worker."""
    for item in items:
        if "tests/gateway/" in str(item.fspath):
            item.add_marker(pytest.mark.xdist_group("gateway"))
