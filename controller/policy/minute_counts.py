"""Per-(route, minute) counters and TTFT histograms of calls: the rules and the stored encoding (pure).

What one call adds to its route's minute (the UTC minute of ``calls.started_at``), by the sample
rules the tick reads raw calls with (:func:`call_samples`, used by ``jobs.window_records`` too,
over ``samples.ttft_sample``):

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import numpy as np

from hedgerow.controller.policy.samples import ttft_sample
from hedgerow.controller.policy.ttft_histogram import N_BUCKETS, bucket_indices

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
    "count_groups",
    "count_minutes",
    "decode",
    "decode_many",
    "encode",
    "first_samples",
    "merge_many",
    "minute_index",
]

#: Seconds in one aggregate's span.
MINUTE_S = 60
#: Histogram kinds (see the module docstring).
PRIMARY_OBSERVED, PRIMARY_CENSORED, BACKUP_OBSERVED, BACKUP_CENSORED, CALL_TTFT = range(5)
#: Names of the kinds, by kind.
KINDS: tuple[str, ...] = ("primary_observed", "primary_censored", "backup_observed", "backup_censored", "call_ttft")

_PAIR = np.dtype("<u4")
#: Distinct keys of one row: 5 kinds x N_BUCKETS.
_KEYS = len(KINDS) * N_BUCKETS


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
    """The TTFT samples (``samples.ttft_sample``) of a call's first primary and first backup.

    Args:
        attempts: ``(role, start_s, first_token_s, end_s, outcome)`` in attempt order.

    Returns:
        ``(primary, backup)``: each ``(duration_s, censored)`` or None (no such attempt, or it
        failed).
    """
    primary: Sample = None
    backup: Sample = None
    want_primary = want_backup = True  # only the first attempt of each role counts
    for role, start_s, first_token_s, end_s, outcome in attempts:
        if want_primary and role == "primary":
            primary, want_primary = ttft_sample(start_s, first_token_s, end_s, outcome), False
        elif want_backup and role == "backup":
            backup, want_backup = ttft_sample(start_s, first_token_s, end_s, outcome), False
    return primary, backup


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


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """The counters and sparse histograms of one (route, minute).

    Attributes:
        calls, hedged, backup_wins, denied, wanted: counters (see the module docstring).
        keys: int64, sorted, ``kind * N_BUCKETS + bucket`` of each non-empty histogram bucket.
        counts: int64, the count of each key (> 0).
    """

    calls: int
    hedged: int
    backup_wins: int
    denied: int
    wanted: int
    keys: np.ndarray
    counts: np.ndarray

    def counters(self) -> tuple[int, int, int, int, int]:
        """``(calls, hedged, backup_wins, denied, wanted)``."""
        return self.calls, self.hedged, self.backup_wins, self.denied, self.wanted


def _floats(column: Sequence[float | None]) -> np.ndarray:
    return np.array(column, dtype=float)  # None reads as NaN


def count_minutes(
    route_ids: Sequence[int], started_at: Sequence[datetime], samples: Sequence[CallSamples]
) -> dict[tuple[int, int], MinuteCounts]:
    """Sum calls into their (route, minute), vectorised.

    Args:
        route_ids / started_at / samples: one entry per call (``started_at`` aware UTC).

    Returns:
        ``{(route_id, minute_index): MinuteCounts}``.

    Raises:
        ValueError: a negative or infinite duration (``ttft_histogram.bucket_indices``), or
            arguments of different lengths.
    """
    n = len(samples)
    if not (len(route_ids) == len(started_at) == n):
        raise ValueError(f"{len(route_ids)} route ids, {len(started_at)} start times, {n} samples")
    if n == 0:
        return {}
    cols = list(zip(*samples, strict=True))
    columns = (
        _floats(cols[0]),
        np.array(cols[1], dtype=bool),
        np.array(cols[2], dtype=bool),
        np.array(cols[3], dtype=bool),
        np.array(cols[4], dtype=bool),
        _floats(cols[5]),
        np.array(cols[6], dtype=bool),
        _floats(cols[7]),
    )
    stamps = np.fromiter((t.timestamp() for t in started_at), dtype=float, count=n)
    minutes = np.floor(stamps / MINUTE_S).astype(np.int64)
    first = int(minutes.min())
    # one int64 per (route, minute): route ids and a batch's span of minutes both fit 32 bits
    combined = (np.asarray(route_ids, dtype=np.int64) << 32) | (minutes - first)
    groups, inverse = np.unique(combined, return_inverse=True)
    size = len(groups)
    group_keys = zip((groups >> 32).tolist(), ((groups & 0xFFFFFFFF) + first).tolist(), strict=True)
    counters, entry_group, keys, counts = count_groups(inverse.reshape(-1), size, columns)
    bounds = np.searchsorted(entry_group, np.arange(size + 1)).tolist()
    calls, hedged, wins, denied, wanted = counters.tolist()
    totals = zip(calls, hedged, wins, denied, wanted, strict=True)
    return {
        (route_id, minute): MinuteCounts(*sums, keys[bounds[i] : bounds[i + 1]], counts[bounds[i] : bounds[i + 1]])
        for i, ((route_id, minute), sums) in enumerate(zip(group_keys, totals, strict=True))
    }


def count_groups(
    inverse: np.ndarray, size: int, columns: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The counters and histogram entries of calls put in groups (the one rule of a minute's counts).

    Ingest groups a batch's calls by (route, minute) (:func:`count_minutes`); the virtual-time
    evaluation groups one route's window by minute (``_minute_window.minutes_of``).

    Args:
        inverse: int (n,), each call's group, in ``0 .. size - 1``.
        size: the number of groups.
        columns: the eight fields of :class:`CallSamples` as arrays of shape (n,), in its order:
            durations float (NaN for none), flags bool.

    Returns:
        ``(counters, entry_group, keys, counts)``: ``counters`` int64 (5, size), per group the
        ``calls``, ``hedged``, ``backup_wins``, ``denied`` and ``wanted``; then one entry per
        non-empty (group, kind, bucket), sorted by group then key: its group (int64), its key
        ``kind * N_BUCKETS + bucket`` (int64) and its count (int64, > 0).

    Raises:
        ValueError: a negative or infinite duration (``ttft_histogram.bucket_indices``).
    """
    primary_s, primary_cens, hedged, won, denied, backup_s, backup_cens, call_s = columns

    def per_group(flags: np.ndarray | None) -> np.ndarray:
        return np.bincount(inverse, weights=flags, minlength=size).astype(np.int64)

    has_primary, has_backup, has_call = ~np.isnan(primary_s), ~np.isnan(backup_s), ~np.isnan(call_s)
    parts = []
    for kind, mask, values in (
        (PRIMARY_OBSERVED, has_primary & ~primary_cens, primary_s),
        (PRIMARY_CENSORED, has_primary & primary_cens, primary_s),
        (BACKUP_OBSERVED, has_backup & ~backup_cens, backup_s),
        (BACKUP_CENSORED, has_backup & backup_cens, backup_s),
        (CALL_TTFT, has_call, call_s),
    ):
        parts.append(inverse[mask] * _KEYS + kind * N_BUCKETS + bucket_indices(values[mask]))
    flat, counts = np.unique(np.concatenate(parts), return_counts=True)
    counters = np.stack(
        [per_group(None), per_group(hedged), per_group(won), per_group(denied), per_group(hedged | denied)]
    )
    return counters, flat // _KEYS, flat % _KEYS, counts


