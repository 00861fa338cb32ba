"""hedgerow.sim: simulated OpenAI-compatible LLM replicas and the workloads that drive them.

* ``perf_model``: prefill / decode-step times interpolated from the Splitwise perf model.
* ``engine``: one replica's continuous-batching scheduler (prefill head-of-line blocking).
* ``replica``: the FastAPI app, ``serve_replica`` (uvicorn) and ``ReplicaThread`` (in-process).
* ``trace``: the Azure LLM inference trace loader and a synthetic look-alike.
* ``virtual``: a virtual-time (discrete-event) cluster of replicas with hedging clients.

The demo (``hedgerow.sim.demo``) is not imported here.
"""

from hedgerow.sim.engine import EngineClosed, EngineRequest, ReplicaEngine, TokenChunk
from hedgerow.sim.perf_model import (
    PerfModel,
    PerfModelError,
    available_configs,
    default_perf_model_path,
    load_perf_model,
)
from hedgerow.sim.replica import (
    ReplicaConfig,
    ReplicaThread,
    create_replica_app,
    estimate_prompt_tokens,
    serve_replica,
)
from hedgerow.sim.trace import TraceError, TraceRequest, compress, load_azure_trace, synthetic_trace
from hedgerow.sim.virtual import ClusterConfig, VirtualCall, VirtualResult, simulate

__all__ = [
    "ClusterConfig",
    "EngineClosed",
    "EngineRequest",
    "PerfModel",
    "PerfModelError",
    "ReplicaConfig",
    "ReplicaEngine",
    "ReplicaThread",
    "TokenChunk",
    "TraceError",
    "TraceRequest",
    "VirtualCall",
    "VirtualResult",
    "available_configs",
    "compress",
    "create_replica_app",
    "default_perf_model_path",
    "estimate_prompt_tokens",
    "load_azure_trace",
    "load_perf_model",
    "serve_replica",
    "simulate",
    "synthetic_trace",
]
