"""The ``hedgerow`` console script's entry point, which also works on a client-only install.

``pip install hedgerow`` installs the client alone (httpx, httpcore, httpx-sse, orjson); the
commands need the ``server`` extra (Typer, Rich, FastAPI, SQLAlchemy, ...). On a client-only
install the script says so in one line and exits with status 2 instead of a traceback.
"""

from __future__ import annotations

import sys

__all__ = ["SERVER_EXTRA_HINT", "main"]

#: What to run to get the commands.
SERVER_EXTRA_HINT = "pip install 'hedgerow[server]' (in a source checkout: pip install -e '.[server]')"


def main() -> None:
    """Run the ``hedgerow`` command line (:func:`hedgerow.cli.main`).

    Raises:
        SystemExit: status 2, with a one-line message naming the missing package and
            :data:`SERVER_EXTRA_HINT`, when a package of the ``server`` extra is not installed.
    """
    try:
        from hedgerow.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "hedgerow":
            raise
        print(
            f"hedgerow: the command line needs the server extra ({exc.name} is not installed): {SERVER_EXTRA_HINT}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    cli_main()
