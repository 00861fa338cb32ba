"""The ``hedgerow`` console script: the one place that sees every part of the system.

Commands: ``call`` (one hedged chat completion), ``gateway`` (the race as an OpenAI-compatible
server, :mod:`hedgerow.gateway`), ``serve`` (api + controller job), ``db upgrade``,
``db retention`` (hourly rollups, then deletion of old raw calls),
``controller run-once``, ``routes list|show|history|set`` (the ops CLI, :mod:`hedgerow.cli.routes`),
``replica`` (a simulated LLM replica) and ``demo`` (the main job).
Each command parses its flags here and hands over to the part that does the work; user errors
are printed as one line and exit with status 1 or 2, never as a traceback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hedgerow import __version__
from hedgerow.cli.report import report_app
from hedgerow.cli.routes import routes_app

if TYPE_CHECKING:
    from hedgerow.client import (
        CallRecord,
        HedgePolicy,
        HedgingClient,
        ResponsesAssembler,
        TelemetryExporter,
        Upstream,
    )
    from hedgerow.client.chunks import AnswerAssembler
    from hedgerow.settings import Settings

app = typer.Typer(
    name="hedgerow",
    help="First-token hedged requests for LLM APIs, with thresholds set by measurement.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags without type metavars, nothing truncated
    context_settings={"max_content_width": 120, "terminal_width": 120},
)
db_app = typer.Typer(help="The SQL store.", no_args_is_help=True, rich_markup_mode=None)
controller_app = typer.Typer(help="The threshold controller.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(db_app, name="db")
app.add_typer(controller_app, name="controller")
app.add_typer(report_app, name="report")  # hedgerow/cli/report.py
app.add_typer(routes_app, name="routes")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"hedgerow {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """First-token hedged requests for LLM APIs, with thresholds set by measurement."""


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as one line on stderr and return the Exit to raise (status ``code``)."""
    typer.echo(f"hedgerow: {message}", err=True)
    return typer.Exit(code)


# --- commands are defined below, one section each -------------------------------------------

# ---- call (lead) ----

#: HedgePolicy fields set by ``hedgerow call`` flags, so that a policy error names the flag.
_CALL_FLAGS = {
    "hedge_after_s": "--hedge-after",
    "stall_timeout_s": "--stall-timeout",
    "total_timeout_s": "--total-timeout",
    "budget": "--budget",
}

#: Exit status of ``hedgerow call`` when SIGINT (Ctrl-C) ended it: 128 + SIGINT, as shells report.
_EXIT_INTERRUPTED = 130


def _name_problem(value: str, *, route: bool = False) -> str | None:
    """Why ``value`` cannot be a name in a call record (route, model, upstream), or None if it can.

    The rule of route and model names (:mod:`hedgerow.client.names`: 1 to 200 characters, no
    control or format characters, not blank, no whitespace at either end; with ``route`` also not
    ending in ``/history``), which the api applies to the records.
    """
    from hedgerow.client.names import name_error, route_name_error

    return route_name_error(value) if route else name_error(value)


def _check_name(flag: str, value: str, *, route: bool = False) -> str:
    """Return ``value`` if it can be a record name; else exit 2 with one line naming ``flag``."""
    problem = _name_problem(value, route=route)
    if problem is not None:
        raise fail(f"{flag}: {problem}", 2)
    return value


def _parse_upstream(text: str) -> Upstream:
    """``NAME=BASE_URL`` -> ``Upstream``; a bad value exits 2 with one line naming ``--upstream``."""
    from hedgerow.client import Upstream

    name, sep, url = text.partition("=")
    if not sep or not name or not url:
        raise fail(f"--upstream: expected NAME=BASE_URL, got {text!r}", 2)
    try:
        upstream = Upstream(name, url)
    except ValueError as exc:
        raise fail(f"--upstream: {exc}", 2) from None
    problem = _name_problem(name)
    if problem is not None:
        raise fail(f"--upstream: NAME {problem}", 2)
    return upstream


def _parse_number(flag: str, text: str | None, what: str) -> float | None:
    """Parse a numeric flag given as text (None stays None); not a number exits 2 naming ``flag``.

    The flags are read as text so that a typo gives one line (``--budget: not a number: 'x'``)
    instead of click's multi-line usage error. Ranges are checked by ``HedgePolicy``.
    """
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise fail(f"{flag}: must be {what}, got {text!r}", 2) from None
    return value


def _parse_max_tokens(text: str | None) -> int | None:
    """``--max-tokens`` as an integer > 0 (None stays None); anything else exits 2 naming the flag.

    Checked here because an upstream answers a non-positive ``max_tokens`` with HTTP 400/422,
    which would otherwise look like a failed call (exit 1) instead of a bad flag.
    """
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise fail(f"--max-tokens: must be an integer > 0, got {text!r}", 2)
    return value


def _read_body(path: str) -> dict[str, Any]:
    """The JSON object in the ``--body`` file (``-`` reads stdin); a bad file exits 2 naming it."""
    import json
    import sys

    try:
        if path == "-":
            payload = json.load(sys.stdin)
        else:
            with open(path, encoding="utf-8") as file:
                payload = json.load(file)
    except OSError as exc:
        raise fail(f"--body: cannot read {path}: {exc.strerror or exc}", 2) from None
    except UnicodeDecodeError:
        raise fail(f"--body: {path} is not UTF-8 text", 2) from None
    except ValueError as exc:
        raise fail(f"--body: not valid JSON ({exc})", 2) from None
    if not isinstance(payload, dict):
        raise fail("--body: must hold a JSON object", 2)
    return payload


def _call_payload(
    model: str | None, prompt: str | None, body: str | None, max_tokens: str | None, api: str = "chat"
) -> dict[str, Any]:
    """The request body of ``hedgerow call`` from its flags; bad values exit 2.

    ``api`` ``chat``: a chat-completions body (``messages``, ``max_tokens``); ``responses``: a
    Responses API body (``input``, ``max_output_tokens``).

    ``--model`` (when given) replaces the body's model; the model ends up in the call record, so
    it must be a valid model name (:mod:`hedgerow.client.names`) whichever way it came.
    """
    if (prompt is None) == (body is None):
        raise fail("give exactly one of --prompt and --body", 2)
    if model is not None:
        _check_name("--model", model)
    if body is not None:
        payload = _read_body(body)
        if model is not None:
            payload["model"] = model
        if "model" not in payload:
            raise fail("--body: needs a 'model' (or give --model)", 2)
        if not isinstance(payload["model"], str):
            raise fail("--body: 'model' must be a string", 2)
        problem = _name_problem(payload["model"])
        if problem is not None:
            raise fail(f"--body: 'model' {problem}", 2)
    else:
        if model is None:
            raise fail("--model: required with --prompt", 2)
        if api == "responses":
            payload = {"model": model, "input": prompt}
        else:
            payload = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    tokens = _parse_max_tokens(max_tokens)
    if tokens is not None:
        payload["max_output_tokens" if api == "responses" else "max_tokens"] = tokens
    return payload


