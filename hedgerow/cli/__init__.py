"""The ``hedgerow`` console script: the one place that sees every part of the system.

One module per command (group), each registering itself on the shared Typer ``app``
(:mod:`hedgerow.cli._common`, with ``fail`` and the flag parsers every command uses):
``call`` (one hedged chat completion, :mod:`.call`), ``gateway`` (the race as an
OpenAI-compatible server, :mod:`.gateway`), ``demo`` (the main job, :mod:`.demo`), ``replica``
(a simulated LLM replica, :mod:`.replica`), ``serve`` (api + controller job, :mod:`.serve`),
``db upgrade|retention`` (migrations; hourly rollups, then deletion of old raw calls,
:mod:`.db`), ``controller run-once`` (:mod:`.controller`), ``report weekly`` (:mod:`.report`)
and ``routes list|show|history|set|archive|restore`` (the ops CLI, :mod:`.routes`);
``upstreams list`` (per-upstream figures, :mod:`.upstreams`).
Each command parses its flags and hands over to the part that does the work; user errors are
printed as one line and exit with status 1 or 2, never as a traceback. Heavy libraries
(FastAPI, SQLAlchemy, scipy) are imported inside the commands, never at start-up.
"""

from __future__ import annotations

from hedgerow.cli._common import app

# The import order is the order of `hedgerow --help`: the commands, then the groups.
# isort: off
from hedgerow.cli import call, gateway, demo, replica, serve  # noqa: F401
from hedgerow.cli import db, controller, report, routes  # noqa: F401
from hedgerow.cli import upstreams  # noqa: F401

# isort: on

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the console script."""
    app()
