"""Service times of one LLM replica, interpolated from the measured Splitwise perf model.

Source of the figures: Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase
Splitting", ISCA 2024; file ``data/perf_model.csv`` of github.com/Mutinifni/splitwise-sim
(shared read-only as ``../shared/data/traces/splitwise_perf_model.csv``). Columns used: ``model``,
``hardware``, ``tensor_parallel``, ``prompt_size`` (tokens per request), ``batch_size``
(requests), ``token_size`` (output tokens), ``prompt_time`` (ms, prefill of the whole batch) and
``token_time`` (ms, one decode step of the batch). Every point was measured several times; we
average the repeats.

The measured grid is a cross, not a full product: for each (model, hardware, tensor_parallel)
there is a prompt-size arm (128..8192 tokens at batch 1), a batch arm (batch 1..64 at 512-token
prompts) and an output-length arm. Two facts of the data shape the model below:

* prefill time follows the *total* number of prompt tokens in the batch: ``512 x 4`` takes
  197 ms and ``2048 x 1`` 201 ms on llama2-70b/h100/TP4, i.e. batching prompts saves only 2-9%;
* decode-step time depends on the batch size (29.6 ms at 1, 52.0 ms at 64) and not measurably on
  the context length (28.4-30.0 ms from 128 to 8192 prompt tokens at batch 1), so it is modelled
  as a function of the batch size alone.

Model: ``prefill_s(T, b) = f(T) * r(b)`` where ``f`` is the batch-1 prefill time as a function of
the total prompt tokens ``T`` (piecewise linear on log-log axes between the measured points;
clamped to the 128-token figure below 128 tokens; extrapolated *linearly in tokens* beyond 8192
from the last two points, since prefill cost grows at least linearly) and ``r(b)`` is the measured
batching factor ``prefill(512, b) / f(512 b)`` (piecewise linear in log b, clamped to [1, 64]).
At every measured point the model returns the measured mean exactly. ``decode_step_s(b)`` is
piecewise linear in log b over the batch arm, clamped to [1, 64].

When the CSV is absent, a small embedded table (the per-point means of llama2-70b on
h100-80gb with tensor parallel 4, computed from that same file) is used instead.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "DEFAULT_HARDWARE",
    "DEFAULT_MODEL",
    "DEFAULT_TENSOR_PARALLEL",
    "EMBEDDED_SOURCE",
    "PerfModel",
    "PerfModelError",
    "available_configs",
    "default_perf_model_path",
    "load_perf_model",
]

DEFAULT_MODEL = "llama2-70b"
DEFAULT_HARDWARE = "h100-80gb"
DEFAULT_TENSOR_PARALLEL = 4

#: Location of the shared CSV relative to the working directory or to the repository root.
_RELATIVE_CSV = Path("..") / "shared" / "data" / "traces" / "splitwise_perf_model.csv"

#: Per-point means for llama2-70b / h100-80gb / tensor_parallel 4, computed from
#: Mutinifni/splitwise-sim data/perf_model.csv (Patel et al., "Splitwise", ISCA 2024).
#: (prompt_size, batch_size) -> mean prompt_time in ms (averaged over all output lengths).
_EMBEDDED_PREFILL_MS: dict[tuple[int, int], float] = {
    (128, 1): 48.89,
    (256, 1): 54.31,
    (512, 1): 61.04,
    (1024, 1): 106.31,
    (2048, 1): 200.93,
    (4096, 1): 466.40,
    (8192, 1): 943.28,
    (512, 2): 103.65,
    (512, 4): 197.16,
    (512, 8): 442.06,
    (512, 16): 882.22,
    (512, 32): 1727.88,
    (512, 64): 3532.32,
}
#: ``PerfModel.source`` of the embedded table (the fallback when the shared CSV is absent).
EMBEDDED_SOURCE = "embedded table from Splitwise (Patel et al., ISCA 2024), splitwise-sim data/perf_model.csv"
#: batch_size -> mean token_time in ms (averaged over all prompt and output lengths).
_EMBEDDED_DECODE_MS: dict[int, float] = {
    1: 29.41,
    2: 29.99,
    4: 29.98,
    8: 31.41,
    16: 32.84,
    32: 36.92,
    64: 51.99,
}


class PerfModelError(ValueError):
    """The perf-model file is unreadable, malformed, or lacks the requested configuration."""


def default_perf_model_path(repo_root: Path | None = None) -> Path | None:
    """Find the shared Splitwise CSV, or None when it is absent.

    Looks for ``../shared/data/traces/splitwise_perf_model.csv`` relative to the current working
    directory, then relative to the repository root (``repo_root``, default: two levels above
    this file, which is the checkout root in an editable install).

    Returns:
        The first existing path, or None.
    """
    roots = [Path.cwd()]
    roots.append(repo_root if repo_root is not None else Path(__file__).resolve().parents[1])
    for root in roots:
        candidate = (root / _RELATIVE_CSV).resolve()
        if candidate.is_file():
            return candidate
    return None


def _read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            need = {"model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "prompt_time", "token_time"}
            missing = need - set(reader.fieldnames or [])
            if missing:
                raise PerfModelError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
            return list(reader)
    except OSError as exc:
        raise PerfModelError(f"cannot read perf model {path}: {exc.strerror or exc}") from exc


def available_configs(path: str | Path) -> list[tuple[str, str, int]]:
    """List the (model, hardware, tensor_parallel) combinations present in a perf-model CSV.

    Args:
        path: the Splitwise ``perf_model.csv``.

    Returns:
        Sorted list of distinct (model, hardware, tensor_parallel).

    Raises:
        PerfModelError: the file is unreadable or lacks a needed column.
    """
    rows = _read_rows(Path(path))
    out = set()
    for row in rows:
        try:
            out.add((row["model"], row["hardware"], int(row["tensor_parallel"])))
        except ValueError:
            continue
    return sorted(out)


@dataclass(frozen=True)
class PerfModel:
    """Interpolated prefill and decode times of one (model, hardware, tensor_parallel).

    Attributes:
        model, hardware, tensor_parallel: the configuration the figures belong to.
        source: where the figures came from (a file path, or "embedded").
        prefill_ms: measured mean prefill time (ms) per (prompt_size, batch_size) point.
        decode_ms: measured mean decode-step time (ms) per batch size.
    """

    model: str
    hardware: str
    tensor_parallel: int
    source: str
    prefill_ms: dict[tuple[int, int], float]
    decode_ms: dict[int, float]
    # Interpolation tables derived in __post_init__ (not arguments).
    _log_tokens: np.ndarray = field(init=False, repr=False, compare=False)
    _log_prefill: np.ndarray = field(init=False, repr=False, compare=False)
    _tail: tuple[float, float, float] = field(init=False, repr=False, compare=False)
    _log_batch_f: np.ndarray = field(init=False, repr=False, compare=False)
    _factor: np.ndarray = field(init=False, repr=False, compare=False)
    _log_batch_d: np.ndarray = field(init=False, repr=False, compare=False)
    _decode: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        singles = sorted((p, t) for (p, b), t in self.prefill_ms.items() if b == 1)
        if len(singles) < 2:
            raise PerfModelError("perf model needs prefill figures for at least two prompt sizes at batch 1")
        if not self.decode_ms:
            raise PerfModelError("perf model needs at least one decode-step figure")
        log_t = np.log([float(p) for p, _ in singles])
        log_ms = np.log([ms for _, ms in singles])
        object.__setattr__(self, "_log_tokens", log_t)
        object.__setattr__(self, "_log_prefill", log_ms)
        # Linear extrapolation slope (ms per token) past the largest measured prompt.
        (p1, m1), (p2, m2) = singles[-2], singles[-1]
        object.__setattr__(self, "_tail", (float(p2), m2, max((m2 - m1) / (p2 - p1), 0.0)))
        # Batching factor r(b) measured on the batch arm: prefill(p, b) / f(p * b).
        base_prompt = 512 if any(b > 1 and p == 512 for p, b in self.prefill_ms) else None
        factors = {1: 1.0}
        for (p, b), ms in self.prefill_ms.items():
            if b > 1 and (base_prompt is None or p == base_prompt):
                factors[b] = ms / self._batch1_ms(float(p * b))
        bs = sorted(factors)
        object.__setattr__(self, "_log_batch_f", np.log([float(b) for b in bs]))
        object.__setattr__(self, "_factor", np.array([factors[b] for b in bs]))
        dbs = sorted(self.decode_ms)
        object.__setattr__(self, "_log_batch_d", np.log([float(b) for b in dbs]))
        object.__setattr__(self, "_decode", np.array([self.decode_ms[b] for b in dbs]))

    def _batch1_ms(self, tokens: float) -> float:
        """Prefill time (ms) of ``tokens`` prompt tokens as one request (batch 1)."""
        p_max, ms_max, slope = self._tail
        if tokens > p_max:
            return float(ms_max + slope * (tokens - p_max))
        x = math.log(max(tokens, 1.0))
        return float(np.exp(np.interp(x, self._log_tokens, self._log_prefill)))

    def prefill_time_s(self, prompt_tokens: int, batch_size: int = 1) -> float:
        """Time to prefill a group of prompts admitted together.

        Args:
            prompt_tokens: total prompt tokens of the group (sum over its requests), >= 0.
                (A CSV point ``prompt_size=512, batch_size=4`` is ``prompt_tokens=2048``.)
            batch_size: number of requests in the group, >= 1.

        Returns:
            Seconds (float). Below 128 tokens the 128-token figure is used (fixed cost); beyond
            8192 tokens time grows linearly in tokens; batch sizes are clamped to [1, 64].

        Raises:
            ValueError: negative tokens or a batch size below 1.
        """
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        factor = float(np.interp(math.log(batch_size), self._log_batch_f, self._factor))
        return self._batch1_ms(float(prompt_tokens)) * factor / 1000.0

    def decode_step_s(self, batch_size: int) -> float:
        """Time of one decode step (one token for every request of the running batch).

        Args:
            batch_size: requests in the running batch, >= 1 (clamped to the measured 1..64).

        Returns:
            Seconds (float).

        Raises:
            ValueError: a batch size below 1.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return float(np.interp(math.log(batch_size), self._log_batch_d, self._decode)) / 1000.0

    def describe(self) -> str:
        """One line naming the configuration and the source of its figures."""
        return f"{self.model} on {self.hardware} TP{self.tensor_parallel} ({self.source})"