def _call_policy(hedge_after: str, stall_timeout: str | None, total_timeout: str, budget: str) -> HedgePolicy:
    """The ``HedgePolicy`` of ``hedgerow call`` from its flags; a bad value exits 2 naming the flag.

    ``--budget 0`` disables hedging altogether (the bucket also gets no burst); any other budget
    keeps the default burst, so a single call may hedge (the bucket starts full).
    """
    from hedgerow.client import HedgePolicy
    from hedgerow.controller.ops_bounds import parse_budget

    try:  # as `routes set --budget` and the console take it: 0.05 or 5%
        budget_value = parse_budget(budget)
    except ValueError as exc:
        raise fail(f"--budget: must be a fraction in [0, 1] or a percent (0.05 or 5%): {exc}", 2) from None
    values = {
        "hedge_after_s": _parse_number("--hedge-after", hedge_after, "a number of seconds >= 0"),
        "stall_timeout_s": _parse_number("--stall-timeout", stall_timeout, "a number of seconds > 0"),
        "total_timeout_s": _parse_number("--total-timeout", total_timeout, "a number of seconds > 0"),
        "budget": budget_value,
    }
    if values["budget"] == 0:
        values["budget_burst"] = 0
    try:
        return HedgePolicy(**values)  # type: ignore[arg-type]
    except ValueError as exc:
        message = str(exc)
        field = message.split(":", 1)[0].removeprefix("HedgePolicy.")
        flag = _CALL_FLAGS.get(field)
        raise fail(f"{flag}:{message.split(':', 1)[1]}" if flag else message, 2) from None


def _call_client(
    upstreams: list[Upstream], route: str, policy: HedgePolicy, telemetry: TelemetryExporter | None = None
) -> HedgingClient:
    """The ``HedgingClient`` of ``hedgerow call``; a ValueError of its own exits 2 naming the flag.

    The flags are checked before, so this is the safety net for any rule the library adds later.
    ``telemetry`` (``--serve``) receives every call's record.
    """
    from hedgerow.client import HedgingClient

    try:
        return HedgingClient(upstreams, route=route, policy=policy, telemetry=telemetry)
    except ValueError as exc:
        field, sep, rest = str(exc).partition(":")
        flag = {"route": "--route", "upstreams": "--upstream"}.get(field)
        raise fail(f"{flag}:{rest}" if sep and flag else str(exc), 2) from None


def _call_json(answer: AnswerAssembler | ResponsesAssembler, record: CallRecord | None, error: str | None) -> str:
    """The ``--json`` output of ``hedgerow call``: one JSON object on one line.

    For ``--api responses``: ``tool_calls`` is empty, ``arguments`` maps function-call item ids
    to their arguments, and ``finish_reason`` is the final response's ``status``.
    """
    import json

    from hedgerow.client.chunks import AnswerAssembler

    extra: dict[str, object] = {}
    if isinstance(answer, AnswerAssembler):
        tool_calls, finish_reason = answer.tool_calls, answer.finish_reason
    else:
        status = answer.response.get("status") if answer.response is not None else None
        tool_calls, finish_reason = [], status if isinstance(status, str) else None
        extra["arguments"] = answer.arguments
    out: dict[str, object] = {
        "text": answer.text,
        "reasoning_text": answer.reasoning_text,
        "tool_calls": tool_calls,
        "finish_reason": finish_reason,
        **extra,
        "record": record.to_dict() if record is not None else None,
    }
    if error is not None:
        out["error"] = error
    return json.dumps(out)


class _SigintGuard:
    """SIGINT (Ctrl-C) handling of ``hedgerow call``: cancel the call, never raise mid-start-up.

    From ``install()`` to ``restore()`` a SIGINT only sets ``interrupted`` (so it cannot raise
    ``KeyboardInterrupt`` inside event-loop construction or teardown, which once left an
    ``Exception ignored in BaseEventLoop.__del__`` on stderr); while the call runs, the loop's
    own handler (``loop.add_signal_handler``) also cancels the main task, so the stream ends
    with status ``cancelled`` and its record is kept. Nothing is installed when SIGINT is
    ignored or has a handler of the embedding program (Python's and asyncio's rule).
    """

    def __init__(self) -> None:
        self.interrupted = False
        self._previous: object = None
        self._active = False
        self._fallback: tuple[object, object] | None = None  # (loop, task) without add_signal_handler

    def install(self) -> None:
        """Take SIGINT over (only from Python's default handler); call in the main thread."""
        import signal

        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._note)
            self._active = True

    def restore(self) -> None:
        """Give SIGINT back to the handler it had before ``install()``."""
        import signal

        if self._active:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._active = False

    def _note(self, signum: int, frame: object) -> None:
        self.interrupted = True
        if self._fallback is not None:
            loop, task = self._fallback
            loop.call_soon_threadsafe(self._cancel, task)  # type: ignore[attr-defined]

    def _cancel(self, task: object) -> None:
        self.interrupted = True
        task.cancel()  # type: ignore[attr-defined]

    def attach(self) -> None:
        """From inside the running loop: let SIGINT also cancel the current (main) task."""
        import asyncio
        import signal

        if self._active:
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            try:
                loop.add_signal_handler(signal.SIGINT, self._cancel, task)
            except NotImplementedError:  # event loops without it (Windows): wake the loop from _note
                self._fallback = (loop, task)

    def detach(self) -> None:
        """From inside the running loop: back to only noting SIGINT (before the loop closes)."""
        import asyncio
        import signal

        if self._active and self._fallback is None:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
            signal.signal(signal.SIGINT, self._note)
        self._fallback = None


