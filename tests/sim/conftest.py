"""Fixtures of the sim tests: real replicas on 127.0.0.1 (uvicorn in a background thread)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hedgerow.sim import ReplicaConfig, ReplicaThread

#: The shared read-only data folder (``../shared/data`` relative to the repository root).
DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
PERF_CSV = DATA / "traces" / "splitwise_perf_model.csv"
CONV_CSV = DATA / "traces" / "AzureLLMInferenceTrace_conv.csv"

#: The ``start_replica`` fixture: ``start_replica(**ReplicaConfig fields) -> ReplicaThread``.
StartReplica = Callable[..., ReplicaThread]


@pytest.fixture
def start_replica() -> Iterator[StartReplica]:
    """Factory ``start_replica(**ReplicaConfig fields) -> ReplicaThread`` (listening; stopped after the test)."""
    started: list[ReplicaThread] = []

    def start(**fields: Any) -> ReplicaThread:
        rep = ReplicaThread(ReplicaConfig(**fields), port=0).start()
        started.append(rep)
        return rep

    yield start
    for rep in started:
        rep.stop()
