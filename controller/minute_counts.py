"""Per-(route, minute) counters and TTFT histograms of calls: the rules and the stored encoding (pure).

What one call adds to its route's minute (the UTC minute of ``calls.started_at``), by the sample
rules the tick reads raw calls with (:func:`call_samples`, used by ``jobs.window_records`` too,
over ``_policy_window.ttft_sample``):

- counters: ``calls``; ``hedged`` (``hedge_reason == "ttft_timeout"``); ``backup_wins`` (hedged
  and ``winner == "backup"``); ``denied`` (``hedge_denied``); ``wanted`` (hedged or denied);
- histograms (bucket scheme ``ttft_histogram.HISTOGRAM_SCHEME``, 50 buckets per decade), one
  count per call in at most one bucket of each kind:

  ==================  ====================================================================
  kind                sample
  ==================  ====================================================================
  0 primary observed  the call's first primary attempt had a first token: its TTFT
  1 primary censored  it was cancelled before one: its elapsed time
  2 backup observed   a hedged call's first backup attempt, from its own send: its TTFT
  3 backup censored   that backup cancelled before a first token: its elapsed time
  4 call TTFT         the TTFT the app saw (failed calls and failovers left out)
  ==================  ====================================================================

Encoding of a row's histograms (``minute_aggregates.histograms``): little-endian ``uint32``
pairs ``(key, count)`` sorted by key, ``key = kind * N_BUCKETS + bucket`` (``N_BUCKETS`` = 330),
only non-zero counts; so a row holds as many pairs as distinct (kind, bucket) it touched, at most
5 x 330 = 1,650 (13.2 kB) however many calls the minute had, and any number of rows decode with
one ``numpy.frombuffer`` (:func:`decode_many`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import numpy as np

from hedgerow.controller._policy_window import ttft_sample
from hedgerow.controller.ttft_histogram import N_BUCKETS, bucket_index

__all__ = [
    "BACKUP_CENSORED",
    "BACKUP_OBSERVED",
    "CALL_TTFT",
    "KINDS",
    "MINUTE_S",
    "PRIMARY_CENSORED",
    "PRIMARY_OBSERVED",
    "CallSamples",
    "MinuteCounts",
    "call_samples",
    "count_minutes",
    "decode",
    "decode_many",
    "encode",
    "first_samples",
    "merge_encoded",
    "minute_index",
]

#: Seconds in one aggregate's span.
MINUTE_S = 60
#: Histogram kinds (see the module docstring).
PRIMARY_OBSERVED, PRIMARY_CENSORED, BACKUP_OBSERVED, BACKUP_CENSORED, CALL_TTFT = range(5)
#: Names of the kinds, by kind.
KINDS: tuple[str, ...] = ("primary_observed", "primary_censored", "backup_observed", "backup_censored", "call_ttft")

_PAIR = np.dtype("<u4")


class CallSamples(NamedTuple):
    """What one call tells the tick (``WindowRecords`` fields but its age).

    Attributes:
        primary_s: the first primary attempt's TTFT sample, seconds, or None (no sample).
        primary_censored: True when ``primary_s`` is a censoring time.
        hedged: ``hedge_reason == "ttft_timeout"``.
        backup_won: hedged and the backup won.
        denied: the client's bucket denied a wanted hedge.
        backup_s: a hedged call's first backup sample from its own send, seconds, or None.
        backup_censored: True when ``backup_s`` is a censoring time.
        call_ttft_s: the TTFT the app saw, seconds; None for failed calls and failovers.
    """

    primary_s: float | None
    primary_censored: bool
    hedged: bool
    backup_won: bool
    denied: bool
    backup_s: float | None
    backup_censored: bool
    call_ttft_s: float | None


Sample = tuple[float, bool] | None


def first_samples(attempts: Iterable[tuple[str, float, float | None, float, str]]) -> tuple[Sample, Sample]:
    """The TTFT samples (``_policy_window.ttft_sample``) of a call's first primary and first backup.

    Args:
        attempts: ``(role, start_s, first_token_s, end_s, outcome)`` in attempt order.

    Returns:
        ``(primary, backup)``: each ``(duration_s, censored)`` or None (no such attempt, or it
        failed).
    """
    found: dict[str, Sample] = {}
    for role, start_s, first_token_s, end_s, outcome in attempts:
        if role in ("primary", "backup") and role not in found:  # only the first of each role counts
            found[role] = ttft_sample(start_s, first_token_s, end_s, outcome)
    return found.get("primary"), found.get("backup")


def call_samples(
    hedge_reason: str | None,
    hedge_denied: bool | None,
    winner: str | None,
    ttft_s: float | None,
    primary: Sample,
    backup: Sample,
) -> CallSamples:
    """One call's samples and flags, the one rule of the tick's inputs.

    Args:
        hedge_reason / hedge_denied / winner / ttft_s: the call's fields.
        primary / backup: from :func:`first_samples`.

    Returns:
        A :class:`CallSamples`; the backup sample counts only for a hedge (``ttft_timeout``),
        the call TTFT not for a failover (``primary_error``).
    """
    hedged = hedge_reason == "ttft_timeout"
    backup = backup if hedged else None
    return CallSamples(
        None if primary is None else primary[0],
        False if primary is None else primary[1],
        hedged,
        hedged and winner == "backup",
        bool(hedge_denied),
        None if backup is None else backup[0],
        False if backup is None else backup[1],
        None if hedge_reason == "primary_error" else ttft_s,
    )


def minute_index(moment: datetime) -> int:
    """Whole minutes from 1970-01-01 UTC to the minute holding ``moment`` (aware)."""
    return math.floor(moment.timestamp() / MINUTE_S)


@dataclass(slots=True)
class MinuteCounts:
    """The counters and sparse histograms of one (route, minute), as summed in Python.

    Attributes:
        calls, hedged, backup_wins, denied, wanted: counters (see the module docstring).
        histograms: ``{key: count}``, ``key = kind * N_BUCKETS + bucket``.
    """

    calls: int = 0
    hedged: int = 0
    backup_wins: int = 0
    denied: int = 0
    wanted: int = 0
    histograms: dict[int, int] = field(default_factory=dict)

    def add(self, samples: CallSamples) -> None:
        """Count one call.

        Raises:
            ValueError: a negative, NaN or infinite duration (``ttft_histogram.bucket_index``).
        """
        self.calls += 1
        self.hedged += samples.hedged
        self.backup_wins += samples.backup_won
        self.denied += samples.denied
        self.wanted += samples.hedged or samples.denied
        if samples.primary_s is not None:
            self._count(PRIMARY_CENSORED if samples.primary_censored else PRIMARY_OBSERVED, samples.primary_s)
        if samples.backup_s is not None:
            self._count(BACKUP_CENSORED if samples.backup_censored else BACKUP_OBSERVED, samples.backup_s)
        if samples.call_ttft_s is not None and not math.isnan(samples.call_ttft_s):
            self._count(CALL_TTFT, samples.call_ttft_s)

    def _count(self, kind: int, duration_s: float) -> None:
        key = kind * N_BUCKETS + bucket_index(duration_s)
        self.histograms[key] = self.histograms.get(key, 0) + 1

    def counters(self) -> tuple[int, int, int, int, int]:
        """``(calls, hedged, backup_wins, denied, wanted)``."""
        return self.calls, self.hedged, self.backup_wins, self.denied, self.wanted


def count_minutes(calls: Iterable[tuple[int, datetime, CallSamples]]) -> dict[tuple[int, int], MinuteCounts]:
    """Sum calls into their (route, minute).

    Args:
        calls: ``(route_id, started_at, samples)`` per call (``started_at`` aware UTC).

    Returns:
        ``{(route_id, minute_index): MinuteCounts}``.
    """
    out: dict[tuple[int, int], MinuteCounts] = {}
    for route_id, started_at, samples in calls:
        key = (route_id, minute_index(started_at))
        counts = out.get(key)
        if counts is None:
            counts = out[key] = MinuteCounts()
        counts.add(samples)
    return out


def encode(histograms: Mapping[int, int]) -> bytes:
    """The stored form of sparse histograms ``{key: count}``: sorted ``<u4`` pairs, zeros left out."""
    items = sorted((k, c) for k, c in histograms.items() if c)
    return np.asarray(items, dtype=_PAIR).reshape(-1).tobytes() if items else b""


def decode(blob: bytes | None) -> dict[int, int]:
    """Sparse histograms ``{key: count}`` of a stored value (None or empty: none).

    Raises:
        ValueError: a value whose length is not a whole number of pairs.
    """
    if not blob:
        return {}
    if len(blob) % 8:
        raise ValueError(f"a histogram value of {len(blob)} bytes is not whole (key, count) uint32 pairs")
    pairs = np.frombuffer(blob, dtype=_PAIR).reshape(-1, 2)
    return dict(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), strict=True))


def merge_encoded(stored: bytes | None, added: Mapping[int, int]) -> bytes:
    """The stored histograms plus ``added`` (element-wise sum), encoded."""
    total = decode(stored)
    for key, count in added.items():
        total[key] = total.get(key, 0) + count
    return encode(total)


def decode_many(blobs: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode many rows' histograms at once.

    Args:
        blobs: stored values, one per row.

    Returns:
        ``(row, key, count)``: int64 arrays of one length, one entry per (row, key) pair, rows
        in the order given.

    Raises:
        ValueError: a value that is not whole pairs.
    """
    parts = [b or b"" for b in blobs]
    lengths = np.fromiter((len(b) for b in parts), dtype=np.int64, count=len(parts))
    if np.any(lengths % 8):
        raise ValueError("a histogram value is not whole (key, count) uint32 pairs")
    pairs = np.frombuffer(b"".join(parts), dtype=_PAIR).reshape(-1, 2).astype(np.int64)
    rows = np.repeat(np.arange(len(parts), dtype=np.int64), lengths // 8)
    return rows, pairs[:, 0], pairs[:, 1]
