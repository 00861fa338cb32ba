"""Admission of ``POST /v1/calls`` batches on PostgreSQL: a bounded number at once, a bounded wait.

Validating a 1,000-record batch takes tens of milliseconds of the event loop's one thread, and
writing it holds a connection for its transaction. With no bound, 64 concurrent posters put 64
batches on the loop and in the pool at once, and a threshold poll or a ``/readyz`` waits behind
all of them (measured: 9-15 s). :class:`IngestGate` lets at most ``slots`` batches
(``HEDGEROW_DB_INGEST_POOL_SIZE``, the size of the ingest pool) be validated and written at
once; the others wait, in arrival order, up to ``HEDGEROW_INGEST_WAIT_S``, and are then answered
``503`` with ``Retry-After`` (nothing of the batch is written; the exporter keeps it and posts it
again; each such refusal is counted in ``hedgerow_ingest_refused_total{reason="busy"}``). A slot
is taken before the body is validated, after the token is checked.

Within the slots, the CPU-heavy steps of a batch (validating it, building its rows, counting it
into minute aggregates) take turns of their own (:class:`~hedgerow.controller.store.cpu_turns.CpuTurns`,
``HEDGEROW_INGEST_CPU_SLOTS`` at once, :attr:`IngestGate.cpu`): a pass of the event loop then
runs at most that many slices of ingest before it answers a threshold poll, while the batches'
database waits still overlap (0: no turns, every admitted batch computes at once).

On SQLite there is no gate: the group commit writer already serialises ingest
(:func:`hedgerow.api.calls.make_ingest_writer`), and its behaviour is unchanged.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import HTTPException, Request
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.api._state import app_state
from hedgerow.controller.store.cpu_turns import CpuTurns

__all__ = ["RETRY_AFTER_S", "IngestBusy", "IngestGate", "ingest_session", "make_ingest_gate"]

#: The ``Retry-After`` of a batch refused because every ingest slot stayed taken, seconds.
RETRY_AFTER_S = 1


class IngestBusy(Exception):
    """Every ingest slot stayed taken for the whole wait."""


class IngestGate:
    """At most ``slots`` holders at once; a newcomer waits up to ``wait_s`` for a slot.

    Args:
        slots: holders at once, >= 1.
        wait_s: seconds a newcomer may wait, finite, >= 0 (0: a slot now or none).
        cpu_slots: holders of a slot that may be in a CPU-heavy step at once (:attr:`cpu`),
            >= 0 (0: no bound).

    Raises:
        ValueError: ``slots`` < 1, ``wait_s`` negative or not finite, or ``cpu_slots`` < 0.
    """

    def __init__(self, slots: int, wait_s: float, cpu_slots: int = 0) -> None:
        if slots < 1:
            raise ValueError(f"slots: must be >= 1, got {slots!r}")
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError(f"wait_s: must be a finite number of seconds >= 0, got {wait_s!r}")
        if cpu_slots < 0:
            raise ValueError(f"cpu_slots: must be >= 0, got {cpu_slots!r}")
        self.slots = slots
        self.wait_s = wait_s
        self._semaphore = asyncio.Semaphore(slots)
        #: The turns of the CPU-heavy steps of admitted batches, or None (no bound).
        self.cpu: CpuTurns | None = CpuTurns(cpu_slots) if cpu_slots else None
        #: Holders now, and newcomers refused so far (for tests and metrics).
        self.busy = 0
        self.refused = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the block.

        Raises:
            IngestBusy: no slot came free within ``wait_s``.
        """
        try:
            if self.wait_s == 0:
                if self._semaphore.locked():
                    raise TimeoutError
                await self._semaphore.acquire()
            else:
                async with asyncio.timeout(self.wait_s):
                    await self._semaphore.acquire()
        except TimeoutError:
            self.refused += 1
            raise IngestBusy(f"all {self.slots} ingest slots stayed busy for {self.wait_s:g} s") from None
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self._semaphore.release()


def make_ingest_gate(dialect_name: str, slots: int, wait_s: float, cpu_slots: int = 0) -> IngestGate | None:
    """The app's gate: an :class:`IngestGate` on PostgreSQL, None on SQLite (no gate).

    Args:
        dialect_name: the store's SQLAlchemy dialect (``postgresql``, ``sqlite``).
        slots: ``settings.db_ingest_pool_size``.
        wait_s: ``settings.ingest_wait_s``.
        cpu_slots: ``settings.ingest_cpu_slots`` (0: no bound).
    """
    return None if dialect_name == "sqlite" else IngestGate(slots, wait_s, cpu_slots)


async def ingest_session(request: Request) -> AsyncIterator[AsyncSession]:
    """FastAPI dependency of ``POST /v1/calls``: an ingest slot, and a session of the ingest pool.

    Uses ``app.state.ingest_gate`` and ``app.state.ingest_sessionmaker`` when set (PostgreSQL),
    else a plain session of ``app.state.sessionmaker`` (SQLite).

    Raises:
        HTTPException: 503 with ``Retry-After`` when no slot came free in time (counted in
            ``hedgerow_ingest_refused_total{reason="busy"}``).
    """
    state = app_state(request.app)
    gate: IngestGate | None = getattr(state, "ingest_gate", None)
    sessionmaker = getattr(state, "ingest_sessionmaker", None) or state.sessionmaker
    if gate is None:
        async with sessionmaker() as session:
            yield session
        return
    try:
        async with gate.slot(), sessionmaker() as session:
            yield session
    except IngestBusy as exc:
        state.metrics.ingest_refused.labels(reason="busy").inc()
        raise HTTPException(
            status_code=503,
            detail={"field": "calls", "message": f"the server is busy with other batches ({exc}); post again later"},
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
