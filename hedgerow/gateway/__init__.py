"""``hedgerow gateway``: the hedging race served as an OpenAI-compatible HTTP endpoint.

Any OpenAI client, in any language, hedges by pointing its base URL at the gateway. Each request
goes to ``hedgerow.client.HedgingTransport`` (the library's race, unchanged); this package adds
the configuration file (``load_config``), the ASGI app (``GatewayApp``: auth, limits, routing by
public model name, streaming back with disconnects cancelling the call, OpenAI-shaped errors)
and nothing else. ``hedgerow gateway`` (``hedgerow/cli/gateway.py``) runs it under uvicorn.
"""

from hedgerow.gateway._app import GatewayApp, RecordLog
from hedgerow.gateway._config import ConfigError, GatewayConfig, RouteSpec, is_loopback, load_config, parse_config
from hedgerow.gateway._metrics import GatewayMetrics

__all__ = [
    "ConfigError",
    "GatewayApp",
    "GatewayConfig",
    "GatewayMetrics",
    "RecordLog",
    "RouteSpec",
    "is_loopback",
    "load_config",
    "parse_config",
]
