"""hedgerow: first-token hedged requests for LLM APIs, with thresholds set by measurement.

The package root re-exports the client facade (``hedgerow.client``) so that an app can write
``from hedgerow import HedgingClient, Upstream, HedgePolicy``. The controller, api and sim live in
their own subpackages (``hedgerow.controller``, ``hedgerow.api``, ``hedgerow.sim``).
"""

from hedgerow.client import *  # noqa: F403
from hedgerow.client import __all__ as _client_all

__version__ = "0.1.0"

__all__ = ["__version__", *_client_all]
