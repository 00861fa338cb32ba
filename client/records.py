"""The call record: one per call, the wire format shared by the client, the api and the store.

This module is the single definition of the record (docs/DESIGN.md "CallRecord"); the api validates
incoming JSON with a pydantic schema built to match it, and a test round-trips a record through
both. Times inside a record are float seconds from ``started_at`` (a timezone-aware UTC datetime,
ISO 8601 with ``Z`` on the wire).

Every string of a record (names, ids, ``client``, ``error_type``) is 1..200 characters of
printable text: the C0 control characters U+0000-U+001F and DEL U+007F are refused (PostgreSQL
cannot store U+0000; the others have no place in a name), by :meth:`CallRecord.from_dict` and by
the api alike (:func:`control_character_error`). ``route`` and ``model`` follow the stricter rule
of route and model names (:mod:`hedgerow.client.names`: no control or format characters, no
blank name, no whitespace at either end; a route not ending in ``/history``).

An attempt's TTFT is ``first_token_s - start_s``. A cancelled attempt with no first token is
*censored*: all we know is that its TTFT exceeds ``end_s - start_s``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from hedgerow.client.names import MAX_NAME_CHARS, model_name_error, route_name_error

__all__ = [
    "ATTEMPT_OUTCOMES",
    "ATTEMPT_ROLES",
    "CALL_APIS",
    "CALL_STATUSES",
    "HEDGE_REASONS",
    "MAX_COUNT",
    "MAX_NAME_CHARS",
    "MAX_SECONDS",
    "RECORD_VERSION",
    "AttemptRecord",
    "CallApi",
    "CallRecord",
    "attempt_prompt_tokens",
    "check_consistency",
    "control_character_error",
    "estimate_prompt_tokens",
    "format_timestamp",
    "parse_timestamp",
    "with_prompt_estimates",
]

CallStatus = Literal["ok", "error", "timeout", "stalled", "cancelled"]
HedgeReason = Literal["ttft_timeout", "primary_error"]
AttemptOutcome = Literal["won", "cancelled", "failed"]
AttemptRole = Literal["primary", "backup"]
CallApi = Literal["chat", "responses"]

CALL_STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "stalled", "cancelled")
CALL_APIS: tuple[str, ...] = ("chat", "responses")
HEDGE_REASONS: tuple[str, ...] = ("ttft_timeout", "primary_error")
ATTEMPT_OUTCOMES: tuple[str, ...] = ("won", "cancelled", "failed")
ATTEMPT_ROLES: tuple[str, ...] = ("primary", "backup")

#: Largest accepted token count or threshold version (what a 32-bit SQL integer holds).
MAX_COUNT = 2**31 - 1
#: Largest accepted duration, seconds (one day: no call of an LLM API lasts longer).
MAX_SECONDS = 86_400.0
#: Version of the record wire format this module writes. Version 2 added the attempts' prompt
#: token fields (``prompt_tokens``, ``prompt_tokens_estimated``, ``cached_prompt_tokens``) and
#: ``record_version`` itself; a record without ``record_version`` is version 1 and still accepted
#: (its attempts' prompt tokens are then estimated by :func:`attempt_prompt_tokens`).
RECORD_VERSION = 2
#: Every version :meth:`CallRecord.from_dict` accepts.
RECORD_VERSIONS: tuple[int, ...] = (1, 2)
#: Characters refused in every stored string: the C0 controls U+0000-U+001F and DEL U+007F.
#: PostgreSQL cannot store U+0000 in text at all; the others (newline, tab, escape, ...) have no
#: place in a name or a short error tag and would corrupt log lines and tables that print them.
_CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f]")


def control_character_error(value: str) -> str | None:
    """Why ``value`` may not be stored, or None when it holds no control character.

    Every string of a call record (and of a route's configuration: route, model, actor) is
    checked with this one rule, by :meth:`CallRecord.from_dict`, the api's schemas and its path
    and query parameters, so they all agree.

    Args:
        value: the text to check.

    Returns:
        None, or a message naming the first offending character and its position, e.g.
        ``"must not contain control characters (U+0000-U+001F, U+007F): U+0000 at index 3"``.
    """
    found = _CONTROL_CHARACTERS.search(value)
    if found is None:
        return None
    return (
        f"must not contain control characters (U+0000-U+001F, U+007F): "
        f"U+{ord(found.group()):04X} at index {found.start()}"
    )


def format_timestamp(value: datetime) -> str:
    """Render an aware datetime as ISO 8601 UTC with microseconds and a ``Z`` suffix.

    Raises:
        ValueError: if ``value`` is naive (has no timezone).
    """
    if value.tzinfo is None:
        raise ValueError("timestamp must be timezone-aware (UTC)")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(text: str) -> datetime:
    """Parse an ISO 8601 timestamp with a zone (``Z`` or ``+hh:mm``) into an aware UTC datetime.

    Raises:
        ValueError: if the text is not ISO 8601, carries no timezone, or is out of range.
    """
    value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if value.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no timezone")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"timestamp {text!r} is out of range") from None
    if not 1970 <= utc.year <= 9000:
        raise ValueError(f"timestamp {text!r} is out of range (years 1970 to 9000)")
    return utc


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One HTTP request of a call to one upstream.

    Attributes:
        upstream: the upstream's name.
        role: ``primary`` or ``backup``.
        start_s: when the request was sent, seconds from the call's start.
        first_token_s: when its first token arrived (seconds from the call's start), or None.
        end_s: when the attempt ended (finished, cancelled or failed), seconds from the call's start.
        outcome: ``won`` (produced the first token first), ``cancelled`` or ``failed``.
        status_code: HTTP status of the response, None if no response headers arrived.
        error_type: short machine name of the failure (``ConnectError``, ``http_503``, ...), or None.
        completion_tokens: tokens this attempt generated (from usage, else counted chunks).
        prompt_tokens: prompt tokens this attempt cost (the upstream prefilled them), from its
            own usage chunk; else estimated (see :func:`attempt_prompt_tokens`); None when
            unknown (a version 1 record: the store applies the estimate at ingest).
        prompt_tokens_estimated: True when ``prompt_tokens`` is the call's prompt tokens
            standing in for a usage this attempt never reported.
        cached_prompt_tokens: of ``prompt_tokens``, those the upstream reported as read from
            its prompt cache (``usage.prompt_tokens_details.cached_tokens``), or None.
    """

    upstream: str
    role: AttemptRole
    start_s: float
    first_token_s: float | None
    end_s: float
    outcome: AttemptOutcome
    status_code: int | None = None
    error_type: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    prompt_tokens_estimated: bool = False
    cached_prompt_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        """This attempt's own TTFT (from its send), or None if it produced no token."""
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def censored(self) -> bool:
        """True when the attempt was cancelled before its first token (TTFT only bounded below)."""
        return self.outcome == "cancelled" and self.first_token_s is None

    def to_dict(self) -> dict[str, Any]:
        """The attempt as a JSON-ready dict in the wire format."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CallRecord:
    """Everything measured about one call (docs/DESIGN.md "CallRecord"); exactly one per call.

    Attributes:
        request_id: unique id of the call (also the ``Idempotency-Key`` sent upstream).
        route: the app's logical name for this kind of call.
        model: the ``model`` of the request body.
        started_at: aware UTC datetime when the call started.
        client: a free tag naming the calling host or app.
        hedge_after_s: the threshold in force for this call, seconds.
        threshold_version: version of the polled threshold used, or None for the policy default.
        hedged: True if a backup attempt was started (hedge or failover).
        hedge_reason: ``ttft_timeout`` (hedge), ``primary_error`` (failover) or None.
        hedge_denied: True if a hedge was due but the budget refused it.
        failover_denied: True if a failover was due but the failover retry budget refused it
            (``FailoverBudget``: upstreams were failing); absent in older records (False).
        winner: role of the attempt that produced the first token, or None.
        status: ``ok``, ``error``, ``timeout``, ``stalled`` or ``cancelled``.
        error_type: short machine name of the failure, or None.
        ttft_s, ttfo_s, tpot_s, e2e_s, max_itl_s: the call's latencies in seconds (None if unknown).
        prompt_tokens, completion_tokens: from the winner's usage chunk (counted chunks otherwise).
        wasted_completion_tokens: tokens generated by losing attempts.
        attempts: the attempts in start order.
        api: the API of the call: ``chat`` (chat completions) or ``responses`` (the Responses
            API). On the wire only a ``responses`` record carries the field (absent = ``chat``),
            so chat records keep the format stores before it accept.
        record_version: the wire format version (:data:`RECORD_VERSION`; 1 when a received
            record does not carry the field).
    """

    request_id: str
    route: str
    model: str
    started_at: datetime
    client: str | None = None
    hedge_after_s: float | None = None
    threshold_version: int | None = None
    hedged: bool = False
    hedge_reason: HedgeReason | None = None
    hedge_denied: bool = False
    failover_denied: bool = False
    winner: AttemptRole | None = None
    status: CallStatus = "ok"
    error_type: str | None = None
    ttft_s: float | None = None
    ttfo_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    max_itl_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    wasted_completion_tokens: int = 0
    attempts: tuple[AttemptRecord, ...] = field(default_factory=tuple)
    api: CallApi = "chat"
    record_version: int = RECORD_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict in the wire format (timestamps as ISO 8601 ``Z``)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.api == "chat":
            del out["api"]
        out["started_at"] = format_timestamp(self.started_at)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CallRecord:
        """Build a record from its wire-format dict, checking every field.

        Raises:
            ValueError: naming the first bad field (``attempts[1].start_s: must be a finite number``).
        """
        if not isinstance(data, dict):
            raise ValueError("record: must be a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{min(unknown)}: unknown field")
        kwargs: dict[str, Any] = {}
        for name in ("request_id", "route", "model"):
            kwargs[name] = _text(data, name, required=True)
        for name, rule in (("route", route_name_error), ("model", model_name_error)):
            problem = rule(kwargs[name])  # the one name rule (hedgerow.client.names)
            if problem is not None:
                raise ValueError(f"{name}: {problem}")
        try:
            kwargs["started_at"] = parse_timestamp(_text(data, "started_at", required=True))
        except ValueError as exc:
            raise ValueError(f"started_at: {exc}") from None
        kwargs["client"] = _text(data, "client")
        for name in ("hedge_after_s", "ttft_s", "ttfo_s", "tpot_s", "e2e_s", "max_itl_s"):
            kwargs[name] = _seconds(data, name)
        for name in ("threshold_version", "prompt_tokens", "completion_tokens"):
            kwargs[name] = _count(data, name)
        kwargs["wasted_completion_tokens"] = _count(data, "wasted_completion_tokens") or 0
        for name in ("hedged", "hedge_denied", "failover_denied"):
            value = data.get(name, False)
            if not isinstance(value, bool):
                raise ValueError(f"{name}: must be true or false")
            kwargs[name] = value
        kwargs["hedge_reason"] = _choice(data, "hedge_reason", HEDGE_REASONS)
        kwargs["winner"] = _choice(data, "winner", ATTEMPT_ROLES)
        kwargs["status"] = _choice(data, "status", CALL_STATUSES) or "ok"
        kwargs["error_type"] = _text(data, "error_type")
        kwargs["api"] = _choice(data, "api", CALL_APIS) or "chat"
        raw_attempts = data.get("attempts", [])
        if not isinstance(raw_attempts, list):
            raise ValueError("attempts: must be a list")
        attempts = []
        for i, raw in enumerate(raw_attempts):
            try:
                attempts.append(_attempt_from_dict(raw))
            except ValueError as exc:
                raise ValueError(f"attempts[{i}].{exc}") from None
        kwargs["attempts"] = tuple(attempts)
        version = data.get("record_version", 1)
        if isinstance(version, bool) or version not in RECORD_VERSIONS:
            raise ValueError(f"record_version: must be one of {', '.join(map(str, RECORD_VERSIONS))}")
        kwargs["record_version"] = version
        record = cls(**kwargs)
        check_consistency(record)
        return record


def check_consistency(record: CallRecord) -> None:
    """Check that a record does not contradict itself.

    Each attempt: ``start_s <= first_token_s <= end_s`` (when it has a first token) and
    ``start_s <= end_s``; the call: a ``winner`` has a matching attempt that ``won``, a
    ``hedged`` call has a backup attempt and a ``hedge_reason``, ``ttft_s <= e2e_s``.

    Raises:
        ValueError: naming the field (``attempts[0].end_s: ...``).
    """
    for i, attempt in enumerate(record.attempts):
        if attempt.end_s < attempt.start_s:
            raise ValueError(f"attempts[{i}].end_s: before its start_s")
        first = attempt.first_token_s
        if first is not None and not attempt.start_s <= first <= attempt.end_s:
            raise ValueError(f"attempts[{i}].first_token_s: must lie between start_s and end_s")
        cached = attempt.cached_prompt_tokens
        if cached is not None and attempt.prompt_tokens is not None and cached > attempt.prompt_tokens:
            raise ValueError(f"attempts[{i}].cached_prompt_tokens: more than its prompt_tokens")
    if record.winner is not None and not any(a.role == record.winner and a.outcome == "won" for a in record.attempts):
        raise ValueError(f"winner: no {record.winner} attempt with outcome won")
    if record.hedged and not any(a.role == "backup" for a in record.attempts):
        raise ValueError("hedged: true but there is no backup attempt")
    if record.hedged and record.hedge_reason is None:
        raise ValueError("hedge_reason: required when hedged is true")
    if record.ttft_s is not None and record.e2e_s is not None and record.ttft_s > record.e2e_s:
        raise ValueError("ttft_s: greater than e2e_s")


def estimate_prompt_tokens(
    own: int | None, own_estimated: bool, status_code: int | None, call_prompt_tokens: int | None
) -> tuple[int, bool]:
    """The prompt tokens one attempt cost, and whether that number is an estimate.

    The one rule (docs/DESIGN.md "CallRecord"), applied by the client when it builds a record, by the
    store to version 1 records and by the rollups to attempts stored before that rule existed:
    the attempt's own prompt tokens (from its usage chunk) when it has them; else, for an attempt
    the upstream accepted (its response headers arrived with a 2xx status: the prefill began),
    the call's prompt tokens (a backup re-sends the whole prompt), flagged as an estimate; else 0
    (a refused connection, or an error status such as 429/503 that upstreams do not bill).

    Args:
        own: the attempt's own ``prompt_tokens`` (None when it reported none).
        own_estimated: whether ``own`` is itself an estimate.
        status_code: the attempt's HTTP status, None when no response headers arrived.
        call_prompt_tokens: the call's ``prompt_tokens`` (None when unknown).

    Returns:
        ``(prompt_tokens, estimated)``.
    """
    if own is not None:
        return own, own_estimated
    if status_code is not None and 200 <= status_code < 300 and call_prompt_tokens is not None:
        return call_prompt_tokens, True
    return 0, False


def attempt_prompt_tokens(record: CallRecord, attempt: AttemptRecord) -> tuple[int, bool]:
    """:func:`estimate_prompt_tokens` for one attempt of a record: ``(prompt_tokens, estimated)``."""
    return estimate_prompt_tokens(
        attempt.prompt_tokens, attempt.prompt_tokens_estimated, attempt.status_code, record.prompt_tokens
    )


def with_prompt_estimates(record: CallRecord) -> CallRecord:
    """The record with every attempt's ``prompt_tokens`` set by :func:`attempt_prompt_tokens`.

    Attempts that already carry ``prompt_tokens`` are kept as they are; the others get the
    estimate (``prompt_tokens_estimated`` true when it is one). Pure; returns ``record`` itself
    when nothing changes.
    """
    attempts = []
    changed = False
    for attempt in record.attempts:
        if attempt.prompt_tokens is not None:
            attempts.append(attempt)
            continue
        tokens, estimated = attempt_prompt_tokens(record, attempt)
        attempts.append(replace(attempt, prompt_tokens=tokens, prompt_tokens_estimated=estimated))
        changed = True
    return replace(record, attempts=tuple(attempts)) if changed else record


def _attempt_from_dict(data: Any) -> AttemptRecord:
    if not isinstance(data, dict):
        raise ValueError("attempt: must be a JSON object")
    unknown = set(data) - set(AttemptRecord.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{min(unknown)}: unknown field")
    start_s = _seconds(data, "start_s", required=True)
    end_s = _seconds(data, "end_s", required=True)
    first = _seconds(data, "first_token_s")
    return AttemptRecord(
        upstream=_text(data, "upstream", required=True),
        role=_choice(data, "role", ATTEMPT_ROLES, required=True),
        start_s=start_s,
        first_token_s=first,
        end_s=end_s,
        outcome=_choice(data, "outcome", ATTEMPT_OUTCOMES, required=True),
        status_code=_status_code(data),
        error_type=_text(data, "error_type"),
        completion_tokens=_count(data, "completion_tokens") or 0,
        prompt_tokens=_count(data, "prompt_tokens"),
        prompt_tokens_estimated=_flag(data, "prompt_tokens_estimated"),
        cached_prompt_tokens=_count(data, "cached_prompt_tokens"),
    )


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be true or false")
    return value


def _text(data: dict[str, Any], name: str, required: bool = False) -> Any:
    value = data.get(name)
    if value is None:
        if required:
            raise ValueError(f"{name}: field required")
        return None
    if not isinstance(value, str) or (required and not value):
        raise ValueError(f"{name}: must be a non-empty string" if required else f"{name}: must be a string")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{name}: longer than {MAX_NAME_CHARS} characters")
    problem = control_character_error(value)
    if problem is not None:
        raise ValueError(f"{name}: {problem}")
    return value


def _seconds(data: dict[str, Any], name: str, required: bool = False) -> Any:
    value = data.get(name)
    if value is None:
        if required:
            raise ValueError(f"{name}: field required")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: must be a finite number of seconds >= 0")
    if value > MAX_SECONDS:
        raise ValueError(f"{name}: more than {MAX_SECONDS:g} seconds")
    return float(value)


def _count(data: dict[str, Any], name: str) -> Any:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{name}: must be an integer in [0, {MAX_COUNT}]")
    return value


def _status_code(data: dict[str, Any]) -> Any:
    value = data.get("status_code")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 599:
        raise ValueError("status_code: must be an HTTP status in [100, 599]")
    return value


def _choice(data: dict[str, Any], name: str, allowed: tuple[str, ...], required: bool = False) -> Any:
    value = data.get(name)
    if value is None:
        if required:
            raise ValueError(f"{name}: field required")
        return None
    if value not in allowed:
        raise ValueError(f"{name}: must be one of {', '.join(allowed)}")
    return value
