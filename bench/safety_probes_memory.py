"""Probe p3 of ``bench/safety_probes.py``: peak RSS of ``serve`` under a large body and under unauthenticated uploads.

``serve`` runs with an admin token. After a warm-up (one ``/readyz``, one empty batch), its idle
RSS is read; a thread samples ``/proc/<pid>/status`` every 5 ms while the load runs:

- one body: a ``POST /v1/calls`` (with the token) whose body is ``--body-mb`` million bytes (16 is just
  under the server's default body limit, so it is read and parsed) of empty JSON objects, the shape that costs a JSON
  parser the most memory per byte;
- uploads: ``--uploads`` raw sockets at once, each declaring ``--body-mb`` MB and sending it
  without a token, then reading the status line.

Each figure is the peak minus the idle RSS just before, in MiB; the target is 100.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from safety_probes_common import ProbeResult, Serve, fresh_store, rss_bytes, store_kind

TOKEN = "safety-probe-admin-token-0123456789"
LIMIT_MB = 100.0
MB = 1024 * 1024


class PeakSampler(threading.Thread):
    """Samples a process's RSS every 5 ms until :meth:`finish`; ``peak`` is the largest seen, bytes."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        """Sample until told to finish."""
        while not self.done.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.done.wait(0.005)

    def finish(self) -> int:
        """Stop sampling; returns the peak RSS, bytes."""
        self.done.set()
        self.join()
        return self.peak


def empty_objects(size_bytes: int) -> bytes:
    """A JSON array of ``{}`` about ``size_bytes`` long."""
    count = max(1, (size_bytes - 2) // 3)
    return b"[" + b",".join([b"{}"] * count) + b"]"


def upload(port: int, size_bytes: int, answers: list[str]) -> None:
    """An unauthenticated ``POST /v1/calls`` declaring ``size_bytes``; records the answer's status line."""
    chunk = b"{}," * (MB // 3)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            head = (
                f"POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size_bytes}\r\n\r\n"
            )
            sock.sendall(head.encode())
            sent = 0
            try:
                while sent < size_bytes:
                    part = chunk[: size_bytes - sent]
                    sock.sendall(part)
                    sent += len(part)
            except OSError:
                pass  # the server answered and closed before reading it all
            answers.append(sock.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace"))
    except OSError as exc:
        answers.append(f"error {type(exc).__name__}")


def idle_rss(pid: int) -> int:
    """The RSS of ``pid`` after a 2 s rest (largest of ten reads), bytes."""
    time.sleep(2.0)
    reads = []
    for _ in range(10):
        reads.append(rss_bytes(pid))
        time.sleep(0.05)
    return max(reads)


def probe_memory(args: argparse.Namespace, workdir: Path) -> list[ProbeResult]:
    """Measure the two peaks on the store of ``args.db``; two results (one body, uploads)."""
    store = store_kind(args.db)
    size = args.body_mb * 1_000_000  # decimal MB: 16 stays under the default limit of 16,384,000 bytes
    with fresh_store(args.db, workdir, "p3") as url:
        serve = Serve(url, workdir, "p3", env={"HEDGEROW_TOKENS": f"{TOKEN}:admin"})
        try:
            base = serve.started()
            port = int(base.rsplit(":", 1)[1])
            auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
            with httpx.Client(base_url=base, timeout=300) as client:
                client.get("/readyz")
                client.post("/v1/calls", content=b"[]", headers=auth)
                idle = idle_rss(serve.proc.pid)
                sampler = PeakSampler(serve.proc.pid)
                sampler.start()
                answer = client.post("/v1/calls", content=empty_objects(size), headers=auth)
                time.sleep(0.5)
                one_peak = sampler.finish()
            one: dict[str, Any] = {
                "body_mb": args.body_mb,
                "idle_rss_mb": round(idle / MB, 1),
                "peak_rss_mb": round(one_peak / MB, 1),
                "delta_mb": round((one_peak - idle) / MB, 1),
                "status": answer.status_code,
                "answer": answer.text[:200],
            }
            idle = idle_rss(serve.proc.pid)
            sampler = PeakSampler(serve.proc.pid)
            sampler.start()
            answers: list[str] = []
            threads = [threading.Thread(target=upload, args=(port, size, answers)) for _ in range(args.uploads)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            time.sleep(1.0)
            many_peak = sampler.finish()
        finally:
            serve.stop()
    counts: dict[str, int] = {}
    for line in answers:
        counts[line] = counts.get(line, 0) + 1
    many: dict[str, Any] = {
        "uploads": args.uploads,
        "upload_mb": args.body_mb,
        "idle_rss_mb": round(idle / MB, 1),
        "peak_rss_mb": round(many_peak / MB, 1),
        "delta_mb": round((many_peak - idle) / MB, 1),
        "answers": counts,
    }
    refused = all(" 401 " in f"{line} " for line in answers)
    return [
        ProbeResult(
            probe=f"p3 RSS, one {args.body_mb} MB body",
            store=store,
            figure=f"+{one['delta_mb']} MB over idle (answer {answer.status_code})",
            target=f"<= {LIMIT_MB:.0f} MB, no 5xx",
            passed=one["delta_mb"] <= LIMIT_MB and answer.status_code < 500,
            detail=one,
        ),
        ProbeResult(
            probe=f"p3 RSS, {args.uploads} unauth uploads",
            store=store,
            figure=f"+{many['delta_mb']} MB over idle ({len(answers)} answers, all 401: {refused})",
            target=f"<= {LIMIT_MB:.0f} MB, all 401",
            passed=many["delta_mb"] <= LIMIT_MB and refused and len(answers) == args.uploads,
            detail=many,
        ),
    ]
