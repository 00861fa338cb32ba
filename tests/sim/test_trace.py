"""Trace loader (real Azure file and malformed files), compress, synthetic workload statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hedgerow.sim import TraceError, TraceRequest, compress, load_azure_trace, synthetic_trace

from .conftest import CONV_CSV


@pytest.mark.skipif(not CONV_CSV.is_file(), reason=f"shared Azure conv trace absent: {CONV_CSV}")
def test_real_conv_trace() -> None:
    trace = load_azure_trace(CONV_CSV)
    assert len(trace) == 19366
    arrivals = np.array([r.arrival_s for r in trace])
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    assert arrivals[-1] == pytest.approx(3501.72, abs=0.01)
    # Second request: 18:15:50.9951690 - 18:15:46.6805900, all 7 fractional digits kept.
    assert trace[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    prompts = np.array([r.prompt_tokens for r in trace])
    outputs = np.array([r.output_tokens for r in trace])
    assert np.percentile(prompts, 50) == 1020 and np.percentile(prompts, 99) == pytest.approx(4142, abs=1)
    assert np.percentile(outputs, 50) == 129
    assert load_azure_trace(CONV_CSV, limit=5) == trace[:5]


def test_small_file_and_bad_rows(tmp_path: Path) -> None:
    good = tmp_path / "t.csv"
    good.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.0000000,10,1\n"
        "\n"
        "2023-11-16 18:15:48,0,7\n"
    )
    trace = load_azure_trace(good)
    assert trace == [
        TraceRequest(0.0, 374, 44),
        TraceRequest(pytest.approx(0.31941), 10, 1),  # type: ignore[arg-type]  # approx equals the parsed float
        TraceRequest(pytest.approx(1.31941), 0, 7),  # type: ignore[arg-type]  # approx equals the parsed float
    ]
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.1,12x,44\n"
    )
    with pytest.raises(TraceError, match=r"line 3: column ContextTokens: '12x'"):
        load_azure_trace(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023 18:15,3,4\n")
    with pytest.raises(TraceError, match="line 2: column TIMESTAMP"):
        load_azure_trace(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,0\n")
    with pytest.raises(TraceError, match="line 2: column GeneratedTokens"):
        load_azure_trace(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(TraceError, match="line 2: column GeneratedTokens: missing"):
        load_azure_trace(bad)
    bad.write_text("TIMESTAMP,Prompt,GeneratedTokens\n")
    with pytest.raises(TraceError, match="missing column 'ContextTokens'"):
        load_azure_trace(bad)
    with pytest.raises(TraceError, match="cannot read"):
        load_azure_trace(tmp_path / "absent.csv")


def test_compress() -> None:
    trace = [TraceRequest(0.0, 1, 1), TraceRequest(10.0, 2, 2), TraceRequest(40.0, 3, 3)]
    out = compress(trace, 4.0)
    assert [r.arrival_s for r in out] == pytest.approx([0.0, 1.0, 4.0])
    assert [r.prompt_tokens for r in out] == [1, 2, 3]
    assert compress(trace[:1], 5.0) == trace[:1]
    with pytest.raises(ValueError, match="duration_s"):
        compress(trace, 0)


def test_synthetic_trace_statistics() -> None:
    trace = synthetic_trace(20000, 5.5, seed=7)
    assert trace == synthetic_trace(20000, 5.5, seed=7)
    arrivals = np.array([r.arrival_s for r in trace])
    gaps = np.diff(arrivals)
    prompts = np.array([r.prompt_tokens for r in trace])
    outputs = np.array([r.output_tokens for r in trace])
    assert arrivals[0] == 0 and np.all(gaps >= 0)
    assert len(trace) / arrivals[-1] == pytest.approx(5.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.094, rel=0.1)
    assert np.percentile(prompts, 50) == pytest.approx(1020, rel=0.05)
    assert np.percentile(prompts, 99) == pytest.approx(4142, rel=0.15)
    assert np.percentile(outputs, 50) == pytest.approx(129, rel=0.1)
    assert prompts.min() >= 0 and outputs.min() >= 1
    poisson = synthetic_trace(20000, 2.0, seed=1, interarrival_cv=1.0)
    g = np.diff([r.arrival_s for r in poisson])
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError, match="rate_per_s"):
        synthetic_trace(10, 0)
    with pytest.raises(ValueError, match="n must"):
        synthetic_trace(-1, 1.0)
    assert synthetic_trace(0, 1.0) == []
