"""Fixtures of the client tests: a pair of simulated replicas (``hedgerow.sim``) on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hedgerow.sim import ReplicaConfig, ReplicaThread

#: The ``replicas`` fixture: ``(slow, fast)``.
Replicas = tuple[ReplicaThread, ReplicaThread]


@pytest.fixture(scope="module")
def replicas() -> Iterator[Replicas]:
    """(slow, fast) simulated replicas, shared by one module's tests.

    The slow one is sick (``slowdown=100``: first token after ~5 s, a whole answer after ~15 s);
    the fast one is healthy (first token in ~0.05 s).
    """
    with (
        ReplicaThread(ReplicaConfig(name="slow", slowdown=100.0)) as slow,
        ReplicaThread(ReplicaConfig(name="fast")) as fast,
    ):
        yield slow, fast
