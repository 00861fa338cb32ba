"""A virtual-time simulation of hedged calls on a cluster of simulated LLM replicas.

No sockets, no sleeps: a discrete-event simulation whose clock is a float of virtual seconds,
driven by a heap of ``(time, sequence, action)`` events. It replays a workload (``TraceRequest``
list, e.g. the Azure conversation trace) through ``replicas`` simulated replicas and hedges the
calls the way ``hedgerow.client.HedgingClient`` does, so that hours of traffic take seconds.

Replica model (the same scheduling as ``hedgerow.sim.engine.ReplicaEngine``, in virtual time):
a FIFO waiting queue and a batch of at most ``max_batch`` requests. Whenever the replica is free,
if requests wait and the batch has room, up to ``room`` of them are admitted and prefilled as one
step lasting ``perf.prefill_time_s(sum of their prompt tokens, count) * slowdown``; the running
batch does not decode meanwhile (prefill head-of-line blocking); at its end each admitted
request has its first token. Otherwise one decode step of the running batch lasts
``perf.decode_step_s(batch size) * slowdown`` and gives every running request one token; those
that reach their output length finish and leave. An abort frees the slot at once; a prefill
already under way keeps its duration (GPU work cannot be recalled). Service times come from the
Splitwise perf model (``hedgerow.sim.perf_model``) unscaled (``time_scale`` 1: the measured GPU).
Instead of adding one token per request per step, each replica counts its decode steps and a
request's tokens are ``1 + steps - steps_at_admission``; finishing requests sit in a heap keyed
by the step they finish at, so a step costs O(log n) whatever the batch size. Cross-check (a
one-off run, not a test): 60 requests of ``synthetic_trace(120, rate_per_s=6.0, seed=11)``
(outputs capped at 80 tokens) on one replica with ``max_batch=8``, through the asyncio
``ReplicaEngine`` at ``time_scale=0.5`` and through this simulation: TTFT P50 / P90 / max
2.872 / 5.609 / 6.632 s vs 2.873 / 5.607 / 6.635 s, median per-request difference 2 ms
(the engine's timer jitter).

Calls (the client's semantics, docs/DESIGN.md "client"), decided by the client's own race core
(``hedgerow.client._race.Race``, one per call: the hedge timer and budget, the winner, the
loser's cancellation), which the simulation drives in virtual time with an attempt's first and
last token as inputs:

1. at its arrival a call deposits into the hedge budget (``hedgerow.client.budget.HedgeBudget``,
   a token bucket counted per call, so it needs no clock) and sends its primary to a replica
   (``balance="random"``: uniform, seeded; ``"round_robin"``: call ``i`` to replica ``i % n``);
2. if the primary has no first token ``hedge_after_s`` later (the value the threshold source
   gives at the call's arrival; ``None`` = no hedging), the call asks the budget; if granted,
   a backup goes to the next replica (``(primary + 1) % n``), else ``hedge_denied`` is set;
3. the first attempt to produce a first token wins; the other is cancelled at that instant by
   the client (the loser's TTFT sample, the primary's from the call's arrival and the backup's
   from its own send, is then censored at its elapsed time) and aborted at
   its replica ``cancel_latency_s`` later. The loser's *wasted completion tokens* are the tokens
   its replica generated before the abort took effect (0 unless it produced a first token within
   the cancel latency); its *wasted prefill tokens* are its prompt tokens when its prefill had
   started;
4. the call ends when the winner has generated its output; its record becomes visible to the
   controller ``export_delay_s`` later (the telemetry exporter's flush).

A ``tick`` callback, when given, runs every ``tick_interval_s`` virtual seconds with the records
visible so far (in visibility order), like the scheduled controller job reading the store. A
slowdown change (``shift_at_s``, ``shift_replica``, ``shift_factor``) models a load shift: from
that time on, every step the replica starts takes ``shift_factor`` times longer.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from hedgerow.client._race import Cancel, Race, Start, Won
from hedgerow.client.budget import FailoverBudget, HedgeBudget
from hedgerow.client.chunks import ChunkKind
from hedgerow.sim.perf_model import PerfModel
from hedgerow.sim.trace import TraceRequest

__all__ = [
    "ClusterConfig",
    "ThresholdSource",
    "TickCallback",
    "VirtualCall",
    "VirtualResult",
    "simulate",
]

#: ``hedge_after_s`` of a call given the virtual time of its arrival (None = no hedging).
ThresholdSource = Callable[[float], "float | None"]
#: Called every tick with (virtual now, every record visible so far, in visibility order).
TickCallback = Callable[[float, Sequence["VirtualCall"]], None]

_BALANCES = ("random", "round_robin")

#: What the race is told at an attempt's first token and at its last (the sim has no chunks).
_FIRST_TOKEN = ChunkKind(True, True, None, None)
_FINISHED = ChunkKind(False, False, "stop", None, (0,))
#: ``started_at`` of the races (virtual time has no wall clock; the records are not exported).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _positive(name: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The simulated cluster and client of one run.

    Attributes:
        replicas: number of replicas, >= 2 (a backup goes to a different one).
        max_batch: batch bound of every replica (requests), >= 1.
        shift_at_s: virtual time of the load shift, seconds; None = no shift.
        shift_replica: index of the replica that slows down (negative counts from the end).
        shift_factor: service-time factor of that replica after the shift (3.0 = 3x slower), > 0.
        balance: how primaries are spread: ``"random"`` (uniform, seeded) or ``"round_robin"``.
        cancel_latency_s: delay between the client cancelling the loser and its replica
            aborting it, seconds, >= 0.
        export_delay_s: delay between a call's end and its record being visible to ticks,
            seconds, >= 0.
        budget: hedge budget, tokens deposited per call, in [0, 1].
        budget_burst: capacity of the hedge token bucket, >= 0 (``HedgePolicy.budget_burst``).
        seed: seed of the random primary choice.

    Raises:
        ValueError: a field out of range (named in the message).
        TypeError: ``seed`` is not an integer.
    """

    replicas: int = 3
    max_batch: int = 32
    shift_at_s: float | None = None
    shift_replica: int = -1
    shift_factor: float = 3.0
    balance: str = "random"
    cancel_latency_s: float = 0.02
    export_delay_s: float = 1.0
    budget: float = 0.10
    budget_burst: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or isinstance(self.replicas, bool) or self.replicas < 2:
            raise ValueError(f"replicas must be an integer >= 2, got {self.replicas!r}")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool) or self.max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {self.max_batch!r}")
        if self.shift_at_s is not None:
            _positive("shift_at_s", self.shift_at_s, allow_zero=True)
        if not isinstance(self.shift_replica, int) or not (-self.replicas <= self.shift_replica < self.replicas):
            raise ValueError(
                f"shift_replica must be an index into {self.replicas} replicas, got {self.shift_replica!r}"
            )
        _positive("shift_factor", self.shift_factor)
        if self.balance not in _BALANCES:
            raise ValueError(f"balance must be one of {', '.join(_BALANCES)}, got {self.balance!r}")
        _positive("cancel_latency_s", self.cancel_latency_s, allow_zero=True)
        _positive("export_delay_s", self.export_delay_s, allow_zero=True)
        _positive("budget", self.budget, allow_zero=True)
        if self.budget > 1:
            raise ValueError(f"budget must be in [0, 1], got {self.budget!r}")
        _positive("budget_burst", self.budget_burst, allow_zero=True)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"seed must be an integer, got {self.seed!r}")


