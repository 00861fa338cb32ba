"""The ``alembic`` CLI run from the repository root uses ``HEDGEROW_DATABASE_URL``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hedgerow.controller.store.db import head_revision

REPO = Path(__file__).resolve().parents[2]


def _alembic(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEDGEROW_DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_alembic_cli_upgrade_check_downgrade(tmp_path: Path) -> None:
    if not (REPO / "alembic.ini").is_file():
        pytest.skip("alembic.ini is only in a source checkout")
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    upgraded = _alembic("upgrade", "head", url=url)
    assert upgraded.returncode == 0, upgraded.stderr
    current = _alembic("current", url=url)
    assert f"{head_revision()} (head)" in current.stdout, current.stdout + current.stderr
    checked = _alembic("check", url=url)  # models and migrations agree
    assert checked.returncode == 0, checked.stdout + checked.stderr
    downgraded = _alembic("downgrade", "base", url=url)
    assert downgraded.returncode == 0, downgraded.stderr
    assert "(head)" not in _alembic("current", url=url).stdout