async def _run_call(
    client: HedgingClient, payload: dict[str, Any], as_json: bool, guard: _SigintGuard, api: str = "chat"
) -> tuple[AnswerAssembler | ResponsesAssembler, CallRecord | None, str | None]:
    """Stream one call through ``client``; returns (answer, record, one-line error or None).

    Args:
        client: the (not yet entered) ``HedgingClient``; closed on return.
        payload: the request body (chat completions, or the Responses API with ``api="responses"``).
        as_json: when False, the content (or refusal) text goes to stdout as it arrives.
        guard: the command's ``_SigintGuard``; a SIGINT cancels the call, whose record (status
            ``cancelled``, None if nothing was sent yet) is still returned, with error
            ``interrupted``.

    Raises:
        asyncio.CancelledError: only for a cancellation that was not a SIGINT.
    """
    import asyncio
    import sys

    from hedgerow.client import HedgeError, ResponsesAssembler
    from hedgerow.client.chunks import AnswerAssembler

    answer: AnswerAssembler | ResponsesAssembler = AnswerAssembler() if api == "chat" else ResponsesAssembler()
    error: str | None = None
    stream = None
    guard.attach()
    try:
        if guard.interrupted:  # Ctrl-C before the loop ran: send nothing
            return answer, None, "interrupted"
        async with client:
            stream = client.stream_chat(payload) if api == "chat" else client.stream_responses(payload)
            try:
                async with stream:
                    async for chunk in stream:
                        answer.add(chunk)
                        if not as_json and api == "responses":
                            if chunk.get("type") in ("response.output_text.delta", "response.refusal.delta"):
                                sys.stdout.write(str(chunk.get("delta") or ""))
                                sys.stdout.flush()
                        elif not as_json:
                            for choice in chunk.get("choices") or []:
                                delta = choice.get("delta") or {}
                                text = delta.get("content") or delta.get("refusal") or ""
                                if text:
                                    sys.stdout.write(text)
                                    sys.stdout.flush()
            except HedgeError as exc:
                error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    except asyncio.CancelledError:
        if not guard.interrupted:
            raise
    finally:
        guard.detach()
    record = stream.record if stream is not None else None
    if guard.interrupted and (record is None or record.status == "cancelled"):
        error = "interrupted"
    return answer, record, error


#: Bounds of ``hedgerow call --repeat`` and ``--concurrency``.
MAX_CALL_REPEAT = 100_000
MAX_CALL_CONCURRENCY = 64


def _parse_count(flag: str, text: str, high: int) -> int:
    """An integer flag in ``1..high``; anything else exits 2 naming the flag."""
    value = text.strip()
    if not value.isdecimal() or not 1 <= int(value) <= high:
        raise fail(f"{flag}: must be an integer from 1 to {high}, got {text!r}", 2)
    return int(value)


async def _run_calls(
    client: HedgingClient,
    payload: dict[str, Any],
    repeat: int,
    concurrency: int,
    as_json: bool,
    guard: _SigintGuard,
    api: str = "chat",
) -> list[tuple[CallRecord | None, str | None]]:
    """Send ``payload`` ``repeat`` times through ``client``, at most ``concurrency`` at once.

    With ``as_json`` each call's ``_call_json`` line is printed as it ends (JSON Lines); the
    text of the answers is not printed. A SIGINT stops the calls in flight (their records are
    kept, status ``cancelled``) and sends no more.

    Returns:
        One ``(record, one-line error or None)`` per call that was started.
    """
    import asyncio

    from hedgerow.client import HedgeError, ResponsesAssembler
    from hedgerow.client.chunks import AnswerAssembler

    results: list[tuple[CallRecord | None, str | None]] = []
    left = repeat

    async def worker() -> None:
        nonlocal left
        while left > 0 and not guard.interrupted:
            left -= 1
            answer: AnswerAssembler | ResponsesAssembler = AnswerAssembler() if api == "chat" else ResponsesAssembler()
            error: str | None = None
            stream = client.stream_chat(payload) if api == "chat" else client.stream_responses(payload)
            try:
                async with stream:
                    async for chunk in stream:
                        answer.add(chunk)
            except HedgeError as exc:
                error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            finally:
                results.append((stream.record, error))
            if as_json:
                typer.echo(_call_json(answer, stream.record, error))

    guard.attach()
    try:
        if not guard.interrupted:
            async with client:
                await asyncio.gather(*(worker() for _ in range(min(concurrency, repeat))))
    except asyncio.CancelledError:
        if not guard.interrupted:
            raise
    finally:
        guard.detach()
    return results


def _calls_summary(results: list[tuple[CallRecord | None, str | None]]) -> str:
    """One line about ``hedgerow call --repeat``'s calls: how many ended how, hedged, TTFT P50/P99."""
    import statistics

    records = [record for record, _ in results if record is not None]
    failed = sum(1 for _, error in results if error)
    ttfts = sorted(r.ttft_s for r in records if r.ttft_s is not None)
    line = f"{len(results)} calls: {len(results) - failed} ok, {failed} failed, {sum(r.hedged for r in records)} hedged"
    if len(ttfts) >= 2:
        cuts = statistics.quantiles(ttfts, n=100, method="inclusive")
        line += f"; TTFT P50 {cuts[49]:.3f} s, P99 {cuts[98]:.3f} s"
    elif ttfts:
        line += f"; TTFT {ttfts[0]:.3f} s"
    return line


def _check_export(exporter: TelemetryExporter | None, serve: str | None) -> None:
    """Exit 1 naming ``--serve`` when the server did not take every record (refused or unsent)."""
    if exporter is None:
        return
    lost = exporter.dropped_by_reason
    if any(lost.values()):
        counts = ", ".join(f"{n} {why}" for why, n in lost.items() if n)
        raise fail(f"--serve: {serve} did not take every record ({counts}; last error: {exporter.last_error})", 1)


async def _with_exporter(exporter: TelemetryExporter | None, work: Any) -> Any:
    """Await ``work`` with ``exporter`` (``--serve``) sending; then flush it (at most 30 s) and close it."""
    if exporter is not None:
        exporter.start()
    try:
        return await work
    finally:
        if exporter is not None:
            await exporter.aclose(timeout_s=30.0)


