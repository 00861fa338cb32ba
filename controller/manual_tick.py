"""One controller tick on demand (``hedgerow controller run-once``), under the controller lease.

A running ``hedgerow serve`` ticks every ``HEDGEROW_CONTROLLER_INTERVAL_S`` while it holds the
``controller`` lease (:mod:`hedgerow.controller.lease`). A tick run from another process at the
same time would publish in between the scheduled ones, with no ``serve`` process knowing, so the
on-demand tick takes the same lease first: while another process holds it, nothing is ticked and
:class:`~hedgerow.controller.errors.LeaseHeld` names the holder (the CLI exits 75, "try again
later"); otherwise it holds the lease for the tick (a ``serve`` process skips its own ticks
meanwhile) and releases it at once after. Applied changes are logged as ``threshold_changed``
lines by :func:`hedgerow.controller.jobs.run_tick`, as the scheduled tick's are.
"""

from __future__ import annotations

from typing import Any

from hedgerow.controller.db import check_ready, make_engine, make_sessionmaker
from hedgerow.controller.errors import LeaseHeld
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.lease import CONTROLLER_LEASE, acquire_lease, lease_holder, make_holder_id, release_lease

__all__ = ["run_once_under_lease"]


async def run_once_under_lease(settings: Any) -> list[dict[str, Any]]:
    """Open the store of ``settings.database_url``, take the controller lease, tick once, release it.

    The lease is taken for ``settings.lease_ttl_s`` seconds (a tick takes well under that; one that
    took longer could overlap the next holder's first tick, the limit :mod:`hedgerow.controller.lease`
    states for any holder).

    Args:
        settings: a ``hedgerow.settings.Settings`` (``database_url``, ``lease_ttl_s``, the policy's).

    Returns:
        The history rows written, one per route (see :func:`hedgerow.controller.jobs.run_tick`).

    Raises:
        LeaseHeld: another process (a running ``serve``) holds the controller lease; nothing written.
        StoreError: bad database url.
        StoreNotReady: database unreachable or not migrated to head.
    """
    engine = make_engine(settings.database_url)
    try:
        await check_ready(engine)
        sessionmaker = make_sessionmaker(engine)
        holder = f"run-once:{make_holder_id()}"
        if not await acquire_lease(sessionmaker, CONTROLLER_LEASE, holder, settings.lease_ttl_s):
            current = await lease_holder(sessionmaker, CONTROLLER_LEASE)
            raise LeaseHeld(CONTROLLER_LEASE, *(current or (None, None)))
        try:
            return await run_tick(sessionmaker, settings)
        finally:
            await release_lease(sessionmaker, CONTROLLER_LEASE, holder)
    finally:
        await engine.dispose()
