"""Probe p6 of ``bench/safety_probes.py``: no request answers 500, whatever its query values.

A tokenless ``serve`` gets three routes of five calls each and one tick. Then every GET operation
of its ``/openapi.json`` is sent once per query parameter and odd value (calendar edges of years
1 and 9999, impossible dates and weeks, numbers that overflow or are not finite, empty, very long
and control-character strings), with the required ``model`` filled in; a few odd route names go
in the path; the console pages get the same values in their filter parameters. Every answer of
500 or above is counted, and so is every traceback in the server's log. ``--quick`` sends a
third of the values.
"""

from __future__ import annotations

import argparse
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
from safety_probes_common import ProbeResult, Serve, fresh_store, store_kind

from tests.conftest import make_call

ODD_VALUES = [
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59.999999-12:00",
    "2026-02-30",
    "2026-12-06T24:00:00Z",
    "-1",
    "1e400",
    "nan",
    "",
    "2026-W53",
    "0001-W01",
    "9999-W52",
    "\u2028",
    "%00",
    "z" * 4000,
    "2026-12-06T10:00:00+99:00",
    "9" * 40,
]
ODD_ROUTES = ["%2e%2e", "r%00s", "y" * 500, "a/history"]
PAGES = ["/ui/", "/ui/routes", "/ui/routes/a?model=m1", "/ui/routes/a/calls?model=m1", "/ui/upstreams", "/ui/events"]
PAGE_KEYS = ["since", "until", "range", "reason", "cursor", "status", "upstream", "model"]


def fill(template: str, route: str) -> str:
    """An OpenAPI path template with its placeholders filled (``route`` for the route)."""
    filled = re.sub(r"\{model(:path)?\}", "m1", template)
    filled = re.sub(r"\{week\}", "2026-W49", filled)
    filled = re.sub(r"\{fmt\}", "json", filled)
    return re.sub(r"\{route(:path)?\}", route, filled)


def sweep(client: httpx.Client, values: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """Send every probe GET; returns the number sent and the answers of 500 or above."""
    sent, bad = 0, []

    def get(path: str, params: dict[str, str]) -> None:
        nonlocal sent
        answer = client.get(path, params=params)
        sent += 1
        if answer.status_code >= 500:
            bad.append({"path": path, "params": {k: v[:40] for k, v in params.items()}, "status": answer.status_code})

    spec = client.get("/openapi.json").json()
    for template, operations in spec["paths"].items():
        operation = operations.get("get")
        if operation is None:
            continue
        query = [p for p in operation.get("parameters", []) if p.get("in") == "query"]
        required = {p["name"]: "m1" for p in query if p.get("required") and p["name"] == "model"}
        for parameter in query:
            for value in values:
                get(fill(template, "a"), {**required, parameter["name"]: value})
        if "{route" in template:
            for route in ODD_ROUTES:
                get(fill(template, route), {"model": "m1"})
    for page in PAGES:
        for key in PAGE_KEYS:
            for value in values:
                get(page, {key: value})
    return sent, bad


def probe_sweep(args: argparse.Namespace, workdir: Path) -> list[ProbeResult]:
    """Sweep a tokenless ``serve`` on the store of ``args.db``; one result (answers of 500 or above)."""
    values = ODD_VALUES[::3] if args.quick else ODD_VALUES
    with fresh_store(args.db, workdir, "p6") as url:
        serve = Serve(url, workdir, "p6")
        try:
            base = serve.started()
            with httpx.Client(base_url=base, timeout=120) as client:
                calls = [
                    make_call(f"p6-{uuid.uuid4().hex}", route=r).to_dict() for r in ("a", "b", "c") for _ in range(5)
                ]
                seeded = client.post("/v1/calls", json={"calls": calls})
                ticked = client.post("/v1/controller/run")
                if seeded.status_code != 202 or ticked.status_code != 200:
                    raise RuntimeError(f"p6: seeding failed: ingest {seeded.status_code}, tick {ticked.status_code}")
                sent, bad = sweep(client, values)
        finally:
            serve.stop()
        tracebacks = serve.stderr().count("Traceback")
    return [
        ProbeResult(
            probe="p6 odd-value sweep",
            store=store_kind(args.db),
            figure=f"{len(bad)} of {sent} answered 5xx; {tracebacks} tracebacks logged",
            target="0 5xx, 0 tracebacks",
            passed=not bad and tracebacks == 0,
            detail={
                "requests": sent,
                "five_hundreds": bad[:20],
                "five_hundreds_count": len(bad),
                "tracebacks": tracebacks,
            },
        )
    ]