@app.command(
    epilog="Exit status: 0 when the call succeeded, 1 when the call failed, 2 for bad flags, "
    "130 when interrupted (SIGINT, Ctrl-C)."
)
def call(
    upstream: list[str] = typer.Option(
        ..., "--upstream", metavar="NAME=URL", help="NAME=BASE_URL (ends in /v1); repeat; the first is the primary."
    ),
    model: str = typer.Option(
        None, "--model", metavar="M", help="Model name (required with --prompt; replaces the one in --body)."
    ),
    prompt: str = typer.Option(None, "--prompt", metavar="TEXT", help="The user message."),
    body: str = typer.Option(
        None, "--body", metavar="FILE", help="A JSON request body file for the API ('-' reads stdin)."
    ),
    api: str = typer.Option(
        "chat",
        "--api",
        metavar="API",
        help="chat (POST /v1/chat/completions) or responses (POST /v1/responses).",
    ),
    route: str = typer.Option(
        "default", "--route", metavar="ROUTE", help="Route name recorded with the call (1 to 200 characters)."
    ),
    hedge_after: str = typer.Option(
        "2.0", "--hedge-after", metavar="S", help="Seconds without a first token before hedging."
    ),
    stall_timeout: str = typer.Option(
        None,
        "--stall-timeout",
        metavar="S",
        help="After the first token, the largest gap between chunks, seconds (default: none).",
    ),
    total_timeout: str = typer.Option("120", "--total-timeout", metavar="S", help="Bound on the whole call, seconds."),
    budget: str = typer.Option(
        "0.10",
        "--budget",
        metavar="F",
        help="Hedge budget, a fraction of calls in [0, 1] or a percent (0.05 or 5%); 0 disables hedging "
        "(failover stays).",
    ),
    max_tokens: str = typer.Option(
        None, "--max-tokens", metavar="N", help="max_tokens of the request, an integer > 0."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help=(
            "Print one JSON object {text, reasoning_text, tool_calls, finish_reason, record[, error]}, "
            "also when the call fails or is interrupted (one line per call with --repeat)."
        ),
    ),
    serve: str = typer.Option(
        None,
        "--serve",
        metavar="URL",
        help="A running `hedgerow serve` (http://127.0.0.1:8400): send it each call's record, as an app's "
        "TelemetryExporter does.",
    ),
    token: str = typer.Option(
        None, "--token", envvar="HEDGEROW_TOKEN", metavar="TOKEN", help="Bearer token for --serve (HEDGEROW_TOKEN)."
    ),
    repeat: str = typer.Option(
        "1", "--repeat", metavar="N", help=f"Send the request N times (1 to {MAX_CALL_REPEAT}); prints a summary."
    ),
    concurrency: str = typer.Option(
        "1", "--concurrency", metavar="C", help=f"With --repeat, at most C calls at once (1 to {MAX_CALL_CONCURRENCY})."
    ),
) -> None:
    """Stream one hedged chat completion (or Responses API call); the text goes to stdout as it arrives.

    With --json one object is printed at the end instead, also when the call fails or is interrupted
    (then with "error" and the record so far). With --repeat N the request is sent N times (sharing one
    client and its hedge budget, --concurrency at once) and a summary line is printed instead of the
    text; with --serve every call's record goes to that server, so one command feeds its console.
    """
    import asyncio

    guard = _SigintGuard()
    guard.install()
    try:
        upstreams = [_parse_upstream(u) for u in upstream]
        names = [u.name for u in upstreams]
        if len(set(names)) != len(names):
            raise fail(f"--upstream: names must be unique, got {', '.join(names)}", 2)
        if api not in ("chat", "responses"):
            raise fail(f"--api: must be chat or responses, got {api!r}", 2)
        payload = _call_payload(model, prompt, body, max_tokens, api)
        _check_name("--route", route, route=True)
        policy = _call_policy(hedge_after, stall_timeout, total_timeout, budget)
        calls = _parse_count("--repeat", repeat, MAX_CALL_REPEAT)
        at_once = _parse_count("--concurrency", concurrency, MAX_CALL_CONCURRENCY)
        if at_once > 1 and calls == 1:
            raise fail("--concurrency: only with --repeat N (N > 1)", 2)
        exporter = None
        if serve is not None:
            from hedgerow.client import TelemetryExporter

            try:
                exporter = TelemetryExporter(serve, token=token, flush_interval_s=0.5)
            except ValueError as exc:
                raise fail(f"--serve: {exc}", 2) from None
        client = _call_client(upstreams, route, policy, exporter)
        if calls > 1:
            try:
                many = asyncio.run(
                    _with_exporter(exporter, _run_calls(client, payload, calls, at_once, as_json, guard, api))
                )
            except KeyboardInterrupt:
                raise fail("interrupted", _EXIT_INTERRUPTED) from None
            typer.echo(_calls_summary(many), err=as_json)
            _check_export(exporter, serve)
            if guard.interrupted:
                raise fail("interrupted", _EXIT_INTERRUPTED)
            if any(error for _, error in many):
                raise fail("some calls failed", 1)
            return
        try:
            answer, record, error = asyncio.run(
                _with_exporter(exporter, _run_call(client, payload, as_json, guard, api))
            )
        except KeyboardInterrupt:  # SIGINT with a handler of the embedding program
            raise fail("interrupted", _EXIT_INTERRUPTED) from None
        if as_json:
            typer.echo(_call_json(answer, record, error))
        elif answer.text:
            typer.echo("")
        if error != "interrupted":
            _check_export(exporter, serve)
        if error == "interrupted":
            raise fail(error, _EXIT_INTERRUPTED)
        if error:
            raise fail(error, 1)
    finally:
        guard.restore()


# ---- gateway ----


def _gateway_config(
    file: str | None, upstream: list[str] | None, model: str | None, hedge_after: str | None, budget: str | None
) -> Any:
    """The ``GatewayConfig`` of ``hedgerow gateway`` from FILE or ``--upstream``; exits 2 naming the problem.

    ``--hedge-after`` and ``--budget`` set every route's policy (over the file's values).
    """
    import os

    from hedgerow.gateway import ConfigError, GatewayConfig, RouteSpec, load_config
    from hedgerow.gateway._config import build_policy, keys_from_env

    if (file is None) == (not upstream):
        raise fail("give a config FILE or --upstream NAME=URL (not both)", 2)
    overrides: dict[str, Any] = {}
    if hedge_after is not None:
        overrides["hedge_after_s"] = _parse_number("--hedge-after", hedge_after, "a number of seconds >= 0")
    if budget is not None:
        from hedgerow.controller.ops_bounds import parse_budget

        try:
            overrides["budget"] = parse_budget(budget)
        except ValueError as exc:
            raise fail(f"--budget: must be a fraction in [0, 1] or a percent (0.05 or 5%): {exc}", 2) from None
    try:
        if file is not None:
            if model is not None:
                raise fail("--model: only with --upstream (the FILE names its models)", 2)
            config = load_config(file)
            routes = {
                name: RouteSpec(
                    spec.public_model, spec.route, spec.upstreams, build_policy(name, overrides, spec.policy)
                )
                for name, spec in config.routes.items()
            }
            from dataclasses import replace

            return replace(config, routes=routes)
        upstreams = [_parse_upstream(u) for u in upstream or []]
        names = [u.name for u in upstreams]
        if len(set(names)) != len(names):
            raise fail(f"--upstream: names must be unique, got {', '.join(names)}", 2)
        if model is not None:
            _check_name("--model", model)
        policy = build_policy("policy", {"hedge_after_s": 2.0, **overrides})
        spec = RouteSpec(model, "default", tuple(upstreams), policy)
        keys = keys_from_env(os.environ)
        if model is None:
            return GatewayConfig(routes={}, any_model=spec, keys=keys, source="--upstream")
        return GatewayConfig(routes={model: spec}, keys=keys, source="--upstream")
    except ConfigError as exc:
        message = str(exc)
        for field, flag in (("hedge_after_s", "--hedge-after"), ("budget", "--budget")):
            if field in overrides and f".{field}:" in message:
                message = f"{flag}:{message.split(f'.{field}:', 1)[1]}"
        raise fail(message, 2) from None


