"""The api's JSON answers: floats written without binary noise.

A float computed in binary (``0.1 + 0.2``, a Kaplan-Meier quantile) often has a shortest repr of
17 significant digits whose last ones are noise (``0.30147399999999996``). :class:`ApiJSONResponse`
rounds every float of an answer to :data:`FLOAT_DIGITS` significant digits before writing it
(``0.301474``); stored values are not changed.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from fastapi.responses import JSONResponse

__all__ = ["FLOAT_DIGITS", "ApiJSONResponse", "api_json_bytes", "clean_floats"]

#: Significant digits of the floats the api writes (a double carries 15 to 17).
FLOAT_DIGITS = 15


def clean_floats(value: Any) -> Any:
    """``value`` with every finite float (inside dicts, lists and tuples too) rounded to
    :data:`FLOAT_DIGITS` significant digits; non-finite floats are left as they are."""
    return _cleaned(value, strict=False)


def _cleaned(value: Any, *, strict: bool) -> Any:
    """:func:`clean_floats`; with ``strict``, a NaN or an infinity raises ValueError."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # the common leaves, at once
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return float(f"{value:.{FLOAT_DIGITS}g}")
        if strict:
            raise ValueError(f"JSON has no {value!r}: the answer holds a NaN or an infinity")
        return value
    if isinstance(value, dict):
        return {k: _cleaned(v, strict=strict) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cleaned(v, strict=strict) for v in value]
    return value


def api_json_bytes(content: Any) -> bytes:
    """``content`` as the api writes it: compact UTF-8 JSON after :func:`clean_floats`.

    Written by orjson (the same bytes as ``json.dumps`` with compact separators and
    ``ensure_ascii=False`` for the api's answers, at about a fifth of its CPU; keys that are not
    strings are written as ``json.dumps`` would, as strings).

    Raises:
        ValueError: a NaN or an infinity in ``content`` (JSON has none), or a value JSON cannot
            hold.
    """
    try:
        return orjson.dumps(_cleaned(content, strict=True), option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"cannot write the answer as JSON: {exc}") from exc


class ApiJSONResponse(JSONResponse):
    """A ``JSONResponse`` whose floats carry no binary noise (:func:`clean_floats`)."""

    def render(self, content: Any) -> bytes:
        """Encode ``content`` as compact UTF-8 JSON after :func:`clean_floats`."""
        return api_json_bytes(content)
