"""The demo's I/O: its child processes, and the HTTP calls it makes to its replicas and its api.

Each call raises :class:`DemoError` with a message naming what failed (a process that exited or
did not answer, a replica or the api refusing a change), except the reads whose absence the run
can live with (a replica's stats, the published history), which answer None or nothing. The run
itself is :func:`hedgerow.sim.demo.run_demo`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from hedgerow.client import Upstream
from hedgerow.client.records import parse_timestamp

if TYPE_CHECKING:
    from hedgerow.sim.demo import DemoConfig

__all__ = [
    "MODEL",
    "DemoError",
    "Processes",
    "applied_history",
    "configure_route",
    "drain",
    "free_port",
    "perf_model_notice",
    "published_at",
    "published_now",
    "set_demo_price",
    "set_slowdown",
    "wait_ready",
    "write_report",
]

#: The model name of the demo's calls, routes, price and thresholds.
MODEL = "llama2-70b"


class DemoError(RuntimeError):
    """The demo could not start or finish (a process did not come up, a port was taken, ...)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Processes:
    """Child processes of the demo, all stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, asyncio.subprocess.Process]] = []

    async def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.workdir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "hedgerow.cli",
                *args,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=self.workdir,
            )
        self.procs.append((name, proc))

    def tail(self, name: str, lines: int = 5) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    async def stop(self) -> None:
        for _, proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for _, proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def wait_ready(http: httpx.AsyncClient, url: str, procs: Processes, name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    proc = dict(procs.procs)[name]
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise DemoError(f"{name} exited with status {proc.returncode}: {procs.tail(name)}")
        try:
            if (await http.get(url, timeout=2.0)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise DemoError(f"{name} did not answer {url} within {timeout_s:g} s: {procs.tail(name)}")


async def set_slowdown(http: httpx.AsyncClient, upstream: Upstream, slowdown: float) -> None:
    """Set one replica's service-time factor (``PUT /slowdown``).

    Raises:
        DemoError: the replica refused or did not answer.
    """
    url = upstream.base_url.removesuffix("/v1") + "/slowdown"
    try:
        response = await http.put(url, json={"slowdown": slowdown}, timeout=10.0)
    except httpx.HTTPError as exc:
        raise DemoError(f"could not change the speed of {upstream.name}: {exc!r}") from None
    if response.status_code != 200:
        raise DemoError(
            f"{upstream.name} refused the change of speed: HTTP {response.status_code} {response.text[:200]}"
        )


async def drain(http: httpx.AsyncClient, upstreams: list[Upstream], timeout_s: float = 60.0) -> None:
    """Wait until no replica has a request queued or running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = 0
        for upstream in upstreams:
            try:
                stats = (await http.get(upstream.base_url.removesuffix("/v1") + "/stats")).json()
                busy += int(stats.get("waiting", 0)) + int(stats.get("running", 0))
            except (httpx.HTTPError, ValueError):
                pass
        if busy == 0:
            return
        await asyncio.sleep(0.2)


async def set_demo_price(http: httpx.AsyncClient, api_url: str, config: DemoConfig) -> None:
    usd_in, usd_out = config.price_usd_per_mtok
    body = {"input_usd_per_mtok": usd_in, "output_usd_per_mtok": usd_out, "actor": "hedgerow demo"}
    response = await http.put(f"{api_url}/v1/prices/{MODEL}", json=body)
    if response.status_code not in (200, 201):
        raise DemoError(f"could not set the demo price: HTTP {response.status_code} {response.text[:200]}")


async def configure_route(
    http: httpx.AsyncClient, api_url: str, mode: str, hedge_after_s: float, config: DemoConfig
) -> None:
    """Make the store say what a way's clients do, before its load starts (``PUT /v1/routes``).

    ``none`` is disabled (its clients never hedge) and ``fixed`` is pinned at its threshold, so
    the controller publishes nothing else for them and the weekly report's thresholds and states
    are the ones their clients used; ``adaptive`` keeps the defaults of a new route.

    Raises:
        DemoError: the api refused the configuration.
    """
    if mode == "adaptive":
        return
    body: dict[str, Any] = {"budget": config.budget, "actor": "hedgerow demo"}
    if mode == "none":
        body["enabled"] = False
    else:
        body["pinned_hedge_after_s"] = hedge_after_s
        body["min_hedge_after_s"] = min(hedge_after_s, config.default_hedge_after_s, 0.05)
    response = await http.put(f"{api_url}/v1/routes/demo-{mode}", params={"model": MODEL}, json=body)
    if response.status_code not in (200, 201):
        raise DemoError(f"could not configure route demo-{mode}: HTTP {response.status_code} {response.text[:200]}")


async def write_report(http: httpx.AsyncClient, api_url: str, directory: Path) -> tuple[tuple[Path, ...], Any]:
    """Fetch the current week's report as JSON and HTML and write both; returns (paths, JSON report)."""
    url = f"{api_url}/v1/reports/weekly"
    as_json = await http.get(url, params={"format": "json"}, timeout=120)
    as_html = await http.get(url, params={"format": "html"}, timeout=120)
    if as_json.status_code != 200 or as_html.status_code != 200:
        raise DemoError(f"could not fetch the weekly report: HTTP {as_json.status_code}/{as_html.status_code}")
    report = as_json.json()
    directory.mkdir(parents=True, exist_ok=True)
    html_path = directory / f"hedgerow-weekly-{report['week']}.html"
    json_path = directory / f"hedgerow-weekly-{report['week']}.json"
    html_path.write_text(as_html.text, encoding="utf-8")
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return (html_path, json_path), report


async def perf_model_notice(http: httpx.AsyncClient, upstreams: Sequence[Upstream]) -> str | None:
    """A notice when any replica fell back to the embedded speed table (the shared CSV absent)."""
    fallen = []
    for upstream in upstreams:
        try:
            stats = (await http.get(upstream.base_url.removesuffix("/v1") + "/stats", timeout=10.0)).json()
        except (httpx.HTTPError, ValueError):
            continue
        if isinstance(stats, dict) and stats.get("perf_model_embedded") is True:
            fallen.append(upstream.name)
    if not fallen:
        return None
    return (
        f"notice: {', '.join(fallen)} {'uses' if len(fallen) == 1 else 'use'} the embedded Splitwise speed table "
        "(../shared/data/traces/splitwise_perf_model.csv was not found; give the file with --perf-model)"
    )


async def applied_history(http: httpx.AsyncClient, api_url: str, route: str) -> list[tuple[datetime, float]]:
    """The values the controller published for ``route`` and when, oldest first (the api's history)."""
    try:
        response = await http.get(
            f"{api_url}/v1/routes/{route}/history", params={"model": MODEL, "applied": "true", "limit": 10_000}
        )
        rows = response.json()["history"] if response.status_code == 200 else []
        return [(parse_timestamp(row["computed_at"]), float(row["hedge_after_s"])) for row in reversed(rows)]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []


async def published_now(http: httpx.AsyncClient, api_url: str, route: str) -> float | None:
    """The threshold the api publishes now for ``route`` (``GET /v1/thresholds/{route}``), or None."""
    try:
        response = await http.get(f"{api_url}/v1/thresholds/{route}", params={"model": MODEL})
        return float(response.json()["hedge_after_s"]) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def published_at(history: Sequence[tuple[datetime, float]], moment: datetime | None, default: float) -> float:
    """The last value in ``history`` published at or before ``moment`` (``default`` before any)."""
    value = default
    for computed_at, hedge_after_s in history:
        if moment is not None and computed_at > moment:
            break
        value = hedge_after_s
    return value
