"""hedgerow.client: the hedging client (depends on httpx and httpx-sse only; apps embed it).

See ``hedgerow.client.hedging`` for the semantics of one call and the failure-mode table.
"""

from hedgerow.client.errors import AllAttemptsFailed, HedgeError, StallTimeout, TotalTimeout, UpstreamError
from hedgerow.client.records import AttemptRecord, CallRecord

__all__ = [
    "AttemptRecord",
    "CallRecord",
    "HedgeError",
    "UpstreamError",
    "AllAttemptsFailed",
    "StallTimeout",
    "TotalTimeout",
]