def load_perf_model(
    path: str | Path | None = None,
    *,
    model: str = DEFAULT_MODEL,
    hardware: str = DEFAULT_HARDWARE,
    tensor_parallel: int = DEFAULT_TENSOR_PARALLEL,
    allow_embedded: bool = True,
) -> PerfModel:
    """Load the perf model for one configuration.

    Args:
        path: the Splitwise CSV; None looks for the shared copy (``default_perf_model_path``).
        model, hardware, tensor_parallel: the configuration (see ``available_configs``; the file
            has llama2-70b on a100-80gb / h100-80gb / h100-80gb-pcap at TP 2, 4, 8 and
            bloom-176b at TP 8).
        allow_embedded: when no file is given or found, fall back to the embedded table (which
            covers only the default configuration).

    Returns:
        A ``PerfModel``.

    Raises:
        PerfModelError: an explicit path that cannot be read or parsed, a configuration absent
            from the file, or no file and no usable fallback.
    """
    if path is None:
        found = default_perf_model_path()
        if found is None:
            if not allow_embedded:
                raise PerfModelError(
                    "no perf model file found (looked for ../shared/data/traces/splitwise_perf_model.csv)"
                )
            if (model, hardware, tensor_parallel) != (DEFAULT_MODEL, DEFAULT_HARDWARE, DEFAULT_TENSOR_PARALLEL):
                raise PerfModelError(
                    f"no perf model file found and the embedded table only covers "
                    f"{DEFAULT_MODEL}/{DEFAULT_HARDWARE}/TP{DEFAULT_TENSOR_PARALLEL}"
                )
            return PerfModel(
                model,
                hardware,
                tensor_parallel,
                EMBEDDED_SOURCE,
                dict(_EMBEDDED_PREFILL_MS),
                dict(_EMBEDDED_DECODE_MS),
            )
        path = found
    path = Path(path)
    if not path.is_file():
        raise PerfModelError(f"perf model file not found: {path}")
    rows = _read_rows(path)
    prefill: dict[tuple[int, int], list[float]] = defaultdict(list)
    decode: dict[int, list[float]] = defaultdict(list)
    for line_no, row in enumerate(rows, start=2):
        if (row["model"], row["hardware"]) != (model, hardware):
            continue
        try:
            if int(row["tensor_parallel"]) != tensor_parallel:
                continue
            p, b = int(row["prompt_size"]), int(row["batch_size"])
            pt, tt = float(row["prompt_time"]), float(row["token_time"])
        except (TypeError, ValueError) as exc:
            raise PerfModelError(f"{path}: line {line_no}: bad number ({exc})") from exc
        if not (p > 0 and b > 0 and pt > 0 and tt > 0 and math.isfinite(pt) and math.isfinite(tt)):
            raise PerfModelError(f"{path}: line {line_no}: sizes and times must be positive")
        prefill[(p, b)].append(pt)
        decode[b].append(tt)
    if not prefill:
        combos = ", ".join(f"{m}/{h}/TP{t}" for m, h, t in available_configs(path))
        raise PerfModelError(f"{path} has no rows for {model}/{hardware}/TP{tensor_parallel}; available: {combos}")
    return PerfModel(
        model,
        hardware,
        tensor_parallel,
        str(path),
        {k: float(np.mean(v)) for k, v in prefill.items()},
        {k: float(np.mean(v)) for k, v in decode.items()},
    )
