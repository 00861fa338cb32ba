"""One simulated LLM replica's scheduler: continuous batching with prefill head-of-line blocking.

The engine keeps a FIFO waiting queue and a running batch of at most ``max_batch`` requests and
runs one loop (an asyncio task), modelled on iteration-level scheduling as in Orca (Yu et al.,
OSDI 2022) and vLLM's default (non-chunked) prefill-first scheduler:

1. when requests are waiting and the batch has room, admit up to ``room`` of them (FIFO) and run
   their prefill as one step: it lasts ``perf.prefill_time_s(sum of their prompt tokens,
   number admitted) * time_scale * slowdown``; the running batch does not decode meanwhile (a
   long prompt delays every token of every other request: head-of-line blocking); then each
   admitted request emits its first token;
2. otherwise run one decode step of the running batch (``perf.decode_step_s(batch size) *
   time_scale * slowdown``): every running request gets one more token; requests that reach their
   output length finish and leave the batch.

Tokens reach a request's consumer through its asyncio queue as ``TokenChunk`` items: the first
token alone and at once, then groups of ``tokens_per_chunk`` (like vLLM's stream interval), the
last group possibly shorter and marked ``finished``. ``abort`` (client disconnect) removes a
request at once from the queue or the batch and frees its slot; a prefill already under way still
takes its time (GPU work cannot be recalled) but the aborted request gets no token.

Sleeps follow a deadline clock (each step ends ``dt`` after the previous one ended, with at most
``_MAX_LAG_S`` of accumulated lateness), so that sub-millisecond steps at a small ``time_scale``
keep their average rate despite the event loop's timer granularity.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from hedgerow.sim.perf_model import PerfModel

__all__ = ["EngineClosed", "EngineRequest", "ReplicaEngine", "TokenChunk"]

#: Largest lateness (s) the deadline clock tries to catch up on before it resets.
_MAX_LAG_S = 0.1


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """A group of generated tokens delivered to one request.

    Attributes:
        tokens: number of tokens in the chunk (>= 1).
        finished: True on the request's last chunk (its output length is reached).
        stall_before_s: wall seconds the consumer should wait before delivering this chunk
            (a simulated mid-stream stall; 0 normally).
    """

    tokens: int
    finished: bool
    stall_before_s: float = 0.0


class EngineClosed(Exception):
    """The engine stopped while the request was still in flight."""


class EngineRequest:
    """One request inside the engine.

    Attributes:
        request_id: caller's identifier (for logs and stats).
        prompt_tokens: prompt length in tokens (>= 0).
        output_tokens: tokens to generate (>= 1).
        generated: tokens generated so far.
        state: "waiting", "prefill", "running", "finished" or "aborted".
        chunks: asyncio queue of ``TokenChunk`` (or an ``EngineClosed`` instance on shutdown).
        submitted_at / first_token_at / finished_at: event-loop times (s) or None.
    """

    __slots__ = (
        "_pending",
        "_stall_at",
        "_stall_s",
        "chunks",
        "finished_at",
        "first_token_at",
        "generated",
        "output_tokens",
        "prompt_tokens",
        "request_id",
        "state",
        "submitted_at",
    )

    def __init__(
        self,
        request_id: str,
        prompt_tokens: int,
        output_tokens: int,
        submitted_at: float,
        stall_at: int | None,
        stall_s: float,
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.generated = 0
        self.state = "waiting"
        self.chunks: asyncio.Queue[TokenChunk | EngineClosed] = asyncio.Queue()
        self.submitted_at = submitted_at
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self._pending = 0
        self._stall_at = stall_at
        self._stall_s = stall_s

    def __repr__(self) -> str:
        return (
            f"EngineRequest({self.request_id!r}, prompt={self.prompt_tokens}, "
            f"output={self.output_tokens}, generated={self.generated}, state={self.state})"
        )


class ReplicaEngine:
    """Continuous-batching scheduler of one simulated replica (see the module docstring).

    Args:
        perf: service-time model (``hedgerow.sim.perf_model.PerfModel``).
        max_batch: largest running batch (requests), >= 1.
        time_scale: factor on every service time (0.1 = ten times faster than the GPU), > 0.
        slowdown: degradation factor on every service time (2.0 = a replica half as fast), > 0.
        tokens_per_chunk: tokens per delivered chunk after the first token, >= 1.
        stall_rate: fraction of requests (with an output of 2+ tokens) that stall once after
            their first token, in [0, 1].
        stall_s: length of such a stall in wall seconds (not scaled), >= 0.
        seed: seed of the random choices (stalls); None for a random seed.

    Use as ``async with ReplicaEngine(...) as engine`` or call ``start()`` / ``stop()`` inside a
    running event loop.

    Raises:
        ValueError: a knob out of range (the message names it).
    """

    def __init__(
        self,
        perf: PerfModel,
        *,
        max_batch: int = 64,
        time_scale: float = 1.0,
        slowdown: float = 1.0,
        tokens_per_chunk: int = 1,
        stall_rate: float = 0.0,
        stall_s: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        if not slowdown > 0:
            raise ValueError(f"slowdown must be > 0, got {slowdown!r}")
        if not isinstance(tokens_per_chunk, int) or tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be an integer >= 1, got {tokens_per_chunk!r}")
        if not 0.0 <= stall_rate <= 1.0:
            raise ValueError(f"stall_rate must be in [0, 1], got {stall_rate!r}")
        if not stall_s >= 0:
            raise ValueError(f"stall_s must be >= 0, got {stall_s!r}")
        self.perf = perf
        self.max_batch = max_batch
        self.time_scale = float(time_scale)
        self.slowdown = float(slowdown)
        self.tokens_per_chunk = tokens_per_chunk
        self.stall_rate = float(stall_rate)
        self.stall_s = float(stall_s)
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)
        self._waiting: deque[EngineRequest] = deque()
        self._batch: dict[int, EngineRequest] = {}  # id(request) -> request, admission order
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._counters = dict(
            submitted=0,
            admitted=0,
            finished=0,
            aborted_waiting=0,
            aborted_running=0,
            prefills=0,
            decode_steps=0,
            tokens_generated=0,
            stalls=0,
        )
        self._busy_s = 0.0

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the scheduling loop in the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name="hedgerow-replica-engine")

    async def stop(self) -> None:
        """Stop the loop; every request still in flight receives ``EngineClosed``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for req in [*self._waiting, *self._batch.values()]:
            req.state = "aborted"
            req.chunks.put_nowait(EngineClosed("replica engine stopped"))
        self._waiting.clear()
        self._batch.clear()

    async def __aenter__(self) -> ReplicaEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # --- requests -------------------------------------------------------------------------------

    def submit(self, prompt_tokens: int, output_tokens: int, request_id: str | None = None) -> EngineRequest:
        """Queue a request (FIFO) and return its handle; read ``handle.chunks`` for its tokens.

        Args:
            prompt_tokens: prompt length in tokens, >= 0.
            output_tokens: tokens to generate, >= 1.
            request_id: identifier for logs; a counter when None.

        Raises:
            ValueError: bad token counts.
            RuntimeError: the engine is not running.
        """
        if not isinstance(prompt_tokens, int) or prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be an integer >= 0, got {prompt_tokens!r}")
        if not isinstance(output_tokens, int) or output_tokens < 1:
            raise ValueError(f"output_tokens must be an integer >= 1, got {output_tokens!r}")
        if self._task is None or self._task.done():
            raise RuntimeError("replica engine is not running (call start() first)")
        stall_at = None
        if output_tokens >= 2 and self.stall_s > 0 and self._rng.random() < self.stall_rate:
            stall_at = self._rng.randint(2, output_tokens)
        req = EngineRequest(
            request_id or f"req-{next(self._ids)}",
            prompt_tokens,
            output_tokens,
            asyncio.get_running_loop().time(),
            stall_at,
            self.stall_s,
        )
        self._waiting.append(req)
        self._counters["submitted"] += 1
        self._wake.set()
        return req

    def abort(self, req: EngineRequest) -> bool:
        """Remove a request at once (client gone) and free its slot.

        Returns:
            True when the request was waiting or in the batch; False when it had already
            finished or been aborted.
        """
        if req.state == "waiting":
            with contextlib.suppress(ValueError):
                self._waiting.remove(req)
            self._counters["aborted_waiting"] += 1
        elif req.state in ("prefill", "running"):
            self._batch.pop(id(req), None)
            self._counters["aborted_running"] += 1
            self._wake.set()
        else:
            return False
        req.state = "aborted"
        return True

    def set_slowdown(self, slowdown: float) -> None:
        """Change the degradation factor from the next scheduling step on (a change of conditions).

        A prefill or decode step already under way keeps the factor it started with; every later
        step is multiplied by the new one.

        Args:
            slowdown: the new factor on every service time, a finite number > 0.

        Raises:
            ValueError: ``slowdown`` is not a finite number > 0.
        """
        if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not 0 < slowdown < math.inf:
            raise ValueError(f"slowdown must be a finite number > 0, got {slowdown!r}")
        self.slowdown = float(slowdown)

    def stats(self) -> dict[str, Any]:
        """Counters and gauges of this engine as a JSON-ready dict.

        Keys: submitted, admitted, finished, aborted (= aborted_waiting + aborted_running),
        aborted_waiting, aborted_running, prefills, decode_steps, tokens_generated, stalls,
        waiting (queue length), running (batch size), max_batch, busy_s (simulated service
        seconds spent so far), time_scale, slowdown, tokens_per_chunk.
        """
        c: dict[str, Any] = dict(self._counters)
        c["aborted"] = c["aborted_waiting"] + c["aborted_running"]
        c.update(
            waiting=len(self._waiting),
            running=len(self._batch),
            max_batch=self.max_batch,
            busy_s=round(self._busy_s, 6),
            time_scale=self.time_scale,
            slowdown=self.slowdown,
            tokens_per_chunk=self.tokens_per_chunk,
        )
        return c

    # --- the loop -------------------------------------------------------------------------------

    def _emit(self, req: EngineRequest, finished: bool) -> None:
        stall = 0.0
        if req._stall_at is not None and req.generated >= req._stall_at:
            stall, req._stall_at = req._stall_s, None
            self._counters["stalls"] += 1
        req.chunks.put_nowait(TokenChunk(req._pending, finished, stall))
        req._pending = 0

    def _finish(self, req: EngineRequest, now: float) -> None:
        req.state = "finished"
        req.finished_at = now
        self._batch.pop(id(req), None)
        self._counters["finished"] += 1
        self._emit(req, finished=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time()

        async def busy(dt: float) -> None:
            nonlocal clock
            self._busy_s += dt
            clock = max(clock, loop.time() - _MAX_LAG_S) + dt
            delay = clock - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)

        while True:
            if not self._waiting and not self._batch:
                self._wake.clear()
                await self._wake.wait()
                clock = loop.time()
                continue
            scale = self.time_scale * self.slowdown
            room = self.max_batch - len(self._batch)
            if self._waiting and room > 0:
                group = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
                for req in group:
                    req.state = "prefill"
                    self._batch[id(req)] = req
                self._counters["admitted"] += len(group)
                self._counters["prefills"] += 1
                await busy(self.perf.prefill_time_s(sum(r.prompt_tokens for r in group), len(group)) * scale)
                now = loop.time()
                for req in group:
                    if req.state != "prefill":  # aborted while its prefill ran
                        continue
                    req.state = "running"
                    req.generated = 1
                    req._pending = 1
                    req.first_token_at = now
                    self._counters["tokens_generated"] += 1
                    if req.output_tokens == 1:
                        self._finish(req, now)
                    else:
                        self._emit(req, finished=False)
                continue
            batch = [r for r in self._batch.values() if r.state == "running"]
            if not batch:  # only aborted leftovers; nothing to decode
                await asyncio.sleep(0)
                continue
            self._counters["decode_steps"] += 1
            await busy(self.perf.decode_step_s(len(batch)) * scale)
            now = loop.time()
            for req in batch:
                if req.state != "running":  # aborted during the step
                    continue
                req.generated += 1
                req._pending += 1
                self._counters["tokens_generated"] += 1
                if req.generated >= req.output_tokens:
                    self._finish(req, now)
                elif req._pending >= self.tokens_per_chunk:
                    self._emit(req, finished=False)
