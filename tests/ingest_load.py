"""A load generator for ``POST /v1/calls``: many concurrent posters of large batches.

Run as a separate process (``python -m tests.ingest_load URL ...``) so that the posters' own
CPU never delays the latency the test process measures. Each poster posts batches of
``--batch`` records (the JSON is built once; every post gets fresh ``request_id`` values by a
byte substitution, so nothing is a duplicate) back to back for ``--seconds``; at the end one
JSON line ``{"posts": n, "statuses": {"202": k, ...}, "records": m}`` is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import httpx

#: Placeholder in the request ids of the batch template, replaced per post.
_TAG = b"@@@@@@@@@@"


def batch_template(size: int, routes: int) -> bytes:
    """The JSON body of a batch of ``size`` records over ``routes`` routes, ids tagged with :data:`_TAG`."""
    from tests.conftest import make_call

    now = datetime.now(UTC)
    calls = [
        make_call(
            f"{_TAG.decode()}-{i}",
            route=f"load-{i % routes}",
            started_at=now - timedelta(seconds=i % 600),
            primary_ttft_s=0.2 + 0.001 * (i % 500),
        ).to_dict()
        for i in range(size)
    ]
    return json.dumps({"calls": calls}).encode()


async def run(url: str, posters: int, batch: int, seconds: float, routes: int, token: str | None) -> dict[str, object]:
    """Post for ``seconds`` from ``posters`` concurrent clients; returns the counts."""
    template = batch_template(batch, routes)
    counter = itertools.count()
    prefix = f"{int(time.time() * 1000) % 10**6:06d}"
    statuses: Counter[str] = Counter()
    records = 0
    deadline = time.monotonic() + seconds
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"

    async def poster() -> None:
        nonlocal records
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            while time.monotonic() < deadline:
                tag = f"{prefix}{next(counter):04x}".encode()[: len(_TAG)].ljust(len(_TAG), b"0")
                try:
                    response = await client.post("/v1/calls", content=template.replace(_TAG, tag), headers=headers)
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                    continue
                statuses[str(response.status_code)] += 1
                if response.status_code == 202:
                    records += response.json()["accepted"]
                elif response.status_code == 503:
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))

    await asyncio.gather(*(poster() for _ in range(posters)))
    return {"posts": sum(statuses.values()), "statuses": dict(statuses), "records": records}


def main() -> None:
    """Parse the command line, run the load, print the counts as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--posters", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--routes", type=int, default=10)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()
    result = asyncio.run(run(args.url, args.posters, args.batch, args.seconds, args.routes, args.token))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
