"""The controller job in virtual time, for ``bench/controller_eval.py`` (both suites).

``VirtualController`` gathers the records a simulated run has made visible so far, as the live tick
does, and runs the live tick's own code on them (``observe_window``, then ``decide``); see the
docstring of ``bench/controller_eval.py`` for what it feeds the rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from hedgerow.controller.policy._policy_window import WindowData, WindowRecords, observe_window
from hedgerow.controller.policy.policy import PolicyKnobs, RouteConfig, decide
from hedgerow.controller.store._minute_window import RECENT_CALLS, minutes_of, raw_since, tick_window
from hedgerow.settings import Settings
from hedgerow.sim.virtual import VirtualCall

__all__ = ["VirtualController"]


class VirtualController:
    """The controller job in virtual time: gathers samples like ``controller.jobs``, then decides.

    Args:
        config: the route's configuration (budget, default/min/max ``hedge_after_s``).
        settings: windows, ``min_samples``, ``confidence`` and the policy knobs.
        minutes: give the rules the calls as the live tick reads them
            (``_minute_window.tick_window``: minute aggregates, durations to their bucket and
            starts to their minute, before ``raw_since(now)``; the calls after it as they are),
            instead of one entry per call.
        bounded: give the rules the calls as the bounded tick reads them (the latest
            ``RECENT_CALLS`` one by one, the others in their minute's aggregates); implies
            minute aggregates.

    Attributes:
        current: the published ``hedge_after_s`` (None before the first publication).
        source: the published value's source (``Decision.source``; None before the first
            publication), passed to ``decide`` as ``controller.jobs`` passes ``thresholds.source``.
        history: one dict per tick: ``t_s``, ``hedge_after_s``, ``reason``, ``samples``,
            ``censored``, ``window_s``, ``p90_s``, ``p99_s``, ``target_s``,
            ``observed_hedge_rate``, ``short_window_hedge_rate``, ``backup_win_rate``.
    """

    def __init__(
        self, config: RouteConfig, settings: Settings, *, minutes: bool = False, bounded: bool = False
    ) -> None:
        self.config = config
        self.settings = settings
        self.minutes = minutes
        self.bounded = bounded
        self.knobs = PolicyKnobs.from_settings(settings)
        self.current: float | None = None
        self.source: str | None = None
        self.history: list[dict[str, Any]] = []
        self._seen = 0
        self._arrival: list[float] = []
        self._duration: list[float] = []
        self._censored: list[bool] = []
        self._hedged: list[bool] = []
        self._backup_won: list[bool] = []
        self._denied: list[bool] = []
        self._backup_duration: list[float] = []  # NaN without a backup
        self._backup_censored: list[bool] = []
        self._ttft: list[float] = []

    def threshold(self, _now: float) -> float:
        """The ``hedge_after_s`` a client uses now: the published value, else the default."""
        return self.config.default_hedge_after_s if self.current is None else self.current

    def _absorb(self, visible: Sequence[VirtualCall]) -> None:
        for call in visible[self._seen :]:
            assert call.primary_ttft_s is not None
            self._arrival.append(call.arrival_s)
            self._duration.append(call.primary_ttft_s)
            self._censored.append(call.primary_censored)
            self._hedged.append(call.hedged)
            self._backup_won.append(call.hedged and call.winner == "backup")
            self._denied.append(call.hedge_denied)
            backup_s = call.backup_ttft_s if call.hedged else None
            self._backup_duration.append(math.nan if backup_s is None else backup_s)
            self._backup_censored.append(call.backup_censored)
            self._ttft.append(call.ttft_s if call.ttft_s is not None else math.nan)
        self._seen = len(visible)

    def tick(self, now: float, visible: Sequence[Any]) -> None:
        """One tick at virtual time ``now`` over the records visible so far (see the module doc).

        The records become ``WindowRecords`` and go through ``observe_window`` and ``decide``,
        the code ``hedgerow.controller.jobs`` runs on the store's records.
        """
        self._absorb(visible)
        arrival = np.asarray(self._arrival, dtype=float)
        keep = arrival > now - max(self.settings.max_window_s, self.settings.window_s)
        hedged = np.asarray(self._hedged, dtype=bool)[keep]
        records = WindowRecords(
            age_s=now - arrival[keep],
            primary_s=np.asarray(self._duration, dtype=float)[keep],
            primary_censored=np.asarray(self._censored, dtype=bool)[keep],
            hedged=hedged,
            backup_won=np.asarray(self._backup_won, dtype=bool)[keep],
            denied=np.asarray(self._denied, dtype=bool)[keep],
            backup_s=np.asarray(self._backup_duration, dtype=float)[keep],
            backup_censored=np.asarray(self._backup_censored, dtype=bool)[keep],
            call_ttft_s=np.asarray(self._ttft, dtype=float)[keep],
        )
        budget = self.config.budget if 0.0 < self.config.budget < 1.0 else None
        data: WindowRecords | WindowData = records
        if self.bounded:
            at = datetime.fromtimestamp(now, UTC)
            latest = np.zeros(records.age_s.size, dtype=bool)
            latest[np.argsort(records.age_s, kind="stable")[:RECENT_CALLS]] = True
            data = tick_window(minutes_of(records.select(~latest), at), records.select(latest), at)
        elif self.minutes:
            at = datetime.fromtimestamp(now, UTC)
            recent = records.age_s <= now - raw_since(at).timestamp()
            data = tick_window(minutes_of(records.select(~recent), at), records.select(recent), at)
        observation = observe_window(data, settings=self.settings, budget=budget, knobs=self.knobs)
        estimate = observation.estimate
        window = observation.window_s
        decision = decide(self.config, self.current, observation, self.knobs, current_source=self.source)
        self.current = decision.hedge_after_s
        self.source = decision.source
        self.history.append(
            {
                "t_s": now,
                "hedge_after_s": decision.hedge_after_s,
                "applied": decision.applied,
                "reason": decision.reason,
                "samples": 0 if estimate is None else estimate.samples,
                "censored": 0 if estimate is None else estimate.censored,
                "window_s": window,
                "p90_s": None if estimate is None else estimate.p90_s,
                "p99_s": None if estimate is None else estimate.p99_s,
                "target_s": None if estimate is None else estimate.target_s,
                "observed_hedge_rate": observation.observed_hedge_rate,
                "short_window_hedge_rate": observation.short_window_hedge_rate,
                "short_window_wanted_rate": observation.short_window_wanted_rate,
                "short_window_target_s": observation.short_window_target_s,
                "backup_win_rate": observation.backup_win_rate,
                "details": decision.details or None,
            }
        )
