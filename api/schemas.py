"""Pydantic schemas of the api: the call record wire format and every response body.

``CallRecordIn`` accepts exactly what :meth:`hedgerow.client.records.CallRecord.from_dict`
accepts (same fields, same types, same defaults; unknown fields are refused); a test round-trips
records through both. Durations are float seconds >= 0; timestamps ISO 8601 with a zone.
The limits (name length, largest count and duration) are those of ``hedgerow.client.records``;
the checks across fields are the same rule as ``CallRecord.from_dict``'s
(:func:`hedgerow.client.records.check_consistency`), run by a model validator, so a batch is
validated once, straight from the request bytes (``CallBatchIn.model_validate_json``), and each
record is one pydantic object from the wire to the store.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    computed_field,
    field_validator,
    model_validator,
)

from hedgerow.client.names import HISTORY_SUFFIX, MAX_NAME_CHARS, model_name_error, route_name_error
from hedgerow.client.records import (
    MAX_COUNT,
    MAX_SECONDS,
    check_consistency,
    control_character_error,
    parse_timestamp,
)
from hedgerow.controller.ops_bounds import budget_range_error
from hedgerow.controller.policy.explain import explain_history_row

if TYPE_CHECKING:
    from hedgerow.client.records import CallRecord

__all__ = [
    "HISTORY_SUFFIX",
    "MAX_FUTURE_S",
    "AttemptIn",
    "CallBatchIn",
    "CallRecordIn",
    "ControllerRunOut",
    "ErrorDetail",
    "HealthOut",
    "HistoryOut",
    "HistoryRowOut",
    "IngestOut",
    "ModelName",
    "ReadyOut",
    "RouteChangeOut",
    "RouteListOut",
    "RouteName",
    "RouteOut",
    "RoutePatchIn",
    "RoutePutIn",
    "ThresholdOut",
    "ThresholdTableOut",
    "no_control_characters",
    "valid_model_name",
    "valid_route_name",
]


def _timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        # pydantic turns a ValueError (not a TypeError) into a field error
        raise ValueError("must be an ISO 8601 timestamp string with a timezone")
    return parse_timestamp(value)


def no_control_characters(value: str) -> str:
    """Return ``value`` unchanged, or raise when it holds a control character.

    Raises:
        ValueError: naming the character and its index
            (:func:`hedgerow.client.records.control_character_error`).
    """
    problem = control_character_error(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: Validation of every stored string: no C0 control character nor DEL (see
#: :func:`hedgerow.client.records.control_character_error`).
Printable = AfterValidator(no_control_characters)
#: Latest ``started_at`` accepted, seconds after the server's clock (generous clock skew).
MAX_FUTURE_S = 86_400.0
#: Most attempts one call record may carry (a call makes 1 + ``max_backups`` attempts).
MAX_ATTEMPTS_PER_CALL = 64
#: The same rule as a JSON Schema ``pattern`` (documentation: the check is :data:`Printable`'s).
PRINTABLE_PATTERN = "^[^\\u0000-\\u001f\\u007f]*$"
_PRINTABLE_SCHEMA = Field(json_schema_extra={"pattern": PRINTABLE_PATTERN})
#: Part of the name rule as a JSON Schema ``pattern``: no C0/C1 control character, no line or
#: paragraph separator, no bidirectional override or isolate, no BOM. Documentation only: the
#: check is :mod:`hedgerow.client.names`'s, which refuses more (every format character, blank
#: names, whitespace at either end), as the description says.
NAME_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f\\u2028-\\u202e\\u2066-\\u2069\\ufeff]+$"
#: The name rule in words, for the OpenAPI descriptions.
NAME_RULE = (
    "1 to 200 characters; no control or format characters (Unicode Cc, Cf, Cs, Zl, Zp: newline, "
    "tab, U+2028, bidirectional overrides, zero-width characters); not blank; no whitespace at "
    "either end"
)


def valid_route_name(value: str) -> str:
    """Return ``value`` when it is a valid route name (:func:`hedgerow.client.names.route_name_error`).

    Raises:
        ValueError: saying what is wrong (pydantic makes it a field error: a 422 naming the field).
    """
    problem = route_name_error(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def valid_model_name(value: str) -> str:
    """Return ``value`` when it is a valid model name (:func:`hedgerow.client.names.model_name_error`).

    Raises:
        ValueError: saying what is wrong (pydantic makes it a field error: a 422 naming the field).
    """
    problem = model_name_error(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: A route name in a request body (:mod:`hedgerow.client.names`).
RouteName = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description=f"route name: {NAME_RULE}; not ending in /history",
        json_schema_extra={"pattern": NAME_PATTERN},
    ),
    AfterValidator(valid_route_name),
]
#: A model name in a request body (:mod:`hedgerow.client.names`).
ModelName = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description=f"model name: {NAME_RULE}",
        json_schema_extra={"pattern": NAME_PATTERN},
    ),
    AfterValidator(valid_model_name),
]


def not_null_in_schema(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of an optional field that may be omitted but not sent as null."""
    alternatives = [s for s in schema.pop("anyOf", []) if s.get("type") != "null"]
    if len(alternatives) == 1:
        schema.update(alternatives[0])
    if schema.get("default", ...) is None:
        del schema["default"]


