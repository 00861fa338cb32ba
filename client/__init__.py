"""hedgerow.client: the hedging client (depends on httpx and orjson only; apps embed it).

``HedgingClient`` streams a chat completion from a primary upstream and hedges to a backup when
the first token is late; ``ThresholdPoller`` keeps measured thresholds fresh; ``TelemetryExporter``
ships one ``CallRecord`` per call to the api; ``HedgingTransport`` hedges the openai SDK's calls
as an httpx transport. See ``hedgerow.client.hedging`` for the semantics
of one call and the table of failure modes.
"""

from hedgerow.client._responses import ResponsesAssembler
from hedgerow.client.budget import FailoverBudget, HedgeBudget
from hedgerow.client.chunks import AnswerAssembler, ChunkKind, classify_chunk
from hedgerow.client.errors import (
    AllAttemptsFailed,
    AttemptError,
    EventTooLarge,
    HedgeError,
    StallTimeout,
    StreamError,
    TotalTimeout,
    UpstreamError,
)
from hedgerow.client.hedging import CallStream, ChatResult, HedgingClient, ResponsesResult
from hedgerow.client.policy import HedgePolicy, Upstream
from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.client.telemetry import TelemetryExporter
from hedgerow.client.thresholds import ThresholdPoller
from hedgerow.client.transport import HedgingTransport

__all__ = [
    "AllAttemptsFailed",
    "AnswerAssembler",
    "AttemptError",
    "AttemptRecord",
    "CallRecord",
    "CallStream",
    "ChatResult",
    "ChunkKind",
    "EventTooLarge",
    "FailoverBudget",
    "HedgeBudget",
    "HedgeError",
    "HedgePolicy",
    "HedgingClient",
    "HedgingTransport",
    "ResponsesAssembler",
    "ResponsesResult",
    "StallTimeout",
    "StreamError",
    "TelemetryExporter",
    "ThresholdPoller",
    "TotalTimeout",
    "Upstream",
    "UpstreamError",
    "classify_chunk",
]