@app.command(
    epilog="Exit status: 130 after SIGINT (Ctrl-C) and 143 after SIGTERM, once shut down cleanly (uvicorn "
    "re-raises the signal); 1 when it cannot listen; 2 for bad flags or config."
)
def gateway(
    file: str = typer.Argument(None, metavar="[FILE]", help="The gateway's TOML config (models, upstreams, keys)."),
    upstream: list[str] = typer.Option(
        None,
        "--upstream",
        metavar="NAME=URL",
        help="Without FILE: NAME=BASE_URL (ends in /v1); repeat; first = primary.",
    ),
    model: str = typer.Option(
        None, "--model", metavar="M", help="With --upstream: the one public model name (default: any model passes)."
    ),
    hedge_after: str = typer.Option(
        None, "--hedge-after", metavar="S", help="Seconds without a first token before hedging (default 2, or FILE's)."
    ),
    budget: str = typer.Option(
        None, "--budget", metavar="F", help="Hedge budget, a fraction or a percent (default 0.10, or FILE's)."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", metavar="H", help="Interface to listen on; off loopback, gateway keys are required."
    ),
    port: int = typer.Option(8480, "--port", metavar="P", help="TCP port (default 8480; 0 picks a free one)."),
    api: str = typer.Option(
        None, "--api", metavar="URL", help="A running `hedgerow serve`: poll its thresholds, send it the records."
    ),
    token: str = typer.Option(
        None,
        "--token",
        metavar="T",
        envvar="HEDGEROW_TOKEN",
        show_default=False,
        help="Bearer token for --api (HEDGEROW_TOKEN).",
    ),
    log_level: str = typer.Option("info", "--log-level", metavar="LEVEL", help="debug, info, warning or error."),
) -> None:
    """Serve the hedging race as an OpenAI-compatible endpoint: point any OpenAI client's base URL here.

    Gateway keys (callers send Authorization: Bearer KEY) come from FILE's `keys` and from
    HEDGEROW_GATEWAY_KEYS (NAME=KEY,NAME=KEY); upstream keys from the environment variables FILE
    names. Without --api, the calls' records are only counted and logged.
    """
    import socket

    config = _gateway_config(file, upstream, model, hedge_after, budget)
    from hedgerow.gateway import is_loopback

    if not is_loopback(host) and not config.keys:
        raise fail(
            f"--host {host}: off loopback the gateway needs keys "
            "(set HEDGEROW_GATEWAY_KEYS=NAME=KEY or `keys` in the file)",
            2,
        )
    import uvicorn

    from hedgerow.gateway import GatewayApp
    from hedgerow.logs import configure_logging, uvicorn_log_config

    try:
        configure_logging(log_level)
    except ValueError as exc:
        raise fail(f"--log-level: {exc}", 2) from None
    background: list[Any] = []
    poller = exporter = None
    if api is not None:
        from hedgerow.client import TelemetryExporter, ThresholdPoller

        try:
            poller = ThresholdPoller(api, token=token)
            exporter = TelemetryExporter(api, token=token)
        except ValueError as exc:
            raise fail(f"--api: {exc}", 2) from None
        background = [poller, exporter]
    gateway_app = GatewayApp(config, thresholds=poller, telemetry=exporter, background=background)
    try:
        sock = socket.create_server((host, port))
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1) from None
    bound = sock.getsockname()
    typer.echo(f"hedgerow gateway: listening on http://{host}:{bound[1]}/v1 ({len(config.routes) or 'any'} model(s))")
    server = uvicorn.Server(
        uvicorn.Config(
            gateway_app,
            log_config=uvicorn_log_config(log_level),
            lifespan="on",
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=10,
        )
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


# ---- demo (lead) ----


@app.command()
def demo(
    trace: Path = typer.Option(
        None, "--trace", metavar="FILE", help="Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)."
    ),
    duration: float = typer.Option(
        None, "--duration", metavar="S", help="Seconds of load per way (default 120, 22 with --quick)."
    ),
    quick: bool = typer.Option(False, "--quick", help="A short run: 22 s of load per way, under two minutes in all."),
    json_path: Path = typer.Option(None, "--json", metavar="FILE", help="Write the results as JSON to this file."),
    rate: float = typer.Option(None, "--rate", metavar="R", help="Arrival rate, requests per second (default 12)."),
    fixed_hedge_after: float = typer.Option(
        None,
        "--fixed-hedge-after",
        metavar="S",
        help="Threshold of the fixed way, seconds (default: the P90 TTFT of the none way before the change).",
    ),
    change: str = typer.Option(
        "degrade",
        "--change",
        metavar="KIND",
        help="What changes halfway through each way: degrade (replica-b slows down too), "
        "recover (the degraded replica-c recovers) or none.",
    ),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the built-in workload generator."),
    report_dir: Path = typer.Option(
        Path("hedgerow-demo-report"),
        "--report-dir",
        metavar="DIR",
        help="Where the run's weekly report (HTML, JSON) is written.",
    ),
    perf_model: Path = typer.Option(
        None,
        "--perf-model",
        metavar="FILE",
        help="The replicas' Splitwise speed table (default: ../shared/data/traces/splitwise_perf_model.csv, "
        "else the one beside --trace, else the embedded copy).",
    ),
    keep_store: Path = typer.Option(
        None,
        "--keep-store",
        metavar="PATH",
        help="Keep the run's SQLite store at PATH (it is deleted otherwise); open the console on it with "
        "`hedgerow serve --db sqlite:///PATH`.",
    ),
    force: bool = typer.Option(False, "--force", help="Let --keep-store replace an existing file."),
) -> None:
    """Run api, controller, three replicas (one degraded) and hedging clients; compare three ways."""
    import asyncio
    import math
    import os

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hedgerow.sim.demo import (
        CHANGES,
        DemoConfig,
        DemoError,
        build_workload,
        results_table,
        run_demo,
        write_json,
    )
    from hedgerow.sim.perf_model import default_perf_model_path

    overrides: dict[str, Any] = {"trace_path": trace, "json_path": json_path, "seed": seed, "report_dir": report_dir}
    if duration is not None:
        if not math.isfinite(duration) or not 0 < duration <= 86_400:
            raise fail("--duration: must be a number of seconds in (0, 86400]", 2)
        overrides["duration_s"] = duration
    if rate is not None:
        if not math.isfinite(rate) or not 0 < rate <= 1000:
            raise fail("--rate: must be a number of requests per second in (0, 1000]", 2)
        overrides["rate_per_s"] = rate
    if fixed_hedge_after is not None:
        if not math.isfinite(fixed_hedge_after) or fixed_hedge_after <= 0:
            raise fail("--fixed-hedge-after: must be a number of seconds > 0", 2)
        overrides["fixed_hedge_after_s"] = fixed_hedge_after
    if change not in CHANGES:
        raise fail(f"--change: must be one of {', '.join(CHANGES)}, got {change!r}", 2)
    overrides["change"] = change
    if trace is not None and not trace.is_file():
        raise fail(f"--trace: not a file: {trace}", 2)
    if perf_model is not None and not perf_model.is_file():
        raise fail(f"--perf-model: not a file: {perf_model}", 2)
    if perf_model is None and trace is not None and default_perf_model_path() is None:
        beside = trace.resolve().parent / "splitwise_perf_model.csv"
        perf_model = beside if beside.is_file() else None
    overrides["perf_model_path"] = perf_model
    if keep_store is not None:  # checked now, not after minutes of load
        keep_store = keep_store.expanduser().resolve()
        if keep_store.is_dir():
            raise fail(f"--keep-store: {keep_store} is a folder; give a file path", 2)
        if keep_store.exists() and not force:
            raise fail(f"--keep-store: {keep_store} exists; give --force to replace it", 2)
        if not keep_store.parent.is_dir():
            raise fail(f"--keep-store: folder does not exist: {keep_store.parent}", 2)
        if not os.access(keep_store.parent, os.W_OK):
            raise fail(f"--keep-store: folder is not writable: {keep_store.parent}", 2)
        overrides["keep_store_path"] = keep_store
    elif force:
        raise fail("--force: only with --keep-store", 2)
    if json_path is not None:
        parent = json_path.resolve().parent
        if not parent.is_dir():
            raise fail(f"--json: folder does not exist: {parent}", 2)
        if not os.access(parent, os.W_OK):
            raise fail(f"--json: folder is not writable: {parent}", 2)
    if report_dir is not None:
        # made now, not after minutes of load: a folder that cannot be made fails the flag at once
        try:
            report_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise fail(f"--report-dir: cannot make the folder {report_dir}: {exc.strerror or exc}", 2) from None
        if not os.access(report_dir, os.W_OK):
            raise fail(f"--report-dir: folder is not writable: {report_dir}", 2)
    config = DemoConfig.quick(**overrides) if quick else DemoConfig(**overrides)
    if trace is not None:
        try:  # read now (the rows one way replays): a file that is not a trace fails the flag at once
            build_workload(config)
        except DemoError as exc:
            raise fail(str(exc), 2) from None
    console = Console(width=max(120, Console().width))
    shift = config.change_of_conditions()
    fixed = (
        f"{config.fixed_hedge_after_s:g} s (--fixed-hedge-after)"
        if config.fixed_hedge_after_s is not None
        else "the P90 TTFT of the none way before the change"
    )
    # One phrase per line, each short enough for an 80-column terminal: nothing wraps mid-phrase.
    for line in (
        "hedgerow demo: three ways (none, fixed, adaptive) replay the same calls",
        f"  workload: {f'trace {trace}' if trace else 'built-in generator (Azure conv trace statistics)'}",
        f"  load: {config.duration_s:g} s per way at {config.rate_per_s:g} req/s",
        f"  replicas: 3, replica-c {config.degraded_slowdown:g}x slower",
        f"  halfway through each way: {shift.describe()}",
        f"  budget: {config.budget:.0%} of calls may hedge",
        f"  fixed way's hedge_after_s: {fixed}",
    ):
        console.print(line, highlight=False, soft_wrap=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        try:
            run = asyncio.run(run_demo(config, progress, notify=lambda text: progress.console.print(text)))
        except DemoError as exc:
            raise fail(str(exc), 1) from None
    results = run.results
    console.print(results_table(results, config.budget))
    for result in results:
        if result.threshold_path_s:
            path = " -> ".join(f"{value:g}" for value in result.threshold_path_s)
            console.print(f"{result.mode} thresholds published by the controller (s): {path}", highlight=False)
    console.print("")
    for sentence in run.sentences:
        console.print(sentence, highlight=False)
    console.print("")
    if run.report is not None:
        from hedgerow.controller.report.report_render import summary_text

        console.print(
            "The weekly report has one route per way (demo-none, demo-fixed, demo-adaptive); "
            "its totals pool the three ways:",
            highlight=False,
        )
        console.print(summary_text(run.report))
        console.print(f"weekly report of the run: {', '.join(str(p) for p in run.report_paths)}", soft_wrap=True)
    if json_path is not None:
        try:
            write_json(config, run)
        except OSError as exc:
            raise fail(f"--json: cannot write {json_path}: {exc}", 1) from None
        console.print(f"results written to {json_path}", soft_wrap=True)
    if run.store_path is not None:
        import shlex

        console.print(f"the run's store is kept at {run.store_path}; open the console on it with:", soft_wrap=True)
        console.print(f"  hedgerow serve --db {shlex.quote(f'sqlite:///{run.store_path}')}", soft_wrap=True)
        console.print("  then http://127.0.0.1:8400/ui/routes", soft_wrap=True, highlight=False)


# ---- replica (sim helper) ----


@app.command()
def replica(
    port: int = typer.Option(..., "--port", metavar="P", help="TCP port to listen on (0 = pick a free one)."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="HOST", help="Interface to bind."),
    time_scale: float = typer.Option(
        1.0, "--time-scale", metavar="X", help="Factor on every service time (0.1 = 10x faster than the GPU)."
    ),
    slowdown: float = typer.Option(1.0, "--slowdown", metavar="F", help="Degradation factor on every service time."),
    max_batch: int = typer.Option(64, "--max-batch", metavar="N", help="Largest running batch."),
    tokens_per_chunk: int = typer.Option(
        1, "--tokens-per-chunk", metavar="N", help="Tokens per SSE chunk after the first."
    ),
    name: str = typer.Option(
        "replica", "--name", metavar="NAME", help="Replica name (stats, logs, X-Hedgerow-Replica)."
    ),
    error_rate: float = typer.Option(0.0, "--error-rate", metavar="F", help="Fraction of requests answered HTTP 503."),
    stall_rate: float = typer.Option(
        0.0, "--stall-rate", metavar="F", help="Fraction of requests that stall once mid-stream."
    ),
    stall_s: float = typer.Option(0.0, "--stall-s", metavar="S", help="Length of such a stall, wall seconds."),
    seed: int = typer.Option(None, "--seed", metavar="N", help="Seed of the random choices."),
    perf_model: str = typer.Option(
        None,
        "--perf-model",
        metavar="FILE",
        help=(
            "Splitwise perf_model.csv (default: ../shared/data/traces/splitwise_perf_model.csv, "
            "else an embedded table)."
        ),
    ),
) -> None:
    """Serve one simulated OpenAI-compatible LLM replica: chat completions and the Responses API.

    Continuous batching with Splitwise service times; streamed or whole answers.
    """
    from pathlib import Path

    from hedgerow.sim.perf_model import PerfModelError
    from hedgerow.sim.replica import ReplicaConfig, serve_replica

    if not 0 <= port <= 65535:
        raise fail(f"--port must be in [0, 65535], got {port}", 2)
    if perf_model is not None and not Path(perf_model).is_file():
        raise fail(f"--perf-model: file not found: {perf_model}", 2)
    try:
        config = ReplicaConfig(
            name=name,
            time_scale=time_scale,
            slowdown=slowdown,
            max_batch=max_batch,
            tokens_per_chunk=tokens_per_chunk,
            error_rate=error_rate,
            stall_rate=stall_rate,
            stall_s=stall_s,
            seed=seed,
            perf_model_path=perf_model,
        )
    except ValueError as exc:
        raise fail(f"--{str(exc).split(' ', 1)[0].replace('_', '-')}: {str(exc).split(' ', 1)[1]}", 2) from None
    try:
        serve_replica(config, host, port)
    except PerfModelError as exc:
        raise fail(str(exc), 2) from None
    except OSError as exc:
        raise fail(str(exc), 1) from None
    except KeyboardInterrupt:
        pass


# ---- end replica ----

# ---- serve, db upgrade, controller run-once (controller+api helper) ----


#: The flag of each setting that a command takes as a flag (errors name what the user typed).
_SETTING_FLAGS = {
    "database_url": "--db",
    "host": "--host",
    "port": "--port",
    "controller_interval_s": "--interval",
    "retention_s": "--retention",
    "log_level": "--log-level",
    "log_format": "--log-format",
    "access_log": "--access-log",
}


def _server_settings(db: str | None, **overrides: Any) -> Settings:
    """Settings from the environment with the command's flags on top.

    A bad value exits 2 with one line naming what the user typed: the flag (``--log-format``)
    when it came from a flag, else the environment variable (``HEDGEROW_LOG_FORMAT``); a
    malformed or unsupported ``--db`` exits 2 in every command.
    """
    from pydantic import ValidationError

    from hedgerow.controller.errors import StoreError
    from hedgerow.controller.store.db import check_database_url
    from hedgerow.settings import Settings

    values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    if db is not None:
        values["database_url"] = db
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"])
        name = _SETTING_FLAGS.get(field, field) if field in values else f"HEDGEROW_{field.upper()}"
        raise fail(f"{name}: {error['msg'].removeprefix('Value error, ')}", 2) from None
    try:
        check_database_url(settings.database_url)
    except StoreError as exc:
        name = "--db" if db is not None else "HEDGEROW_DATABASE_URL"
        raise fail(f"{name}: {exc}", 2) from None
    return settings


def _require_existing_sqlite_file(url: str) -> None:
    """Exit 1 when ``url`` names a SQLite file that does not exist (instead of creating it empty)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return  # the store reports a malformed URL itself
    database = parsed.database
    if parsed.get_backend_name() == "sqlite" and database and database != ":memory:" and not Path(database).exists():
        raise fail(
            f"no database file at {database}: run `hedgerow db upgrade` (with --db) or `hedgerow serve` first", 1
        )


def _log_level_option(note: str = "") -> Any:
    """The ``--log-level`` option of the commands that log (``serve``, ``controller run-once``);
    ``note`` is added to its help."""
    return typer.Option(
        None,
        "--log-level",
        metavar="LEVEL",
        help=f"debug, info, warning, error or critical (default HEDGEROW_LOG_LEVEL, else info){note}.",
    )


def _log_format_option() -> Any:
    """The ``--log-format`` option of the commands that log."""
    return typer.Option(
        None,
        "--log-format",
        metavar="FORMAT",
        help="text or json: one JSON object per line (default HEDGEROW_LOG_FORMAT, else text).",
    )


@app.command()
def serve(
    db: str = typer.Option(
        None,
        "--db",
        metavar="URL",
        help="Database URL (default HEDGEROW_DATABASE_URL, else sqlite+aiosqlite:///./hedgerow.db); migrated on start.",
    ),
    host: str = typer.Option(
        None,
        "--host",
        metavar="HOST",
        help="Interface to listen on (default 127.0.0.1; non-loopback needs HEDGEROW_TOKENS).",
    ),
    port: int = typer.Option(None, "--port", metavar="PORT", help="TCP port (default 8400; 0 picks a free one)."),
    interval: float = typer.Option(
        None, "--interval", metavar="S", help="Seconds between controller ticks (default 60)."
    ),
    log_level: str = _log_level_option(),
    log_format: str = _log_format_option(),
    access_log: bool = typer.Option(
        None, "--access-log/--no-access-log", help="Log one line per request (default HEDGEROW_ACCESS_LOG, else off)."
    ),
) -> None:
    """Run the api and the controller job; prints one line once listening."""
    settings = _server_settings(
        db,
        host=host,
        port=port,
        controller_interval_s=interval,
        log_level=log_level,
        log_format=log_format,
        access_log=access_log,
    )
    # the app (FastAPI, SQLAlchemy, scipy) is imported once the flags are known to be good
    from hedgerow.api.errors import ApiConfigError
    from hedgerow.api.server import serve as serve_api
    from hedgerow.controller.errors import StoreError, StoreNotReady

    try:
        serve_api(settings)
    except StoreNotReady as exc:
        raise fail(str(exc), 1) from None
    except (ApiConfigError, StoreError, ValueError) as exc:
        raise fail(str(exc), 2) from None
    except (OSError, RuntimeError) as exc:
        raise fail(f"cannot serve on {settings.host}:{settings.port}: {exc}", 1) from None


@db_app.command("upgrade")
def db_upgrade(
    db: str = typer.Option(
        None, "--db", metavar="URL", help="Database URL (default HEDGEROW_DATABASE_URL, else ./hedgerow.db)."
    ),
    revision: str = typer.Option("head", "--revision", metavar="REV", help="Target revision."),
) -> None:
    """Migrate the store to the newest schema (or to --revision).

    Safe to run while another `db upgrade` or a starting `serve` migrates the same store: it
    waits for the store's migration lock (HEDGEROW_MIGRATION_LOCK_TIMEOUT_S, 600 s) and then
    finds the store migrated. A failed migration is rolled back whole (exit 1).
    """
    from hedgerow.controller.errors import StoreError, StoreNotReady
    from hedgerow.controller.store.db import known_revisions, upgrade_database

    settings = _server_settings(db)
    try:
        upgrade_database(settings.database_url, revision, lock_timeout_s=settings.migration_lock_timeout_s)
    except StoreNotReady as exc:
        raise fail(str(exc), 1) from None
    except StoreError as exc:
        raise fail(str(exc), 2) from None
    current = asyncio.run(_revision_of(settings.database_url))
    if revision not in ("head", current) and revision in known_revisions():
        # alembic's upgrade does nothing for a target behind the store's revision
        typer.echo(
            f"hedgerow: database is at revision {current}, past {revision}: nothing done (upgrade never goes back)"
        )
        return
    typer.echo(f"hedgerow: database migrated to revision {current}")


async def _revision_of(url: str) -> str | None:
    """The revision the store at ``url`` is at (one connection, closed)."""
    from hedgerow.controller.store.db import current_revision, make_engine

    engine = make_engine(url)
    try:
        return await current_revision(engine)
    finally:
        await engine.dispose()


#: Exit code of ``controller run-once`` while another process holds the controller lease
#: (``EX_TEMPFAIL`` of sysexits.h: nothing was done, try again later).
LEASE_HELD_EXIT = 75


@controller_app.command("run-once")
def controller_run_once(
    db: str = typer.Option(
        None, "--db", metavar="URL", help="Database URL (default HEDGEROW_DATABASE_URL, else ./hedgerow.db)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the decisions as JSON instead of a table."),
    log_level: str = _log_level_option("; logs go to stderr"),
    log_format: str = _log_format_option(),
) -> None:
    """Run one controller tick now and print its decisions (one history row per route).

    The tick takes the controller lease first: while a running `serve` holds it nothing is ticked
    and the command exits 75 naming the holder. Applied changes are logged to stderr
    (`threshold_changed` lines), as the scheduled tick's are.
    """
    import asyncio
    import json

    from rich.console import Console
    from rich.table import Table

    from hedgerow.cli.routes import plain_cell
    from hedgerow.client.names import visible
    from hedgerow.controller.errors import LeaseHeld, StoreError
    from hedgerow.logs import configure_logging

    settings = _server_settings(db, log_level=log_level, log_format=log_format)
    _require_existing_sqlite_file(settings.database_url)
    configure_logging(settings.log_level, settings.log_format)
    # scipy: once the flags are known to be good
    from hedgerow.controller.jobs import run_once

    try:
        rows = asyncio.run(run_once(settings))
    except LeaseHeld as exc:
        raise fail(str(exc), LEASE_HELD_EXIT) from None
    except StoreError as exc:
        raise fail(str(exc), 1) from None
    if as_json:
        typer.echo(json.dumps({"history": rows}, indent=2))
        return

    def seconds(value: object) -> str:
        return "-" if value is None else f"{value:.3f}"

    def fraction(value: object) -> str:
        return "-" if value is None else f"{value:.1%}"

    table = Table(title=f"controller tick: {len(rows)} route(s)")
    for column in (
        "route",
        "model",
        "previous_s",
        "hedge_after_s",
        "applied",
        "reason",
        "source",
        "samples",
        "censored",
        "p50_s",
        "p90_s",
        "p99_s",
        "hedge rate",
        "backup wins",
        "budget",
    ):
        table.add_column(column, justify="right" if column not in ("route", "model", "reason", "source") else "left")
    for row in rows:
        table.add_row(  # names as plain text: no rich markup, control characters escaped
            plain_cell(visible(row["route"])),
            plain_cell(visible(row["model"])),
            seconds(row["previous_hedge_after_s"]),
            seconds(row["hedge_after_s"]),
            "yes" if row["applied"] else "held",
            row["reason"],
            row["source"],
            str(row["samples"]),
            str(row["censored"]),
            seconds(row["p50_s"]),
            seconds(row["p90_s"]),
            seconds(row["p99_s"]),
            fraction(row["observed_hedge_rate"]),
            fraction(row["backup_win_rate"]),
            fraction(row["budget"]),
        )
    Console(width=200).print(table)


# ---- end serve, db upgrade, controller run-once ----

# ---- db retention (rollups helper) ----


@db_app.command("retention")
def db_retention(
    db: str = typer.Option(
        None, "--db", metavar="URL", help="Database URL (default HEDGEROW_DATABASE_URL, else ./hedgerow.db)."
    ),
    retention: float = typer.Option(
        None,
        "--retention",
        metavar="S",
        help="Delete raw calls older than this many seconds (default HEDGEROW_RETENTION_S, 14 days).",
    ),
    fold_only: bool = typer.Option(False, "--fold-only", help="Fold hourly rollups but delete nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print what was folded and deleted as JSON."),
) -> None:
    """Fold raw calls into hourly rollups, then delete raw calls older than the retention age."""
    import asyncio
    import json

    from hedgerow.controller.errors import StoreError
    from hedgerow.controller.store.retention import run_retention_once

    settings = _server_settings(db, retention_s=retention)
    _require_existing_sqlite_file(settings.database_url)
    try:
        report = asyncio.run(run_retention_once(settings, delete_raw=not fold_only))
    except StoreError as exc:
        raise fail(str(exc), 1) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    typer.echo(retention_line(report.to_dict(), fold_only=fold_only))


def retention_line(summary: dict[str, Any], *, fold_only: bool) -> str:
    """The one line ``db retention`` prints for a run's ``RetentionReport.to_dict()`` summary.

    Args:
        summary: ``folded_hours``, ``deleted_calls``, ``deleted_attempts``, ``cutoff``,
            ``skipped_hours`` and ``dropped_days`` (ISO dates; PostgreSQL only) of the run.
        fold_only: the run deleted nothing (``--fold-only``).
    """
    if fold_only:
        return f"hedgerow: folded {summary['folded_hours']} hour(s); deleted nothing (--fold-only)"
    return (
        f"hedgerow: folded {summary['folded_hours']} hour(s); deleted {summary['deleted_calls']} "
        f"call(s) and {summary['deleted_attempts']} attempt(s) started before {summary['cutoff']}"
        + (f"; kept {summary['skipped_hours']} hour(s) not yet rolled up" if summary["skipped_hours"] else "")
        + (f"; dropped the partitions of {', '.join(summary['dropped_days'])}" if summary["dropped_days"] else "")
    )


# ---- end db retention ----


def main() -> None:
    """Entry point of the console script."""
    app()
