"""Workloads for the simulated replicas: the Azure LLM inference trace and a synthetic look-alike.

The Azure LLM inference traces (Patel et al., "Splitwise", ISCA 2024; github.com/Azure/
AzurePublicDataset, ``data/AzureLLMInferenceTrace_conv.csv``, CC-BY-4.0) are CSV files with the
columns ``TIMESTAMP`` (e.g. ``2023-11-16 18:15:46.6805900``: 7 fractional digits, no zone),
``ContextTokens`` (prompt tokens) and ``GeneratedTokens`` (output tokens).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

__all__ = [
    "CONV_INPUT_QUANTILES",
    "CONV_INTERARRIVAL_CV",
    "CONV_OUTPUT_QUANTILES",
    "CONV_RATE_PER_S",
    "TraceError",
    "TraceRequest",
    "compress",
    "load_azure_trace",
    "synthetic_trace",
]


class TraceError(ValueError):
    """A trace file is missing, lacks a column, or has a bad row (the message says where)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload.

    Attributes:
        arrival_s: seconds since the first request of the trace (>= 0).
        prompt_tokens: prompt length in tokens (>= 0).
        output_tokens: tokens to generate (>= 1).
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


_TS = re.compile(r"^\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,12}))?\s*(?:Z|[+-]00:?00)?\s*$")


def _parse_timestamp(text: str) -> float:
    """Seconds since the epoch of an Azure trace timestamp (naive, read as UTC)."""
    m = _TS.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a timestamp like 2023-11-16 18:15:46.6805900")
    y, mo, d, h, mi, s, frac = m.groups()
    whole = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=UTC)
    return whole.timestamp() + (float("0." + frac) if frac else 0.0)


