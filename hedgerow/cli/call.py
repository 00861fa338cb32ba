"""``hedgerow call``: one hedged chat completion (or Responses API call), or ``--repeat`` N of them.

The text goes to stdout as it arrives (``--json``: one object at the end); ``--serve`` sends
every call's record to a running api. Exit status: 0 done, 1 the call failed, 2 bad flags,
130 interrupted (SIGINT).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from hedgerow.cli._common import _check_name, _name_problem, _parse_number, _parse_upstream, app, fail

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

#: HedgePolicy fields set by ``hedgerow call`` flags, so that a policy error names the flag.
_CALL_FLAGS = {
    "hedge_after_s": "--hedge-after",
    "stall_timeout_s": "--stall-timeout",
    "total_timeout_s": "--total-timeout",
    "budget": "--budget",
}

#: Exit status of ``hedgerow call`` when SIGINT (Ctrl-C) ended it: 128 + SIGINT, as shells report.
_EXIT_INTERRUPTED = 130


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