def _none_to(default: Any, accepted: Any) -> BeforeValidator:
    """A validator reading JSON null as ``default``; the schema says ``accepted`` or null, as accepted."""
    return BeforeValidator(lambda value: default if value is None else value, json_schema_input_type=accepted | None)


def _not_a_bool(value: Any) -> Any:
    """Refuse JSON ``true``/``false`` where a number is meant (a ``Literal[1, 2]`` takes ``true`` as 1)."""
    if isinstance(value, bool):
        raise ValueError("must be one of 1, 2")
    return value


CallStatusIn = Literal["ok", "error", "timeout", "stalled", "cancelled"]
Seconds = Annotated[float, Field(strict=True, ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT)]
Name = Annotated[StrictStr, Field(min_length=1, max_length=MAX_NAME_CHARS), Printable, _PRINTABLE_SCHEMA]
OptionalText = Annotated[StrictStr, Field(max_length=MAX_NAME_CHARS), Printable, _PRINTABLE_SCHEMA] | None
#: A route setting in seconds: finite, > 0 and at most ``MAX_SECONDS`` (what a call record may
#: carry, so that records of a route always fit its threshold).
RouteSeconds = Annotated[float, Field(strict=True, gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
HttpStatus = Annotated[int, Field(strict=True, ge=100, le=599)]
Timestamp = Annotated[datetime, BeforeValidator(_timestamp)]


class AttemptIn(BaseModel):
    """One attempt of a call (wire format of :class:`hedgerow.client.records.AttemptRecord`)."""

    model_config = ConfigDict(extra="forbid")

    upstream: Name
    role: Literal["primary", "backup"]
    start_s: Seconds
    first_token_s: Seconds | None = None
    end_s: Seconds
    outcome: Literal["won", "cancelled", "failed"]
    status_code: HttpStatus | None = None
    error_type: OptionalText = None
    completion_tokens: Annotated[Count, _none_to(0, Count)] = 0
    prompt_tokens: Count | None = None
    prompt_tokens_estimated: Annotated[StrictBool, _none_to(False, StrictBool)] = False
    cached_prompt_tokens: Count | None = None


class CallRecordIn(BaseModel):
    """One call record (wire format of :class:`hedgerow.client.records.CallRecord`).

    Rules across fields, checked by this schema's validators (422 naming the field): each attempt's
    ``end_s >= start_s`` and ``first_token_s`` (when set) within ``[start_s, end_s]``; a
    ``winner`` needs an attempt of that role with outcome ``won``; ``started_at`` carries a
    timezone, lies in 1970..9000 and at most a day after the server's clock; ``route`` and
    ``model`` follow the name rule (:mod:`hedgerow.client.names`; a route does not end in
    ``/history``); at most 64 attempts; unknown fields are refused. A rule across fields
    fails as a ``value_error`` at the record itself whose message starts with the field's path
    (``attempts[0].end_s: before its start_s``, the message of
    :func:`hedgerow.client.records.check_consistency`).
    """

    model_config = ConfigDict(extra="forbid")

    request_id: Name
    route: RouteName
    model: ModelName
    started_at: Timestamp
    client: OptionalText = None
    hedge_after_s: Seconds | None = None
    threshold_version: Count | None = None
    hedged: StrictBool = False
    hedge_reason: Literal["ttft_timeout", "primary_error"] | None = None
    hedge_denied: StrictBool = False
    failover_denied: StrictBool = False
    winner: Literal["primary", "backup"] | None = None
    status: Annotated[CallStatusIn, _none_to("ok", CallStatusIn)] = "ok"
    error_type: OptionalText = None
    ttft_s: Seconds | None = None
    ttfo_s: Seconds | None = None
    tpot_s: Seconds | None = None
    e2e_s: Seconds | None = None
    max_itl_s: Seconds | None = None
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    wasted_completion_tokens: Annotated[Count, _none_to(0, Count)] = 0
    attempts: list[AttemptIn] = Field(default_factory=list, max_length=MAX_ATTEMPTS_PER_CALL)
    #: The API of the call: chat completions (the default, left out of chat records) or Responses.
    api: Literal["chat", "responses"] = "chat"
    #: Wire format version (``hedgerow.client.records.RECORD_VERSION``); absent means 1.
    record_version: Annotated[Literal[1, 2], BeforeValidator(_not_a_bool)] = 1

    @field_validator("started_at")
    @classmethod
    def _not_far_ahead(cls, value: datetime) -> datetime:
        """Refuse a ``started_at`` more than :data:`MAX_FUTURE_S` after the server's clock."""
        if value > datetime.now(UTC) + timedelta(seconds=MAX_FUTURE_S):
            raise ValueError(f"more than {MAX_FUTURE_S:g} s after the server's clock")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CallRecordIn:
        """The record's rules across fields (:func:`hedgerow.client.records.check_consistency`).

        The schema carries every attribute that function reads, under the same names and types,
        so the one rule is applied to it as it is (no ``CallRecord`` is built).
        """
        check_consistency(cast("CallRecord", self))
        return self


class CallBatchIn(BaseModel):
    """Body of ``POST /v1/calls``: up to ``max_batch_calls`` records."""

    model_config = ConfigDict(extra="forbid")

    calls: list[CallRecordIn]


class IngestOut(BaseModel):
    """Answer of ``POST /v1/calls``: records stored, and records already stored (not re-counted)."""

    accepted: int
    duplicates: int


class ErrorDetail(BaseModel):
    """The ``detail`` of a 422 from ``POST /v1/calls``: which record, which field, what is wrong."""

    index: int | None
    field: str
    message: str


class ThresholdOut(BaseModel):
    """A published threshold of one (route, model)."""

    route: str
    model: str
    hedge_after_s: float
    enabled: bool
    source: str
    version: int
    budget: float
    updated_at: str


class ThresholdTableOut(BaseModel):
    """Body of ``GET /v1/thresholds``; ``generated_at`` is the newest ``updated_at`` (or null)."""

    thresholds: list[ThresholdOut]
    generated_at: str | None


class RouteOut(BaseModel):
    """A route's configuration and its published threshold (null before the first tick);
    ``archived_at``/``archived_by``: when and by whom it was archived (null for a route in use).
    In ``GET /v1/routes`` (routes in use), ``recent_calls`` and ``recent_failed_calls``: its calls
    started in the list's recent window, and those that failed entirely (status error, timeout
    or stalled: the calls explorer's ``outcome=failed``); null elsewhere."""

    route: str
    model: str
    enabled: bool
    budget: float
    default_hedge_after_s: float
    min_hedge_after_s: float
    max_hedge_after_s: float
    pinned_hedge_after_s: float | None
    created_at: str
    updated_at: str
    archived_at: str | None = None
    archived_by: str | None = None
    threshold: ThresholdOut | None
    recent_calls: int | None = None
    recent_failed_calls: int | None = None


class RouteListOut(BaseModel):
    """Body of ``GET /v1/routes``; ``recent_since``/``recent_until``: the window of the routes'
    ``recent_*`` counts (the last hour; null for the archived list)."""

    routes: list[RouteOut]
    recent_since: str | None = None
    recent_until: str | None = None


class HistoryRowOut(BaseModel):
    """One controller decision (quantiles null when the data cannot identify them).

    After the docs/DESIGN.md fields: ``actor`` (who made a manual change, null for the controller job)
    and ``details`` (JSON object or null): ``quantile_lower_bounds_s`` (a lower bound for each
    null quantile), ``target_s``, ``short_window``, ``p99_check`` and, for a ``config`` row,
    ``changes`` (``{"field": {"from": x, "to": y}}``); ``repeats`` (ticks the row stands for:
    identical holds merge into one row) and ``last_at`` (the latest of them; ``computed_at`` is the
    first); last, ``explanation``: the row in plain-English sentences
    (:func:`hedgerow.controller.policy.explain.explain_history_row`), derived from the other fields.
    """

    computed_at: str
    route: str
    model: str
    previous_hedge_after_s: float | None
    hedge_after_s: float
    applied: bool
    reason: str
    source: str
    window_s: float | None
    samples: int
    censored: int
    p50_s: float | None
    p75_s: float | None
    p90_s: float | None
    p95_s: float | None
    p99_s: float | None
    observed_hedge_rate: float | None
    backup_win_rate: float | None
    budget: float
    actor: str | None = None
    details: dict[str, Any] | None = None
    repeats: int = 1
    last_at: str | None = None

    @computed_field(  # type: ignore[prop-decorator]
        description=(
            "The row in plain English: what happened to the value, the binding constraint, the budget"
            " target and bounds, the predicted P99 before and after, the samples, any detected change"
            " and the flags, with their numbers and units."
        ),
        examples=[["The value went down from 30 s to 3.311 s (-89%).", "Binding constraint: cost. ..."]],
    )
    @property
    def explanation(self) -> list[str]:
        """The row's sentences (:func:`~hedgerow.controller.policy.explain.explain_history_row`)."""
        return explain_history_row({name: getattr(self, name) for name in type(self).model_fields})


def _valid_budget(value: float) -> float:
    """``value`` when it is a hedge budget, else ValueError with the routes' own sentence."""
    problem = budget_range_error(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: A route's hedge budget, checked by :func:`~hedgerow.controller.ops_bounds.budget_range_error`
#: (the console, ``routes set`` and ``HEDGEROW_DEFAULT_BUDGET`` give the same sentence); the
#: document states the same open range (0, 1), which tests/api/test_budget_rule.py holds to it.
RouteBudget = Annotated[
    float,
    Field(strict=True, json_schema_extra={"exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    AfterValidator(_valid_budget),
]


class _RouteSettingsIn(BaseModel):
    """The route settings a ``PUT`` or ``PATCH`` of a route takes (see :class:`RoutePatchIn`)."""

    model_config = ConfigDict(extra="forbid")

    enabled: StrictBool | None = Field(None, json_schema_extra=not_null_in_schema)
    budget: RouteBudget | None = Field(None, json_schema_extra=not_null_in_schema)
    default_hedge_after_s: RouteSeconds | None = Field(None, json_schema_extra=not_null_in_schema)
    min_hedge_after_s: RouteSeconds | None = Field(None, json_schema_extra=not_null_in_schema)
    max_hedge_after_s: RouteSeconds | None = Field(None, json_schema_extra=not_null_in_schema)
    pinned_hedge_after_s: RouteSeconds | None = None
    actor: Annotated[StrictStr, Field(min_length=1, max_length=200), Printable, _PRINTABLE_SCHEMA] = "api"


class RoutePatchIn(_RouteSettingsIn):
    """Body of ``PATCH /v1/routes/{route}?model=``: the settings to change (absent = unchanged).

    ``pinned_hedge_after_s: null`` unpins; ``actor`` names who makes the change (audit trail;
    with bearer tokens configured the token's fingerprint is recorded with it). Other fields
    may be omitted but not null.

    Rules across fields, checked on the resulting configuration (422 naming the field):
    ``min_hedge_after_s <= default_hedge_after_s <= max_hedge_after_s``, and a pinned value
    within ``[min_hedge_after_s, max_hedge_after_s]``.

    ``archived``: ``false`` restores an archived route, ``true`` archives it (as ``DELETE``);
    given alone (``actor`` aside), never with a setting.
    """

    archived: StrictBool | None = Field(None, json_schema_extra=not_null_in_schema)


class RoutePutIn(_RouteSettingsIn):
    """Body of ``PUT /v1/routes/{route}?model=``: the whole configuration.

    Same settings as :class:`RoutePatchIn` (not ``archived``), but an omitted field takes the
    server's default for a new route (``HEDGEROW_DEFAULT_*``; unpinned; enabled), and a missing
    route is created.

    Rules across fields, checked on the resulting configuration (422 naming the field):
    ``min_hedge_after_s <= default_hedge_after_s <= max_hedge_after_s``, and a pinned value
    within ``[min_hedge_after_s, max_hedge_after_s]``.
    """


class HistoryOut(BaseModel):
    """Body of ``GET /v1/routes/{route}/history``: newest first."""

    history: list[HistoryRowOut]


class HealthOut(BaseModel):
    """Body of ``GET /healthz``."""

    status: str


class ReadyOut(BaseModel):
    """Body of ``GET /readyz``: ``ready`` with the revision, or ``not ready`` with the reason."""

    status: str
    revision: str | None = None
    reason: str | None = None


class RouteChangeOut(BaseModel):
    """Answer of ``PUT``/``PATCH``/``DELETE /v1/routes/{route}``: the route as changed, what changed
    (``{"field": {"from": x, "to": y}}``, empty when nothing did; ``archived_at`` for an archive or
    a restore), whether the route was created, and the history row written (null when nothing
    changed: no row is written then)."""

    route: RouteOut
    changes: dict[str, dict[str, Any]]
    created: bool
    history: HistoryRowOut | None


class ControllerRunOut(BaseModel):
    """Body of ``POST /v1/controller/run``: whether this process held the lease, and its decisions."""

    ran: bool
    history: list[HistoryRowOut]
