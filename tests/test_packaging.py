"""The install split: ``pip install hedgerow`` is the client alone, ``hedgerow[server]`` the rest.

Checked three ways: the dependency lists in ``pyproject.toml``; a real hedged call by the client
in a Python process where every package of the ``server`` extra fails to import; and (slow) a real
client-only install into a fresh virtual environment, built from a copy of this checkout.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from tests.client.scripted_server import ScriptedServer
from tests.helpers import answer

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: What the client imports from outside the standard library.
CLIENT_DISTRIBUTIONS = {"httpx", "httpcore", "httpx-sse", "orjson"}
#: Import names of the server extra's packages (and what they pull in), none of which the client may need.
SERVER_MODULES = [
    "sqlalchemy",
    "alembic",
    "aiosqlite",
    "asyncpg",
    "apscheduler",
    "scipy",
    "numpy",
    "fastapi",
    "starlette",
    "uvicorn",
    "httptools",
    "uvloop",
    "pydantic",
    "pydantic_settings",
    "typer",
    "rich",
    "jinja2",
    "matplotlib",
    "prometheus_client",
    "cachetools",
    "fastapi_offline",
]

# Run in a child process before anything else: every server module fails to import, as on a
# machine where only the client's distributions are installed.
_BLOCK = f"""
import importlib.abc, sys
BLOCKED = set({SERVER_MODULES!r})
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Absent())
"""

_HEDGED_CALL = """
import asyncio, json, sys
from hedgerow import HedgePolicy, HedgingClient, Upstream

async def main():
    slow, fast = sys.argv[1], sys.argv[2]
    upstreams = [Upstream("a", slow), Upstream("b", fast)]
    async with HedgingClient(upstreams, policy=HedgePolicy(hedge_after_s=0.3)) as client:
        result = await client.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"text": result.text, "winner": result.record.winner,
                      "hedged": result.record.hedged, "loaded": loaded}))

asyncio.run(main())
"""


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement string."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return match.group(0).lower()


def _child_env() -> dict[str, str]:
    """The environment for a child Python that imports this checkout's ``hedgerow``."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_base_dependencies_are_the_clients_alone() -> None:
    project = PYPROJECT["project"]
    assert {_name(r) for r in project["dependencies"]} == CLIENT_DISTRIBUTIONS
    server = {_name(r) for r in project["optional-dependencies"]["server"]}
    assert {"fastapi", "sqlalchemy", "scipy", "numpy", "matplotlib", "typer", "uvicorn"} <= server
    assert not server & CLIENT_DISTRIBUTIONS
    for extra in ("dev", "bench"):  # the README's test command installs the server with the tools
        assert "hedgerow[server]" in project["optional-dependencies"][extra]
    assert project["scripts"]["hedgerow"] == "hedgerow._console:main"


async def test_client_hedges_with_no_server_package_importable() -> None:
    async with ScriptedServer(answer(first_delay_s=5.0)) as slow, ScriptedServer(answer(first_delay_s=0.05)) as fast:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _BLOCK + _HEDGED_CALL,
            slow.base_url,
            fast.base_url,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(),
        )
        out, err = await asyncio.wait_for(child.communicate(), timeout=60)
    assert child.returncode == 0, err.decode()
    result = json.loads(out)
    assert result == {"text": "w0 w1 w2 ", "winner": "backup", "hedged": True, "loaded": []}


def test_the_command_line_names_the_extra_on_a_client_only_install() -> None:
    child = subprocess.run(
        [sys.executable, "-c", _BLOCK + "from hedgerow._console import main; main()", "--help"],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=60,
    )
    assert child.returncode == 2
    assert "Traceback" not in child.stderr
    assert "the command line needs the server extra" in child.stderr
    assert "pip install 'hedgerow[server]'" in child.stderr


@pytest.mark.slow
def test_a_client_only_install_in_a_fresh_venv(tmp_path: Path) -> None:
    """``pip install <checkout>`` into a new venv: the client imports; no server package is there."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "node_modules", ".*cache")
    shutil.copytree(ROOT, source, symlinks=True, ignore=ignore)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        env=clean_env,
        check=True,
    )
    installed = {_name(item["name"]).replace("_", "-") for item in json.loads(listed.stdout)}
    server = {_name(r).replace("_", "-") for r in PYPROJECT["project"]["optional-dependencies"]["server"]}
    assert installed >= CLIENT_DISTRIBUTIONS
    assert not installed & server, f"server packages in a client-only install: {sorted(installed & server)}"
    imported = subprocess.run(
        [str(python), "-c", "from hedgerow import HedgingClient, HedgePolicy, Upstream, HedgingTransport"],
        capture_output=True,
        text=True,
        env=clean_env,
        cwd=tmp_path,
    )
    assert imported.returncode == 0, imported.stderr
    script = subprocess.run(
        [str(env_dir / "bin" / "hedgerow"), "--help"], capture_output=True, text=True, env=clean_env, cwd=tmp_path
    )
    assert script.returncode == 2 and "hedgerow[server]" in script.stderr, script.stderr
