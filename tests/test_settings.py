"""Settings that the rest of the system would refuse later are refused where they are read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from hedgerow.controller.ops_bounds import budget_range_error
from hedgerow.settings import Settings


@pytest.mark.parametrize("budget", [0.0, 1.0, 1.5, -0.1])
def test_a_default_budget_no_route_could_take_is_refused_with_the_routes_own_sentence(budget: float) -> None:
    # Settings used to accept 0 and 1, and `serve` then failed on the first ingest's route with
    # "budget must be in (0, 1)" naming no variable.
    with pytest.raises(ValidationError) as info:
        Settings(default_budget=budget)
    problem = budget_range_error(budget)
    assert problem is not None and problem in str(info.value)


def test_serve_names_the_variable_of_a_bad_default_budget(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "serve", "--db", f"sqlite:///{tmp_path / 's.db'}", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HEDGEROW_DEFAULT_BUDGET": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2, out.stderr
    assert "HEDGEROW_DEFAULT_BUDGET" in out.stderr and "would let every call hedge" in out.stderr


def test_budgets_inside_the_range_are_taken() -> None:
    assert Settings(default_budget=0.05).default_budget == 0.05
