"""The api's JSON writer: floats without binary noise, compact UTF-8, the bytes ``json.dumps`` writes."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from hedgerow.api.json_response import api_json_bytes, clean_floats


def test_floats_lose_their_noise_and_the_bytes_are_json_dumps_compact() -> None:
    content: dict[Any, Any] = {
        "hedge_after_s": 0.1 + 0.2,
        "route": "résumé/ü",
        "nested": [{"p99_s": 1.0 / 3.0, "n": 3, "ok": True, "none": None}, (2.5, "x")],
        7: "an int key",
    }
    written = api_json_bytes(content)
    assert b'"hedge_after_s":0.3' in written and b'"p99_s":0.333333333333333' in written
    expected = json.dumps(clean_floats(content), ensure_ascii=False, separators=(",", ":")).encode()
    assert written == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nan_or_an_infinity_is_refused(bad: float) -> None:
    assert clean_floats({"a": [bad]})["a"][0] is bad or math.isnan(clean_floats({"a": [bad]})["a"][0])
    with pytest.raises(ValueError, match="NaN or an infinity"):
        api_json_bytes({"a": [1.0, {"b": bad}]})
