"""The api's JSON answers: floats written without binary noise.

A float computed in binary (``0.1 + 0.2``, a Kaplan-Meier quantile) often has a shortest repr of
17 significant digits whose last ones are noise (``0.30147399999999996``). :class:`ApiJSONResponse`
rounds every float of an answer to :data:`FLOAT_DIGITS` significant digits before writing it
(``0.301474``); stored values are not changed.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse

__all__ = ["FLOAT_DIGITS", "ApiJSONResponse", "api_json_bytes", "clean_floats"]

#: Significant digits of the floats the api writes (a double carries 15 to 17).
FLOAT_DIGITS = 15


def clean_floats(value: Any) -> Any:
    """``value`` with every finite float (inside dicts, lists and tuples too) rounded to
    :data:`FLOAT_DIGITS` significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{FLOAT_DIGITS}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: clean_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_floats(v) for v in value]
    return value


def api_json_bytes(content: Any) -> bytes:
    """``content`` as the api writes it: compact UTF-8 JSON after :func:`clean_floats`.

    Raises:
        ValueError: a NaN or an infinity in ``content`` (JSON has none).
    """
    return json.dumps(
        clean_floats(content), ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


class ApiJSONResponse(JSONResponse):
    """A ``JSONResponse`` whose floats carry no binary noise (:func:`clean_floats`)."""

    def render(self, content: Any) -> bytes:
        """Encode ``content`` as compact UTF-8 JSON after :func:`clean_floats`."""
        return api_json_bytes(content)