class VirtualCall:
    """One call of the run and, once finished, its record. Times are virtual seconds.

    Attributes:
        index: position in the workload (arrival order).
        arrival_s: when the call started.
        prompt_tokens / output_tokens: the request's sizes.
        primary / backup: replica indices; ``backup`` is None when no backup was sent.
        hedge_after_s: the threshold in force at the arrival (None = no hedging).
        hedged: a backup was sent (``hedge_reason = "ttft_timeout"``).
        hedge_denied: the threshold passed but the budget refused the hedge.
        winner: ``"primary"`` or ``"backup"`` (None while in flight).
        ttft_s: the call's TTFT (first token of the winner - arrival).
        primary_ttft_s: the primary's duration as a controller sample: its TTFT when it won,
            else the time it was cancelled at (arrival to the backup's first token).
        primary_censored: True when ``primary_ttft_s`` is a censoring time.
        backup_ttft_s: the backup's duration as a controller sample, measured from its own send
            (``arrival_s + hedge_after_s``): its TTFT when it won, else the time it was
            cancelled at (the primary's first token); None without a backup.
        backup_censored: True when ``backup_ttft_s`` is a censoring time.
        end_s: when the winner produced its last token (None while in flight).
        visible_s: when the record reached the store (``end_s + export_delay_s``).
        wasted_completion_tokens: tokens the loser generated before its abort took effect.
        wasted_prefill_tokens: the loser's prompt tokens when its prefill had started.
    """

    __slots__ = (
        "_attempts",
        "_race",
        "arrival_s",
        "backup",
        "backup_censored",
        "backup_start_s",
        "backup_ttft_s",
        "end_s",
        "hedge_after_s",
        "hedge_denied",
        "hedged",
        "index",
        "output_tokens",
        "primary",
        "primary_censored",
        "primary_ttft_s",
        "prompt_tokens",
        "ttft_s",
        "visible_s",
        "wasted_completion_tokens",
        "wasted_prefill_tokens",
        "winner",
    )  # fmt: skip

    def __init__(self, index: int, request: TraceRequest, primary: int, hedge_after_s: float | None) -> None:
        self.index = index
        self.arrival_s = request.arrival_s
        self.prompt_tokens = request.prompt_tokens
        self.output_tokens = request.output_tokens
        self.primary = primary
        self.backup: int | None = None
        self.backup_start_s: float | None = None
        self.backup_ttft_s: float | None = None
        self.backup_censored = False
        self.hedge_after_s = hedge_after_s
        self.hedged = False
        self.hedge_denied = False
        self.winner: str | None = None
        self.ttft_s: float | None = None
        self.primary_ttft_s: float | None = None
        self.primary_censored = False
        self.end_s: float | None = None
        self.visible_s: float | None = None
        self.wasted_completion_tokens = 0
        self.wasted_prefill_tokens = 0
        self._attempts: list[_Attempt] = []
        self._race: Race | None = None

    def __repr__(self) -> str:
        return (
            f"VirtualCall({self.index}, arrival_s={self.arrival_s:.3f}, winner={self.winner},"
            f" ttft_s={self.ttft_s}, hedged={self.hedged})"
        )


