"""The client's configuration objects: ``Upstream`` (where to send) and ``HedgePolicy`` (when).

Both are frozen dataclasses validated on construction; a bad value raises ``ValueError`` naming
the field, so a typo in configuration fails at start-up rather than on the first slow call.
Durations are float seconds, the budget a fraction of calls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "HedgePolicy", "Upstream"]

#: Default bound (bytes) on one SSE event of a streamed answer (``HedgePolicy.max_event_bytes``):
#: 8 MiB, far above any real chunk (a few hundred bytes; a large tool-call argument or an image
#: in a delta stays well under a megabyte) and small enough that a broken or hostile upstream
#: sending one endless line cannot grow the client's memory without limit.
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Upstream:
    """One OpenAI-compatible endpoint.

    Args:
        name: a short name used in records and logs (``"replica-a"``).
        base_url: the API root ending in ``/v1``; calls go to ``{base_url}/chat/completions``.
        api_key: sent as ``Authorization: Bearer <api_key>`` when set.
        headers: extra headers sent with every request to this upstream.
        model: this upstream's own name for the model; when set, it replaces the body's
            ``model`` in every attempt sent here (``attempt_body``), so one public model name can
            map to a different model name on each upstream. The call's record (and so the
            thresholds) keeps the caller's model name. None (default) sends the body as it is.

    Raises:
        ValueError: for an empty name, a base_url that is not an http(s) URL, or a model that is
            not a non-empty string.
    """

    name: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)  # a key has no place in a log line
    headers: Mapping[str, str] | None = field(default=None, hash=False, compare=False)
    model: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("Upstream.name: must be a non-empty string")
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"Upstream.base_url: must be an http(s) URL, got {self.base_url!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError(f"Upstream.model: must be a non-empty string or None, got {self.model!r}")

    def attempt_body(self, content: bytes) -> bytes:
        """The request body of an attempt sent to this upstream: ``content`` with its ``model``
        replaced by ``self.model`` (the one place where a per-upstream model name is applied).

        Args:
            content: the call's JSON request body, as sent to every upstream.

        Returns:
            ``content`` itself when ``model`` is None, when the body already names that model, or
            when it is not a JSON object (the upstream then answers it as it would anyway); else
            the body re-encoded (compact, UTF-8) with ``"model": self.model``.
        """
        if self.model is None:
            return content
        try:
            body = json.loads(content)
        except ValueError:
            return content
        if not isinstance(body, dict) or body.get("model") == self.model:
            return content
        body["model"] = self.model
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    @property
    def chat_url(self) -> str:
        """The chat-completions URL of this upstream."""
        return self.base_url.rstrip("/") + "/chat/completions"

    @property
    def responses_url(self) -> str:
        """The Responses API URL of this upstream (``POST {base_url}/responses``)."""
        return self.base_url.rstrip("/") + "/responses"


@dataclass(frozen=True, slots=True)
class HedgePolicy:
    """When and how often a call may hedge.

    Args:
        hedge_after_s: send a backup when the primary has produced no first token this many
            seconds after it was sent (used when no polled threshold applies). Default 2.0 s.
        max_backups: largest number of extra attempts per call (hedge or failover). Default 1.
            The hedge timer fires once per call, so at most one attempt is a hedge; further
            backups (with ``max_backups > 1`` and more upstreams) come only from failovers.
        budget: long-run fraction of calls allowed to hedge (token bucket refill per call).
            Default 0.10. Failovers do not spend it.
        budget_burst: token bucket capacity, i.e. how many hedges may happen back to back.
            Default 10.
        stall_timeout_s: after the first token, the largest gap between chunks before the call
            fails with ``StallTimeout``; None disables the check.
        total_timeout_s: bound on the whole call, seconds. Default 120.
        connect_timeout_s: TCP/TLS connect timeout of each attempt. Default 5.
        max_event_bytes: the largest SSE event (bytes of the stream between two blank lines, so
            also the longest line) an attempt may send; a larger one fails the attempt with
            ``error_type`` ``event_too_large`` (before the first token: failover; after it:
            ``StreamError``). A whole non-streaming response body counts as one event: larger
            fails that attempt with ``body_too_large``. Default ``DEFAULT_MAX_EVENT_BYTES`` (8 MiB).
        failover_budget_tokens: capacity of the failover retry budget (``FailoverBudget``:
            each failed attempt takes a token, each answered call returns
            ``failover_token_ratio``; failovers only while more than half is left). Default 10.
        failover_token_ratio: tokens an answered call returns to that budget, in (0, 1].
            Default 0.1 (failovers flow while under ~9% of attempts fail).

    Raises:
        ValueError: naming the field, for a negative, NaN or otherwise impossible value.
    """

    hedge_after_s: float = 2.0
    max_backups: int = 1
    budget: float = 0.10
    budget_burst: float = 10
    stall_timeout_s: float | None = None
    total_timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    failover_budget_tokens: float = 10.0
    failover_token_ratio: float = 0.1

    def __post_init__(self) -> None:
        _seconds("hedge_after_s", self.hedge_after_s, allow_zero=True)
        if isinstance(self.max_backups, bool) or not isinstance(self.max_backups, int) or self.max_backups < 0:
            raise ValueError(f"HedgePolicy.max_backups: must be an integer >= 0, got {self.max_backups!r}")
        if not _finite(self.budget) or not 0.0 <= self.budget <= 1.0:
            raise ValueError(f"HedgePolicy.budget: must be a fraction in [0, 1], got {self.budget!r}")
        if not _finite(self.budget_burst) or self.budget_burst < 0:
            raise ValueError(f"HedgePolicy.budget_burst: must be >= 0, got {self.budget_burst!r}")
        if self.stall_timeout_s is not None:
            _seconds("stall_timeout_s", self.stall_timeout_s)
        _seconds("total_timeout_s", self.total_timeout_s)
        _seconds("connect_timeout_s", self.connect_timeout_s)
        if (
            isinstance(self.max_event_bytes, bool)
            or not isinstance(self.max_event_bytes, int)
            or self.max_event_bytes < 1
        ):
            raise ValueError(f"HedgePolicy.max_event_bytes: must be an integer >= 1, got {self.max_event_bytes!r}")
        if not _finite(self.failover_budget_tokens) or self.failover_budget_tokens <= 0:
            raise ValueError(
                f"HedgePolicy.failover_budget_tokens: must be a finite number > 0, got {self.failover_budget_tokens!r}"
            )
        if not _finite(self.failover_token_ratio) or not 0.0 < self.failover_token_ratio <= 1.0:
            raise ValueError(
                f"HedgePolicy.failover_token_ratio: must be a number in (0, 1], got {self.failover_token_ratio!r}"
            )


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _seconds(name: str, value: object, allow_zero: bool = False) -> None:
    if not _finite(value) or value < 0 or (value == 0 and not allow_zero):  # type: ignore[operator]
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"HedgePolicy.{name}: must be a finite number of seconds {bound}, got {value!r}")