def encode(keys: np.ndarray, counts: np.ndarray) -> bytes:
    """The stored form of sparse histograms: ``<u4`` ``(key, count)`` pairs.

    Args:
        keys: sorted, distinct keys (``kind * N_BUCKETS + bucket``).
        counts: their counts (> 0).
    """
    return np.column_stack((keys, counts)).astype(_PAIR).tobytes()


def decode(blob: bytes | None) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, counts)`` (int64) of a stored value (None or empty: none).

    Raises:
        ValueError: a value whose length is not a whole number of pairs.
    """
    if not blob:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if len(blob) % 8:
        raise ValueError(f"a histogram value of {len(blob)} bytes is not whole (key, count) uint32 pairs")
    pairs = np.frombuffer(blob, dtype=_PAIR).reshape(-1, 2).astype(np.int64)
    return pairs[:, 0], pairs[:, 1]


def merge_many(stored: Sequence[bytes | None], added: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[bytes]:
    """Each stored value plus its added ``(keys, counts)`` (element-wise sums), encoded; all rows
    in one vectorised pass.

    Args:
        stored: stored values, one per row (None or empty: none yet).
        added: ``(keys, counts)`` to add to each row, in the same order (sorted, distinct keys).

    Returns:
        The encoded sums, one per row.

    Raises:
        ValueError: lengths differ, or a stored value that is not whole pairs.
    """
    if len(stored) != len(added):
        raise ValueError(f"{len(stored)} stored values but {len(added)} additions")
    rows = len(stored)
    old_row, old_keys, old_counts = decode_many(stored)
    sizes = np.fromiter((keys.size for keys, _ in added), dtype=np.int64, count=rows)
    new_row = np.repeat(np.arange(rows, dtype=np.int64), sizes)
    parts_keys = [np.asarray(keys, dtype=np.int64) for keys, _ in added]
    parts_counts = [np.asarray(counts, dtype=np.int64) for _, counts in added]
    combined = np.concatenate(
        (
            old_row * _KEYS + old_keys.astype(np.int64),
            new_row * _KEYS + np.concatenate(parts_keys or [np.zeros(0, np.int64)]),
        )
    )
    weights = np.concatenate((old_counts.astype(np.int64), np.concatenate(parts_counts or [np.zeros(0, np.int64)])))
    flat, inverse = np.unique(combined, return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=weights, minlength=flat.size).astype(np.int64)
    pairs = np.column_stack((flat % _KEYS, sums)).astype(_PAIR)
    bounds = np.searchsorted(flat // _KEYS, np.arange(rows + 1)).tolist()
    return [pairs[bounds[i] : bounds[i + 1]].tobytes() for i in range(rows)]


def decode_many(blobs: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode many rows' histograms at once.

    Args:
        blobs: stored values, one per row.

    Returns:
        ``(row, key, count)``: arrays of one length (int64 rows, uint32 keys and counts), one
        entry per (row, key) pair, rows in the order given.

    Raises:
        ValueError: a value that is not whole pairs.
    """
    parts = [b or b"" for b in blobs]
    lengths = np.fromiter((len(b) for b in parts), dtype=np.int64, count=len(parts))
    if np.any(lengths % 8):
        raise ValueError("a histogram value is not whole (key, count) uint32 pairs")
    pairs = np.frombuffer(b"".join(parts), dtype=_PAIR).reshape(-1, 2)
    rows = np.repeat(np.arange(len(parts), dtype=np.int64), lengths // 8)
    return rows, pairs[:, 0].copy(), pairs[:, 1].copy()  # contiguous uint32