class _Attempt:
    """One attempt inside a replica (state: waiting, prefill, running, finished, aborted)."""

    __slots__ = ("base_step", "call", "generated_at_abort", "race_state", "replica", "role", "seq", "state")

    def __init__(self, call: VirtualCall, role: str, replica: int, seq: int, race_state: Any = None) -> None:
        self.race_state = race_state  # the race's AttemptState of this attempt
        self.call = call
        self.role = role
        self.replica = replica
        self.state = "waiting"
        self.base_step = 0
        self.generated_at_abort = 0
        self.seq = seq


@dataclass(slots=True)
class _ReplicaStats:
    submitted: int = 0
    prefills: int = 0
    decode_steps: int = 0
    busy_s: float = 0.0
    admitted: int = 0
    finished: int = 0
    aborted: int = 0


@dataclass(frozen=True, slots=True)
class VirtualResult:
    """What one run produced.

    Attributes:
        calls: every call, in arrival order, each finished exactly once.
        replica_stats: per replica: submitted (attempts), prefills, decode_steps, busy_s
            (virtual seconds of service), admitted, finished, aborted; every submitted attempt
            ends either finished or aborted.
        end_s: virtual time of the last event.
        events: number of events processed.
    """

    calls: list[VirtualCall]
    replica_stats: list[dict[str, float]] = field(default_factory=list)
    end_s: float = 0.0
    events: int = 0


