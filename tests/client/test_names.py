"""The one rule of route and model names (``hedgerow.client.names``) and the client's ``route=``.

Each class of bad name is refused by the rule itself, by ``CallRecord.from_dict`` and by the
client's constructors; valid names (``/``, brackets, ``|``, ``=``, non-Latin letters, inner
spaces) pass unchanged.
"""

from __future__ import annotations

import pytest

from hedgerow.client import HedgingClient, HedgingTransport, Upstream
from hedgerow.client.names import (
    MAX_NAME_CHARS,
    check_model_name,
    check_route_name,
    name_error,
    route_name_error,
    visible,
)
from hedgerow.client.records import CallRecord
from tests.conftest import make_call

#: One name of each refused class, and a word of what the message says.
BAD_NAMES = {
    "empty": ("", "must not be empty"),
    "blank": ("   ", "must not be blank"),
    "leading space": (" chat", "start or end with whitespace"),
    "trailing ideographic space": ("chat\u3000", "start or end with whitespace"),
    "newline": ("a\nb", "U+000A"),
    "escape": ("a\x1b[31mred", "U+001B"),
    "DEL": ("a\x7f", "U+007F"),
    "C1 control (NEL)": ("a\x85b", "U+0085"),
    "right-to-left override": ("abc\u202edcb", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    "left-to-right isolate": ("a\u2066b", "U+2066"),
    "zero-width space": ("a\u200bb", "U+200B"),
    "byte order mark": ("\ufeffchat", "U+FEFF"),
    "line separator": ("a\u2028b", "U+2028 (LINE SEPARATOR)"),
    "paragraph separator": ("a\u2029b", "U+2029"),
    "lone surrogate": ("a\ud800", "U+D800"),
    "too long": ("x" * (MAX_NAME_CHARS + 1), f"at most {MAX_NAME_CHARS} characters"),
}
GOOD_NAMES = [
    "summarize",
    "team/summarize",
    "gpt-4o-mini",
    "a b",
    "[bold]x[/]",
    "p|ipe",
    '=HYPERLINK("x")',
    "résumé",
    "要約",
    "x" * MAX_NAME_CHARS,
]


@pytest.mark.parametrize(("name", "said"), BAD_NAMES.values(), ids=list(BAD_NAMES))
def test_each_class_of_bad_name_is_refused_saying_what_is_wrong(name: str, said: str) -> None:
    assert said in (name_error(name) or "")
    assert said in (route_name_error(name) or "")
    with pytest.raises(ValueError, match=r"^route: "):
        check_route_name(name)
    with pytest.raises(ValueError, match=r"^model: "):
        check_model_name(name)


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_valid_names_pass_unchanged(name: str) -> None:
    assert name_error(name) is None and route_name_error(name) is None
    assert check_route_name(name) is name and visible(name) == name


def test_a_route_may_not_end_in_history_but_a_model_may() -> None:
    assert "/history" in (route_name_error("a/history") or "")
    assert name_error("a/history") is None and check_model_name("a/history") == "a/history"


def test_a_non_string_is_refused() -> None:
    assert name_error(3) == "must be a string, got int"


def test_visible_writes_the_refused_characters_as_escapes() -> None:
    assert visible("a\nb\u202ec\u2028") == "a\\nb\\u202ec\\u2028"
    assert visible("a\u00a0b") == "a\u00a0b"  # a no-break space is not refused


@pytest.mark.parametrize(("field", "name"), [("route", "a\u202eb"), ("model", " m"), ("route", "a/history")])
def test_from_dict_refuses_a_bad_route_or_model(field: str, name: str) -> None:
    data = make_call("c1").to_dict() | {field: name}
    with pytest.raises(ValueError, match=rf"^{field}: "):
        CallRecord.from_dict(data)


@pytest.mark.parametrize(("name", "said"), BAD_NAMES.values(), ids=list(BAD_NAMES))
def test_the_client_refuses_a_bad_route(name: str, said: str) -> None:
    upstreams = [Upstream("a", "http://127.0.0.1:9/v1")]
    with pytest.raises(ValueError, match=r"^route: ") as caught:
        HedgingClient(upstreams, route=name)
    assert said in str(caught.value)
    with pytest.raises(ValueError, match=r"^route: "):
        HedgingTransport(upstreams, route=name)
    with pytest.raises(ValueError, match=r"^unary_route: "):
        HedgingTransport(upstreams, route="chat", unary_route=name)


def test_the_transports_default_unary_route_must_fit_too() -> None:
    upstreams = [Upstream("a", "http://127.0.0.1:9/v1")]
    with pytest.raises(ValueError, match=r"default unary_route\): must be at most 200"):
        HedgingTransport(upstreams, route="x" * MAX_NAME_CHARS)
