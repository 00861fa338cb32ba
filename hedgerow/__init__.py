"""hedgerow: first-token hedged requests for LLM APIs, with thresholds set by measurement.

The package root re-exports the client facade (``hedgerow.client``) so that an app can write
``from hedgerow import HedgingClient, Upstream, HedgePolicy``. The controller, api and sim live in
their own subpackages (``hedgerow.controller``, ``hedgerow.api``, ``hedgerow.sim``).

The client's names are loaded on first use (PEP 562): a command such as ``hedgerow serve
--help`` or a subpackage import does not pay for importing httpx and the client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hedgerow.client import *  # noqa: F403

__version__ = "0.1.0"


def _client_names() -> list[str]:
    names: list[str] = importlib.import_module("hedgerow.client").__all__
    return names


def __getattr__(name: str) -> Any:
    """The client facade's ``name`` (and ``__all__``), imported on first use (PEP 562)."""
    if name == "__all__":
        return ["__version__", *_client_names()]
    if not name.startswith("__") and name in _client_names():
        value = getattr(importlib.import_module("hedgerow.client"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hedgerow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({"__version__", *_client_names(), *globals()})