class _Sim:
    """The event loop and the replicas of one run (see the module docstring)."""

    def __init__(
        self,
        perf: PerfModel,
        config: ClusterConfig,
        threshold: ThresholdSource,
        tick: TickCallback | None,
        tick_interval_s: float,
    ) -> None:
        self.config = config
        self.perf = perf
        self.threshold = threshold
        self.tick = tick
        self.tick_interval_s = tick_interval_s
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.events = 0
        n = config.replicas
        self.budget = HedgeBudget(config.budget, config.budget_burst)
        self.failover_budget = FailoverBudget()  # simulated replicas never fail: it stays full
        self.slowdown = [1.0] * n
        self.waiting: list[deque[_Attempt]] = [deque() for _ in range(n)]
        self.in_batch = [0] * n  # prefilling + running (slots taken)
        self.running: list[dict[int, _Attempt]] = [{} for _ in range(n)]
        self.finish_heap: list[list[tuple[int, int, _Attempt]]] = [[] for _ in range(n)]
        self.steps = [0] * n
        self.busy = [False] * n
        self.stats = [_ReplicaStats() for _ in range(n)]
        self.visible: list[VirtualCall] = []
        self.pending_calls = 0  # arrived, record not yet visible
        self.arrivals_left = 0  # calls not yet arrived
        # decode_step_s(b) for b = 1..max_batch, looked up instead of interpolated per step
        self._decode_s = [0.0] + [perf.decode_step_s(b) for b in range(1, config.max_batch + 1)]

    # --- event heap -----------------------------------------------------------------------------

    def at(self, when: float, action: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action, arg))

    def run(self) -> None:
        heap = self._heap
        while heap:
            when, _, action, arg = heapq.heappop(heap)
            self.now = when
            self.events += 1
            action(arg)

    # --- replicas -------------------------------------------------------------------------------

    def submit(self, attempt: _Attempt) -> None:
        r = attempt.replica
        self.waiting[r].append(attempt)
        self.stats[r].submitted += 1
        if not self.busy[r]:
            self._start_step(r)

    def _start_step(self, r: int) -> None:
        room = self.config.max_batch - self.in_batch[r]
        waiting = self.waiting[r]
        scale = self.slowdown[r]
        stats = self.stats[r]
        if waiting and room > 0:
            group = [waiting.popleft() for _ in range(min(room, len(waiting)))]
            for attempt in group:
                attempt.state = "prefill"
            self.in_batch[r] += len(group)
            stats.prefills += 1
            stats.admitted += len(group)
            dt = self.perf.prefill_time_s(sum(a.call.prompt_tokens for a in group), len(group)) * scale
            self.busy[r] = True
            stats.busy_s += dt
            self.at(self.now + dt, self._prefill_done, (r, group))
        elif self.running[r]:
            dt = self._decode_s[len(self.running[r])] * scale
            self.busy[r] = True
            stats.decode_steps += 1
            stats.busy_s += dt
            self.at(self.now + dt, self._decode_done, r)
        else:
            self.busy[r] = False

    def _prefill_done(self, arg: tuple[int, list[_Attempt]]) -> None:
        r, group = arg
        for attempt in group:
            if attempt.state != "prefill":  # aborted while its prefill ran
                continue
            attempt.state = "running"
            attempt.base_step = self.steps[r]
            call = attempt.call
            if call.output_tokens <= 1:
                self._first_token(attempt)
                self._finish(attempt)
            else:
                self.running[r][attempt.seq] = attempt
                # tokens = 1 + steps - base_step reaches output_tokens at this step:
                heapq.heappush(self.finish_heap[r], (attempt.base_step + call.output_tokens - 1, attempt.seq, attempt))
                self._first_token(attempt)
        self._start_step(r)

    def _decode_done(self, r: int) -> None:
        self.steps[r] += 1
        step = self.steps[r]
        heap = self.finish_heap[r]
        while heap and heap[0][0] <= step:
            _, _, attempt = heapq.heappop(heap)
            if attempt.state == "running":
                del self.running[r][attempt.seq]
                self._finish(attempt)
        self._start_step(r)

    def _finish(self, attempt: _Attempt) -> None:
        r = attempt.replica
        attempt.state = "finished"
        self.in_batch[r] -= 1
        self.stats[r].finished += 1
        call = attempt.call
        if call.winner == attempt.role:
            race = call._race
            assert race is not None
            race.chunk(attempt.race_state, _FINISHED, self.now)
            race.ended(attempt.race_state, self.now)
            call.end_s = self.now
            self.at(self.now + self.config.export_delay_s, self._visible, call)
        else:  # a loser that finished before its abort arrived: all its tokens were wasted
            attempt.generated_at_abort = call.output_tokens
            self._account_waste(attempt, prefilled=True)

    def _abort(self, attempt: _Attempt) -> None:
        r = attempt.replica
        state = attempt.state
        if state == "waiting":
            self.waiting[r].remove(attempt)
        elif state == "prefill":
            self.in_batch[r] -= 1
        elif state == "running":
            attempt.generated_at_abort = 1 + self.steps[r] - attempt.base_step
            del self.running[r][attempt.seq]
            self.in_batch[r] -= 1
        else:  # finished (waste already counted) or aborted
            return
        attempt.state = "aborted"
        self.stats[r].aborted += 1
        self._account_waste(attempt, prefilled=state in ("prefill", "running"))
        if not self.busy[r]:
            self._start_step(r)

    def _account_waste(self, attempt: _Attempt, *, prefilled: bool) -> None:
        call = attempt.call
        call.wasted_completion_tokens += attempt.generated_at_abort
        if prefilled:
            call.wasted_prefill_tokens += call.prompt_tokens

    # --- calls ----------------------------------------------------------------------------------

    def _first_token(self, attempt: _Attempt) -> None:
        call = attempt.call
        race = call._race
        assert race is not None
        actions = race.chunk(attempt.race_state, _FIRST_TOKEN, self.now)
        if not any(isinstance(action, Won) for action in actions):
            return  # the loser's token: it is cancelled already, its abort is on the way
        call.winner = attempt.role
        call.ttft_s = self.now - call.arrival_s
        call.primary_ttft_s = call.ttft_s  # primary won: observed; backup won: censored here
        call.primary_censored = attempt.role == "backup"
        if call.backup_start_s is not None:  # the backup's sample: observed, or censored here
            call.backup_ttft_s = self.now - call.backup_start_s
            call.backup_censored = attempt.role == "primary"
        cancelled = {id(action.attempt) for action in actions if isinstance(action, Cancel)}
        for other in call._attempts:
            if id(other.race_state) in cancelled:
                if self.config.cancel_latency_s > 0:
                    self.at(self.now + self.config.cancel_latency_s, self._abort_event, other)
                else:
                    self._abort(other)

    def _abort_event(self, attempt: _Attempt) -> None:
        self._abort(attempt)

    def arrive(self, arg: tuple[VirtualCall, float | None]) -> None:
        call, hedge_after_s = arg
        backup = (call.primary + 1) % self.config.replicas
        race = Race(
            [f"replica{call.primary}", f"replica{backup}"],
            hedge_after_s=0.0 if hedge_after_s is None else hedge_after_s,
            hedging_enabled=hedge_after_s is not None,
            max_backups=1,
            total_timeout_s=math.inf,
            stall_timeout_s=None,
            budget=self.budget,
            failover_budget=self.failover_budget,
            request_id=str(call.index),
            route="virtual",
            model="virtual",
            started_at=_EPOCH,
        )
        call._race = race
        self.pending_calls += 1
        (start,) = race.begin(self.now)  # the one budget deposit of the call
        assert isinstance(start, Start)
        race.sent(start.attempt, self.now)
        attempt = _Attempt(call, "primary", call.primary, self._next_seq(), start.attempt)
        call._attempts.append(attempt)
        if race.deadline < math.inf:
            self.at(race.deadline, self._hedge_timer, call)
        self.submit(attempt)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _hedge_timer(self, call: VirtualCall) -> None:
        race = call._race
        assert race is not None
        starts = [action for action in race.tick(self.now) if isinstance(action, Start)]
        call.hedge_denied = race.hedge_denied
        if not starts:
            return
        race.sent(starts[0].attempt, self.now)
        call.hedged = True
        call.backup = (call.primary + 1) % self.config.replicas
        call.backup_start_s = self.now
        attempt = _Attempt(call, "backup", call.backup, self._next_seq(), starts[0].attempt)
        call._attempts.append(attempt)
        self.submit(attempt)

    def _visible(self, call: VirtualCall) -> None:
        call.visible_s = self.now
        self.visible.append(call)
        self.pending_calls -= 1

    def _shift(self, r: int) -> None:
        self.slowdown[r] = self.config.shift_factor

    def _tick(self, _: Any) -> None:
        assert self.tick is not None
        self.tick(self.now, self.visible)
        if self.pending_calls > 0 or self.arrivals_left > 0:
            self.at(self.now + self.tick_interval_s, self._tick)


