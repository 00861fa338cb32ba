"""Turns on the event loop for the CPU-heavy steps of ingest: a few batches at once, short slices.

Everything a ``serve`` process does runs on one event loop thread. Validating a batch, building
its rows and counting it into minute aggregates are tens of milliseconds of that thread per
1,000 records; each step is cut into slices that yield to the loop in between, but when many
batches are in those steps at once, every pass of the loop runs one slice of each of them before
it comes back to a threshold poll, so a poll waits for all of them. :class:`CpuTurns` lets at most
``slots`` batches be in a CPU-heavy step at a time (the others wait for their turn, in arrival
order, without holding the loop), so a pass of the loop runs at most ``slots`` slices of ingest.
The database waits of the batches are outside any turn: they still overlap.

On a machine with one or two cores more batches computing at once add no throughput; a batch
waiting for its turn here costs nothing but its place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["CpuTurns", "cpu_turn", "pause"]


class CpuTurns:
    """At most ``slots`` holders of a CPU turn at once, served in arrival order.

    Args:
        slots: holders at once, >= 1.

    Raises:
        ValueError: ``slots`` < 1.
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots: must be >= 1, got {slots!r}")
        self.slots = slots
        self._semaphore = asyncio.Semaphore(slots)
        #: Turns taken so far, and turns that had to wait for one (for tests).
        self.taken = 0
        self.waited = 0

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold a turn for the block (wait for one first when all are held)."""
        if self._semaphore.locked():
            self.waited += 1
        async with self._semaphore:
            self.taken += 1
            yield


@asynccontextmanager
async def cpu_turn(turns: CpuTurns | None) -> AsyncIterator[None]:
    """``turns.turn()``, or a block with no turn to take when ``turns`` is None (unbounded)."""
    if turns is None:
        yield
        return
    async with turns.turn():
        yield


async def pause() -> None:
    """Yield to the event loop once, between two slices of a CPU-heavy step."""
    await asyncio.sleep(0)
