"""The ``hedgerow`` console script: the one place that sees every part of the system.

Commands: ``call`` (one hedged chat completion), ``serve`` (api + controller job), ``db upgrade``,
``controller run-once``, ``replica`` (a simulated LLM replica) and ``demo`` (the main job).
Each command parses its flags here and hands over to the part that does the work; user errors
are printed as one line and exit with status 1 or 2, never as a traceback.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="hedgerow",
    help="First-token hedged requests for LLM APIs, with thresholds set by measurement.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The SQL store.", no_args_is_help=True)
controller_app = typer.Typer(help="The threshold controller.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(controller_app, name="controller")


def fail(message: str, code: int = 1) -> "typer.Exit":
    """Print ``message`` as one line on stderr and return the Exit to raise (status ``code``)."""
    typer.echo(f"hedgerow: {message}", err=True)
    return typer.Exit(code)


# --- commands are defined below, one section each -------------------------------------------


def main() -> None:
    """Entry point of the console script."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
