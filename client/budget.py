"""The hedge budget: a token bucket that bounds how often calls may hedge.

Each call deposits ``budget`` tokens (the bucket holds at most ``burst``); a hedge withdraws one
whole token. Over N calls at most ``budget * N + burst`` hedges can happen, whatever the latency
distribution does, which is the safety bound that keeps a slow upstream from doubling the load
(the retry-budget idea of Finagle's ``RetryBudget``; Dean & Barroso, "The Tail at Scale", CACM
2013, for hedging at a few percent of extra requests). Worked number: budget 0.10, burst 10,
1,000 calls → at most 110 hedges.

Deposits are float sums, and ten deposits of 0.1 add up to 0.9999999999999999, not 1: a whole
token is therefore "at least 1 − 1e-9", so that budget 0.1 grants exactly one hedge per ten calls.
"""

from __future__ import annotations

import math
import threading

__all__ = ["FailoverBudget", "HedgeBudget"]

#: Rounding slack when checking for a whole token (float sums of fractions fall short of 1).
_WHOLE_TOKEN = 1.0 - 1e-9


class HedgeBudget:
    """A token bucket for hedges (thread-safe: sync and async calls of one transport share it).

    Args:
        budget: tokens deposited per call, a fraction in [0, 1].
        burst: capacity of the bucket (how many hedges may happen back to back), >= 0; the
            bucket starts full. A burst below 1 never grants a hedge.

    Raises:
        ValueError: naming the argument, for a value that is not a finite number in range.
    """

    def __init__(self, budget: float, burst: float) -> None:
        if not _finite(budget) or not 0.0 <= budget <= 1.0:
            raise ValueError(f"HedgeBudget.budget: must be a fraction in [0, 1], got {budget!r}")
        if not _finite(burst) or burst < 0:
            raise ValueError(f"HedgeBudget.burst: must be a finite number >= 0, got {burst!r}")
        self.budget = float(budget)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        """Tokens currently in the bucket."""
        return self._tokens

    def deposit(self) -> None:
        """Record one call: add ``budget`` tokens, capped at ``burst``."""
        with self._lock:
            self._tokens = min(self.burst, self._tokens + self.budget)

    def try_withdraw(self) -> bool:
        """Take one token for a hedge; return False (and take nothing) when less than one is left."""
        with self._lock:
            if self._tokens >= _WHOLE_TOKEN:
                self._tokens = max(0.0, self._tokens - 1.0)
                return True
            return False


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class FailoverBudget:
    """The retry budget of failovers: a token bucket that cuts failovers off while upstreams fail.

    The retry throttling of gRPC (gRFC A6, "Client Retries": ``maxTokens``, ``tokenRatio``): the
    bucket starts full at ``max_tokens``; every failed attempt takes one token, every call that
    got a first token gives back ``token_ratio``; a failover is allowed only while more than half
    of ``max_tokens`` is left. So failovers flow while the recent failure share is low (below
    about ``token_ratio / (1 + token_ratio)``, 9% at the default ratio) and stop once every
    upstream fails, and an outage never multiplies the requests: after the first few calls each
    call makes one request. Separate from the hedge budget (:class:`HedgeBudget`).

    Args:
        max_tokens: capacity, > 0 (default 10: after an outage starts, at most ~5 failovers).
        token_ratio: tokens a successful call returns, in (0, 1] (default 0.1).

    Raises:
        ValueError: naming the argument, for a value that is not a finite number in range.
    """

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        if not _finite(max_tokens) or max_tokens <= 0:
            raise ValueError(f"FailoverBudget.max_tokens: must be a finite number > 0, got {max_tokens!r}")
        if not _finite(token_ratio) or not 0.0 < token_ratio <= 1.0:
            raise ValueError(f"FailoverBudget.token_ratio: must be a number in (0, 1], got {token_ratio!r}")
        self.max_tokens = float(max_tokens)
        self.token_ratio = float(token_ratio)
        self._tokens = float(max_tokens)
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        """Tokens currently in the bucket."""
        return self._tokens

    def record_failure(self) -> None:
        """One attempt failed before its first token (a retryable failure): take one token."""
        with self._lock:
            self._tokens = max(0.0, self._tokens - 1.0)

    def record_success(self) -> None:
        """One call got its first token: give back ``token_ratio`` tokens (capped at ``max_tokens``)."""
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def allows_failover(self) -> bool:
        """Whether a failover may be sent now (more than half of ``max_tokens`` left)."""
        return self._tokens > self.max_tokens / 2.0
