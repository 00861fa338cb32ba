"""The one rule for what a route or model name may be, shared by the client, the api and the CLI.

A route or model name is 1 to :data:`MAX_NAME_CHARS` (200) characters that

* is not blank and neither starts nor ends with whitespace (``str.strip``'s whitespace, so also
  U+00A0, U+3000 and the like);
* holds no character of the Unicode categories in :data:`REFUSED_CATEGORIES`: control
  characters (``Cc``: U+0000-U+001F, U+007F-U+009F, so newline, tab, escape), format characters
  (``Cf``: the bidirectional overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width
  characters, U+FEFF, the soft hyphen), surrogates (``Cs``) and the line and paragraph
  separators U+2028/U+2029 (``Zl``, ``Zp``);
* for a route only: does not end in :data:`HISTORY_SUFFIX` or :data:`CALLS_SUFFIX`
  (``/v1/routes/{route}/history`` is the history of ``route``, ``/v1/routes/{route}/calls`` its
  calls).

Everything else is allowed, including ``/`` (``team/summarize``), spaces inside the name, any
letter or symbol of any script, and the characters that mean something to one output format
(``[`` ``]`` for rich markup, ``|`` and backticks for Markdown, ``=`` ``+`` ``-`` ``@`` for
spreadsheets, ``<`` ``&`` for HTML): each output escapes for its own format instead (the CLI's
tables, the text logs, the Markdown, CSV and HTML reports, the console), which also covers names
stored before this rule existed.

The client checks its ``route=`` argument with :func:`check_route_name`; the api's
``RouteName``/``ModelName`` types (``hedgerow.api.schemas``) and the CLI's arguments call the same
functions, so every entry refuses the same names with the same message.
"""

from __future__ import annotations

import unicodedata

__all__ = [
    "CALLS_SUFFIX",
    "HISTORY_SUFFIX",
    "MAX_NAME_CHARS",
    "REFUSED_CATEGORIES",
    "check_model_name",
    "check_route_name",
    "model_name_error",
    "name_error",
    "route_name_error",
    "visible",
]

#: Longest accepted name (route, model; also request_id, client, upstream, error_type), characters.
MAX_NAME_CHARS = 200
#: Route names may not end in this: ``/v1/routes/{route}/history`` is the history of ``route``.
HISTORY_SUFFIX = "/history"
#: Route names may not end in this: ``/v1/routes/{route}/calls`` lists the calls of ``route``.
CALLS_SUFFIX = "/calls"
#: Unicode general categories refused anywhere in a name: control, format, surrogate, line
#: separator, paragraph separator. They are invisible or reorder or break the text around them
#: (a log line, a table row, a terminal) and have no place in an identifier.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_CATEGORY_NAMES = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Cs": "a lone surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


def name_error(value: object) -> str | None:
    """Why ``value`` cannot be a route or model name, or None when it can (the module's rule).

    Args:
        value: the candidate name (anything: a non-string is refused).

    Returns:
        None, or one sentence saying what is wrong, e.g. ``must not contain control or format
        characters (Unicode Cc, Cf, Cs, Zl, Zp): U+202E (RIGHT-TO-LEFT OVERRIDE) at index 3``.
    """
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_NAME_CHARS:
        return f"must be at most {MAX_NAME_CHARS} characters, got {len(value)}"
    if not value.isprintable():  # fast path: printable text has none of the refused categories
        for index, char in enumerate(value):
            if unicodedata.category(char) in REFUSED_CATEGORIES:
                label = unicodedata.name(char, "") or _CATEGORY_NAMES[unicodedata.category(char)]
                return (
                    "must not contain control characters or format characters (Unicode Cc, Cf, Cs, Zl, Zp): "
                    f"U+{ord(char):04X} ({label}) at index {index}"
                )
    if not value.strip():
        return "must not be blank (only whitespace)"
    if value != value.strip():
        return "must not start or end with whitespace"
    return None


def route_name_error(value: object) -> str | None:
    """Why ``value`` cannot be a route name, or None: :func:`name_error`, and no ``/history`` or
    ``/calls`` end.

    Args:
        value: the candidate route name.

    Returns:
        None, or one sentence saying what is wrong.
    """
    problem = name_error(value)
    if problem is None and isinstance(value, str) and value.endswith(HISTORY_SUFFIX):
        return f"must not end in {HISTORY_SUFFIX!r} (that path reads a route's history)"
    if problem is None and isinstance(value, str) and value.endswith(CALLS_SUFFIX):
        return f"must not end in {CALLS_SUFFIX!r} (that path lists a route's calls)"
    return problem


def model_name_error(value: object) -> str | None:
    """Why ``value`` cannot be a model name, or None (the same rule as :func:`name_error`).

    Args:
        value: the candidate model name.

    Returns:
        None, or one sentence saying what is wrong.
    """
    return name_error(value)


def check_route_name(value: object, field: str = "route") -> str:
    """Return ``value`` when it is a valid route name (:func:`route_name_error`).

    Args:
        value: the candidate route name.
        field: what to call it in the message (an argument or field name).

    Returns:
        ``value``, unchanged.

    Raises:
        ValueError: ``"<field>: <what is wrong>"``.
    """
    problem = route_name_error(value)
    if problem is not None or not isinstance(value, str):
        raise ValueError(f"{field}: {problem}")
    return value


def check_model_name(value: object, field: str = "model") -> str:
    """Return ``value`` when it is a valid model name (:func:`model_name_error`).

    Args:
        value: the candidate model name.
        field: what to call it in the message.

    Returns:
        ``value``, unchanged.

    Raises:
        ValueError: ``"<field>: <what is wrong>"``.
    """
    problem = model_name_error(value)
    if problem is not None or not isinstance(value, str):
        raise ValueError(f"{field}: {problem}")
    return value


def visible(text: str) -> str:
    """``text`` with every character of :data:`REFUSED_CATEGORIES` written as a Python escape.

    For showing a name that may predate the rule (or any stored text) where a raw control, format
    or separator character would break or reorder the output: a newline becomes the two
    characters ``\\n``, U+202E becomes ``\\u202e``. Other characters are kept as they are, so a
    valid name is shown unchanged.

    Args:
        text: the text to show.

    Returns:
        The text, one line, without any character of the refused categories.
    """
    if text.isprintable():
        return text
    return "".join(repr(char)[1:-1] if unicodedata.category(char) in REFUSED_CATEGORIES else char for char in text)
