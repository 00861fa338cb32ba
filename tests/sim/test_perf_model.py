"""Perf model: measured means at grid points, monotonicity, extrapolation, fallback, errors."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hedgerow.sim import PerfModelError, available_configs, load_perf_model
from hedgerow.sim import perf_model as pm

from .conftest import PERF_CSV

needs_csv = pytest.mark.skipif(not PERF_CSV.is_file(), reason=f"shared perf model absent: {PERF_CSV}")


def csv_means(
    model: str, hardware: str, tp: int
) -> tuple[dict[tuple[int, int], np.floating[Any]], dict[int, np.floating[Any]]]:
    prefill: defaultdict[tuple[int, int], list[float]] = defaultdict(list)
    decode: defaultdict[int, list[float]] = defaultdict(list)
    with PERF_CSV.open() as fh:
        for row in csv.DictReader(fh):
            if (row["model"], row["hardware"], int(row["tensor_parallel"])) == (model, hardware, tp):
                prefill[int(row["prompt_size"]), int(row["batch_size"])].append(float(row["prompt_time"]))
                decode[int(row["batch_size"])].append(float(row["token_time"]))
    return ({k: np.mean(v) for k, v in prefill.items()}, {k: np.mean(v) for k, v in decode.items()})


@needs_csv
@pytest.mark.parametrize(("model", "hardware", "tp"), [("llama2-70b", "h100-80gb", 4), ("bloom-176b", "a100-80gb", 8)])
def test_grid_points_return_csv_means(model: str, hardware: str, tp: int) -> None:
    perf = load_perf_model(PERF_CSV, model=model, hardware=hardware, tensor_parallel=tp)
    prefill, decode = csv_means(model, hardware, tp)
    assert len(prefill) >= 10
    for (prompt, batch), ms in prefill.items():
        assert perf.prefill_time_s(prompt * batch, batch) == pytest.approx(ms / 1000, rel=1e-9)
    for batch, ms in decode.items():
        assert perf.decode_step_s(batch) == pytest.approx(ms / 1000, rel=1e-9)


@needs_csv
def test_monotone_in_prompt_size_and_bounded() -> None:
    perf = load_perf_model(PERF_CSV)
    for batch in (1, 3, 8, 64):
        times = [perf.prefill_time_s(t, batch) for t in range(0, 40000, 37)]
        assert np.all(np.diff(times) >= 0)
    # Clamped below the smallest prompt, linear in tokens beyond the largest.
    assert perf.prefill_time_s(10) == perf.prefill_time_s(128)
    a, b, c = (perf.prefill_time_s(t) for t in (8192, 12288, 16384))
    assert b - a == pytest.approx(c - b, rel=1e-9) and c > b > a
    assert perf.decode_step_s(500) == perf.decode_step_s(64)
    assert perf.decode_step_s(1) < perf.decode_step_s(64)


@needs_csv
def test_embedded_table_matches_the_file() -> None:
    prefill, decode = csv_means("llama2-70b", "h100-80gb", 4)
    assert set(pm._EMBEDDED_PREFILL_MS) == set(prefill)
    for key, ms in prefill.items():
        assert pm._EMBEDDED_PREFILL_MS[key] == pytest.approx(ms, abs=0.006)
    for batch, ms in decode.items():
        assert pm._EMBEDDED_DECODE_MS[batch] == pytest.approx(ms, abs=0.006)


def test_embedded_fallback_when_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pm, "default_perf_model_path", lambda repo_root=None: None)
    perf = load_perf_model()
    assert "embedded" in perf.source
    assert perf.prefill_time_s(1024) == pytest.approx(0.10631)
    with pytest.raises(PerfModelError, match="embedded table only covers"):
        load_perf_model(model="bloom-176b", hardware="h100-80gb", tensor_parallel=8)


@needs_csv
def test_unknown_configuration_lists_the_available_ones() -> None:
    assert ("llama2-70b", "h100-80gb", 4) in available_configs(PERF_CSV)
    with pytest.raises(PerfModelError, match=r"available: .*llama2-70b/h100-80gb/TP4"):
        load_perf_model(PERF_CSV, model="gpt-9")


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(PerfModelError, match="not found"):
        load_perf_model(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("model,hardware\nx,y\n")
    with pytest.raises(PerfModelError, match="missing column"):
        load_perf_model(bad)
    bad.write_text(
        "model,hardware,tensor_parallel,prompt_size,batch_size,prompt_time,token_time\n"
        "llama2-70b,h100-80gb,4,128,1,abc,3\n"
    )
    with pytest.raises(PerfModelError, match="line 2"):
        load_perf_model(bad)


def test_argument_errors() -> None:
    perf = load_perf_model()
    with pytest.raises(ValueError, match="batch_size"):
        perf.prefill_time_s(100, 0)
    with pytest.raises(ValueError, match="prompt_tokens"):
        perf.prefill_time_s(-1)
    with pytest.raises(ValueError, match="batch_size"):
        perf.decode_step_s(0)