def _parse_count(text: str, minimum: int) -> int:
    try:
        value = int(text.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{value} is below {minimum}")
    return value


def load_azure_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read an Azure LLM inference trace CSV.

    Args:
        path: the CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``; other columns are ignored).
        limit: read at most this many requests (the first ones in file order), >= 1; None = all.

    Returns:
        Requests sorted by arrival, ``arrival_s`` measured from the earliest one. Timestamps
        without a zone are read as UTC; any number of fractional digits is accepted.

    Raises:
        TraceError: the file cannot be read, a column is missing, or a row is bad (the message
            names the file, the line number and the column). A zero ``GeneratedTokens`` is bad.
        ValueError: ``limit`` below 1.
    """
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an integer >= 1 or None, got {limit!r}")
    path = Path(path)
    try:
        fh = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    rows: list[tuple[float, int, int]] = []
    with fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise TraceError(
                f"{path}: empty file (expected a header TIMESTAMP,ContextTokens,GeneratedTokens)"
            ) from None
        columns: dict[str, int] = {}
        for name in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"):
            if name not in header:
                raise TraceError(f"{path}: missing column {name!r} (header is {','.join(header)!r})")
            columns[name] = header.index(name)
        for row in reader:
            if limit is not None and len(rows) >= limit:
                break
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            parsed: list[float] = []
            for name, parse in (
                ("TIMESTAMP", _parse_timestamp),
                ("ContextTokens", lambda t: _parse_count(t, 0)),
                ("GeneratedTokens", lambda t: _parse_count(t, 1)),
            ):
                idx = columns[name]
                if idx >= len(row):
                    raise TraceError(f"{path}: line {line}: column {name}: missing value")
                try:
                    parsed.append(parse(row[idx]))
                except ValueError as exc:
                    raise TraceError(f"{path}: line {line}: column {name}: {exc}") from None
            rows.append((parsed[0], int(parsed[1]), int(parsed[2])))
    if not rows:
        return []
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [TraceRequest(round(t - t0, 7), p, o) for t, p, o in rows]


def compress(trace: list[TraceRequest], duration_s: float) -> list[TraceRequest]:
    """Scale a trace's arrival times so that it spans ``duration_s`` seconds.

    Args:
        trace: requests sorted by arrival (as ``load_azure_trace`` returns them).
        duration_s: the new span (last arrival - first arrival), > 0.

    Returns:
        A new list: every ``arrival_s`` multiplied by ``duration_s / span`` (token counts
        unchanged). A trace with fewer than two requests or a zero span is returned unchanged.

    Raises:
        ValueError: ``duration_s`` not a finite positive number.
    """
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    if len(trace) < 2:
        return list(trace)
    start = trace[0].arrival_s
    span = trace[-1].arrival_s - start
    if span <= 0:
        return list(trace)
    factor = duration_s / span
    return [TraceRequest((r.arrival_s - start) * factor, r.prompt_tokens, r.output_tokens) for r in trace]


#: Percentiles (0, 1, 5, 10, 20, ..., 90, 95, 97.5, 99, 99.9, 100) of the conv trace's
#: ContextTokens and GeneratedTokens (19,366 requests), computed from
#: Azure/AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv.
_QUANTILE_LEVELS = (0.0, 1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 97.5, 99.0, 99.9, 100.0)
CONV_INPUT_QUANTILES = (2, 29, 181, 207, 387, 403, 703, 1020, 1071, 1130, 1315, 2734, 4083, 4092, 4142, 6179, 14050)
CONV_OUTPUT_QUANTILES = (7, 16, 41, 54, 77, 91, 103, 129, 177, 384, 400, 424, 451, 522, 601, 954, 1000)
#: Mean arrival rate of the conv trace (19,366 requests over 3,501.7 s).
CONV_RATE_PER_S = 5.53
#: Coefficient of variation of the conv trace's inter-arrival gaps (1.0 would be Poisson).
CONV_INTERARRIVAL_CV = 1.094


def synthetic_trace(
    n: int, rate_per_s: float = CONV_RATE_PER_S, seed: int | None = 0, *, interarrival_cv: float = CONV_INTERARRIVAL_CV
) -> list[TraceRequest]:
    """Generate a workload whose lengths and arrivals follow the Azure conv trace.

    Figures (Azure LLM inference trace, conversation service, 2023-11-16, 19,366 requests over
    one hour; Patel et al., "Splitwise", ISCA 2024; Azure/AzurePublicDataset
    data/AzureLLMInferenceTrace_conv.csv). Published: input tokens p50 1020 / p99 4142, output
    p50 129, ~5.5 req/s. Computed by us from the file: input mean 1155, p90 2735, max 14050;
    output mean 211, p90 424, p99 601, max 1000 (bimodal: 70% under 384); mean rate 5.53 req/s;
    inter-arrival gap mean 0.181 s, p50 0.118 s, coefficient of variation 1.094 (slightly
    burstier than Poisson); prompt and output lengths nearly independent (correlation of their
    logs 0.09). The length distributions are not lognormal (a lognormal matched at p50 puts p99
    of the input near 10,000), so lengths are drawn independently by inverse-CDF sampling of
    the trace's percentiles (``CONV_INPUT_QUANTILES``, ``CONV_OUTPUT_QUANTILES``), linearly
    interpolated between them. Arrivals are a renewal process with gamma-distributed gaps of
    mean ``1 / rate_per_s`` and coefficient of variation ``interarrival_cv`` (1.0 = Poisson);
    the first request arrives at 0.

    Args:
        n: number of requests, >= 0.
        rate_per_s: mean arrival rate (requests per second), > 0.
        seed: seed of the generator (numpy ``default_rng``); None for fresh entropy.
        interarrival_cv: coefficient of variation of the gaps, > 0.

    Returns:
        ``n`` requests sorted by arrival.

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if not (isinstance(rate_per_s, (int, float)) and math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}")
    if not (isinstance(interarrival_cv, (int, float)) and math.isfinite(interarrival_cv) and interarrival_cv > 0):
        raise ValueError(f"interarrival_cv must be a finite number > 0, got {interarrival_cv!r}")
    if n == 0:
        return []
    rng = np.random.default_rng(seed)
    shape = 1.0 / interarrival_cv**2
    gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=n - 1)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    levels = np.asarray(_QUANTILE_LEVELS)
    prompts = np.interp(rng.uniform(0.0, 100.0, size=n), levels, CONV_INPUT_QUANTILES)
    outputs = np.interp(rng.uniform(0.0, 100.0, size=n), levels, CONV_OUTPUT_QUANTILES)
    return [
        TraceRequest(float(a), round(p), max(1, round(o))) for a, p, o in zip(arrivals, prompts, outputs, strict=False)
    ]