def simulate(
    trace: Sequence[TraceRequest],
    perf: PerfModel,
    config: ClusterConfig = ClusterConfig(),
    *,
    threshold: float | ThresholdSource | None = None,
    tick: TickCallback | None = None,
    tick_interval_s: float = 60.0,
) -> VirtualResult:
    """Replay ``trace`` through the virtual cluster with hedging (see the module docstring).

    Args:
        trace: requests sorted by ``arrival_s`` (seconds, >= 0), e.g. from
            ``hedgerow.sim.trace.load_azure_trace``.
        perf: the service-time model (``hedgerow.sim.perf_model.load_perf_model()``).
        config: the cluster, client and budget.
        threshold: the calls' ``hedge_after_s``: None (no hedging), a number of seconds (fixed),
            or a function of the virtual arrival time returning seconds or None (adaptive; it is
            asked once per call, at its arrival).
        tick: called every ``tick_interval_s`` (first at ``tick_interval_s``) with the virtual
            time and the list of records visible so far, in visibility order; ticks stop once
            every call is visible.
        tick_interval_s: seconds between ticks, > 0.

    Returns:
        A ``VirtualResult`` with every call finished exactly once.

    Raises:
        ValueError: arrivals not sorted or negative, a bad threshold, or a bad interval.
        TypeError: ``config`` is not a ``ClusterConfig``.
    """
    if not isinstance(config, ClusterConfig):
        raise TypeError(f"config must be a ClusterConfig, got {type(config).__name__}")
    _positive("tick_interval_s", tick_interval_s)
    if threshold is None or callable(threshold):
        source: ThresholdSource = threshold if callable(threshold) else (lambda _now: None)
    else:
        _positive("threshold", threshold, allow_zero=True)
        fixed = float(threshold)

        def source(_now: float) -> float | None:
            return fixed

    sim = _Sim(perf, config, source, tick, tick_interval_s)
    n = config.replicas
    rng = np.random.default_rng(config.seed)
    if config.balance == "random":
        primaries = rng.integers(0, n, size=len(trace)).tolist()
    else:
        primaries = [i % n for i in range(len(trace))]
    calls: list[VirtualCall] = []
    previous = 0.0
    for i, request in enumerate(trace):
        if not (math.isfinite(request.arrival_s) and request.arrival_s >= previous):
            raise ValueError(f"trace[{i}].arrival_s = {request.arrival_s!r}: arrivals must be finite, >= 0 and sorted")
        previous = request.arrival_s
        calls.append(VirtualCall(i, request, int(primaries[i]), None))
    sim.arrivals_left = len(calls)

    # Arrivals are fed lazily (one pending at a time) to keep the heap small; the threshold is
    # asked at the arrival's virtual time, after every earlier event (ticks included).
    def feed(i: int) -> None:
        call = calls[i]
        hedge_after_s = sim.threshold(sim.now)
        if hedge_after_s is not None:
            _positive("threshold", hedge_after_s, allow_zero=True)
        call.hedge_after_s = hedge_after_s
        sim.arrivals_left -= 1
        sim.arrive((call, hedge_after_s))
        if i + 1 < len(calls):
            sim.at(calls[i + 1].arrival_s, feed, i + 1)

    if calls:
        sim.at(calls[0].arrival_s, feed, 0)
    if config.shift_at_s is not None:
        sim.at(config.shift_at_s, sim._shift, config.shift_replica % n)
    if tick is not None and calls:
        sim.at(tick_interval_s, sim._tick)
    sim.run()
    for call in calls:
        call._attempts = []  # the attempts are done with; keep results light
        call._race = None
    stats = [
        {
            "submitted": s.submitted,
            "prefills": s.prefills,
            "decode_steps": s.decode_steps,
            "busy_s": s.busy_s,
            "admitted": s.admitted,
            "finished": s.finished,
            "aborted": s.aborted,
        }
        for s in sim.stats
    ]
    return VirtualResult(calls=calls, replica_stats=stats, end_s=sim.now, events=sim.events)
