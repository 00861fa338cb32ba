"""Probe p5 of ``bench/safety_probes.py``: cross-site and DNS-rebinding writes change nothing on a tokenless ``serve``.

A browser tab on another site (or on a name rebound to 127.0.0.1) can send requests to a local
``serve`` with no token. Each write the api and the console accept (a record batch, a route
change, a console form, a controller tick, a route retire, a price) is sent with each forgery: a
foreign Origin, ``Origin: null``, a forged Host with its own Origin, a forged Host alone,
``Sec-Fetch-Site: cross-site`` and (for JSON writes) a ``text/plain`` body. The store's visible
state (calls stored, the route list, the route, its history, the model's prices) is read before
and after each. Every write is then sent same-origin as a control, which must change the state,
so the comparison is shown able to see a change.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
from safety_probes_common import ProbeResult, Serve, count_calls, fresh_store, store_kind

from tests.conftest import make_call

FOREIGN = "http://evil.example"


def batch() -> bytes:
    """A record batch of one new call on route ``base``, as JSON bytes."""
    return json.dumps({"calls": [make_call(f"p5-{uuid.uuid4().hex}", route="base").to_dict()]}).encode()


def writes() -> list[tuple[str, str, str, bytes, str]]:
    """The writes probed: (name, method, path, body, content type)."""
    form = b"enabled=on&budget=0.3&default_hedge_after_s=1.5&min_hedge_after_s=0.2&max_hedge_after_s=6"
    price = {"input_usd_per_mtok": 1.5, "output_usd_per_mtok": 2.5}
    return [
        ("ingest", "POST", "/v1/calls", batch(), "application/json"),
        ("route change", "PATCH", "/v1/routes/base?model=m1", b'{"budget": 0.2}', "application/json"),
        ("console form", "POST", "/ui/routes/base?model=m1", form, "application/x-www-form-urlencoded"),
        ("price", "PUT", "/v1/prices/m1", json.dumps(price).encode(), "application/json"),
        ("controller tick", "POST", "/v1/controller/run", b"", ""),
        ("route retire", "DELETE", "/v1/routes/base?model=m1", b"", ""),
    ]


def forgeries(port: str, content_type: str) -> list[tuple[str, dict[str, str]]]:
    """The forged headers sent with a write of ``content_type`` to a server on ``port``: (name, headers)."""
    rebound = f"evil.example:{port}"
    typed = {"content-type": content_type} if content_type else {}
    cases = [
        ("foreign Origin", {**typed, "origin": FOREIGN}),
        ("Origin null", {**typed, "origin": "null"}),
        ("forged Host + its Origin", {**typed, "host": rebound, "origin": f"http://{rebound}"}),
        ("forged Host", {**typed, "host": rebound}),
        ("Sec-Fetch-Site cross-site", {**typed, "sec-fetch-site": "cross-site"}),
    ]
    if content_type == "application/json":
        cases.append(("text/plain body", {"content-type": "text/plain"}))
    return cases


#: Keys of the api's answers that follow the clock (the window of "recent" figures), not the store.
CLOCK_KEYS = frozenset({"recent_since", "recent_until"})


def without_clock(value: Any) -> Any:
    """A parsed JSON answer with the :data:`CLOCK_KEYS` left out, at any depth."""
    if isinstance(value, dict):
        return {k: without_clock(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [without_clock(v) for v in value]
    return value


def snapshot(client: httpx.Client, url: str) -> str:
    """The store's visible state (calls stored, routes, the route, its history, the prices), as one string."""
    answers = [
        client.get("/v1/routes"),
        client.get("/v1/routes/base", params={"model": "m1"}),
        client.get("/v1/routes/base/history", params={"model": "m1"}),
        client.get("/v1/prices/m1"),
    ]
    parts = [count_calls(url), *[[a.status_code, without_clock(a.json())] for a in answers]]
    return json.dumps(parts, sort_keys=True)


def probe_xsite(args: argparse.Namespace, workdir: Path) -> list[ProbeResult]:
    """Send every forged write and every control to a tokenless ``serve`` on the store of ``args.db``; two results."""
    store = store_kind(args.db)
    rows: list[dict[str, Any]] = []
    with fresh_store(args.db, workdir, "p5") as url:
        serve = Serve(url, workdir, "p5")
        try:
            base = serve.started()
            port = base.rsplit(":", 1)[1]
            with httpx.Client(base_url=base, timeout=120) as client:
                seeded = client.post("/v1/calls", content=batch(), headers={"content-type": "application/json"})
                if seeded.status_code != 202 or client.post("/v1/controller/run").status_code != 200:
                    raise RuntimeError(f"p5: seeding the store failed: {seeded.status_code} {seeded.text[:200]}")
                for control in (False, True):
                    for name, method, path, body, content_type in writes():
                        cases = (
                            [("same-origin control", {"content-type": content_type, "origin": base})]
                            if control and content_type
                            else [("same-origin control", {})]
                            if control
                            else forgeries(port, content_type)
                        )
                        for forgery, headers in cases:
                            body = batch() if name == "ingest" else body  # a new call each time
                            before = snapshot(client, url)
                            with httpx.Client(base_url=base, timeout=120) as one:
                                answer = one.request(method, path, content=body, headers=headers)
                            rows.append(
                                {
                                    "write": name,
                                    "forgery": forgery,
                                    "control": control,
                                    "status": answer.status_code,
                                    "changed": snapshot(client, url) != before,
                                }
                            )
        finally:
            serve.stop()
    forged = [row for row in rows if not row["control"]]
    changed = [f"{row['write']} / {row['forgery']}" for row in forged if row["changed"]]
    controls = [row for row in rows if row["control"]]
    unseen = [row["write"] for row in controls if not row["changed"]]
    return [
        ProbeResult(
            probe="p5 forged writes",
            store=store,
            figure=f"{len(changed)} of {len(forged)} changed state",
            target="0 changed",
            passed=not changed,
            detail={"forged": len(forged), "changed": changed, "rows": forged},
        ),
        ProbeResult(
            probe="p5 same-origin controls",
            store=store,
            figure=f"{len(controls) - len(unseen)} of {len(controls)} changed state",
            target="all changed",
            passed=not unseen,
            detail={"controls": len(controls), "unchanged": unseen, "rows": controls},
        ),
    ]
