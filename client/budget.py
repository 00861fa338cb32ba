"""The hedge budget: a token bucket that bounds how often calls may hedge.

Each call deposits ``budget`` tokens (the bucket holds at most ``burst``); a hedge withdraws one
whole token. Over N calls at most ``budget * N + burst`` hedges can happen, whatever the latency
distribution does, which is the safety bound that keeps a slow upstream from doubling the load
(the retry-budget idea of Finagle's ``RetryBudget``; Dean & Barroso, "The Tail at Scale", CACM
2013, for hedging at a few percent of extra requests). Worked number: budget 0.10, burst 10,
1,000 calls → at most 110 hedges.
"""

from __future__ import annotations

__all__ = ["HedgeBudget"]


class HedgeBudget:
    """A token bucket for hedges (not thread-safe; one per event loop).

    Args:
        budget: tokens deposited per call, a fraction in [0, 1].
        burst: capacity of the bucket; the bucket starts full.
    """

    def __init__(self, budget: float, burst: float) -> None:
        self.budget = float(budget)
        self.burst = float(burst)
        self._tokens = float(burst)

    @property
    def tokens(self) -> float:
        """Tokens currently in the bucket."""
        return self._tokens

    def deposit(self) -> None:
        """Record one call: add ``budget`` tokens, capped at ``burst``."""
        self._tokens = min(self.burst, self._tokens + self.budget)

    def try_withdraw(self) -> bool:
        """Take one token for a hedge; return False (and take nothing) when fewer than one is left."""
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
