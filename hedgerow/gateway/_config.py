"""The gateway's configuration: a TOML file, validated, resolved into routes of ``Upstream``\\ s.

The file (read with ``tomllib``, checked with pydantic)::

    keys = ["team-a=gw-0123456789abcdef"]   # optional: NAME=KEY pairs (or HEDGEROW_GATEWAY_KEYS)
    max_body_bytes = 4194304                 # optional: largest request body (default 4 MiB)
    max_concurrent = 256                     # optional: requests in flight at once (default 256)
    max_concurrent_per_key = 32              # optional: requests in flight at once per key name

    [models."gpt-fast"]                      # the public model name callers send
    route = "chat-fast"                      # optional: the route of its records (default: the name)
    hedge_after_s = 1.0                      # optional policy settings (HedgePolicy defaults)
    budget = 0.1
    max_backups = 1
    stall_timeout_s = 30
    total_timeout_s = 120

    [[models."gpt-fast".upstreams]]          # in preference order: the first is the primary
    name = "east"
    base_url = "https://east.example/v1"
    api_key_env = "EAST_API_KEY"             # the NAME of the environment variable holding the key
    model = "gpt-4o-mini"                    # optional: this upstream's own name for the model
    headers = { "OpenAI-Organization" = "org-1" }

Every error is one ``ConfigError`` whose message names the file, the key path and the problem
(``gateway.toml: models.gpt-fast.upstreams[1].base_url: must be an http(s) URL, got 'x'``); a
missing environment variable is named, its value never is. Keys (upstream and gateway) appear in
no message.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.client.names import model_name_error, route_name_error

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONCURRENT",
    "KEYS_ENV",
    "ConfigError",
    "GatewayConfig",
    "RouteSpec",
    "is_loopback",
    "load_config",
    "parse_keys",
]

#: Default bound on a request body, bytes (4 MiB: a long chat history with images is well under).
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Default bound on requests in flight at once (streamed or not).
DEFAULT_MAX_CONCURRENT = 256
#: The environment variable with the gateway's own keys (``NAME=KEY,NAME=KEY``).
KEYS_ENV = "HEDGEROW_GATEWAY_KEYS"
#: Fewest characters of a gateway key (a short key is guessed).
MIN_KEY_CHARS = 16
#: A gateway key's name (the caller's name in records and metric labels): letters, digits, ``_.-``.
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class ConfigError(ValueError):
    """The gateway's configuration is wrong; the message names where (file and key path) and what."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _UpstreamIn(_Strict):
    name: str = Field(min_length=1)
    base_url: str
    api_key_env: str | None = Field(None, min_length=1)
    model: str | None = Field(None, min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)


class _ModelIn(_Strict):
    route: str | None = None
    upstreams: list[_UpstreamIn] = Field(min_length=1)
    hedge_after_s: float | None = None
    budget: float | None = None
    max_backups: int | None = None
    stall_timeout_s: float | None = None
    total_timeout_s: float | None = None


class _FileIn(_Strict):
    keys: list[str] = Field(default_factory=list)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024)
    max_concurrent: int = Field(DEFAULT_MAX_CONCURRENT, ge=1)
    max_concurrent_per_key: int | None = Field(None, ge=1)
    models: dict[str, _ModelIn] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """One public model (or, with ``public_model`` None, any model) and where it goes.

    Attributes:
        public_model: the model name callers send; None = every model, passed through as is.
        route: the route of the calls' records (thresholds are per (route, public model)).
        upstreams: the endpoints in preference order, keys applied.
        policy: the route's ``HedgePolicy``.
    """

    public_model: str | None
    route: str
    upstreams: tuple[Upstream, ...]
    policy: HedgePolicy


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The resolved configuration of one gateway.

    Attributes:
        routes: public model name -> its ``RouteSpec``.
        any_model: the route of every model when the gateway passes model names through (the
            CLI's ``--upstream`` without ``--model``), else None.
        keys: gateway key -> the key's name (empty: no key needed, loopback only); the name is
            the caller's name in the records (``client``) and in the metrics (``key``). Keys of
            the file and of ``HEDGEROW_GATEWAY_KEYS``, and the ``hedgerow gateway`` CLI adds the
            tokens of ``HEDGEROW_TOKENS`` with the ``gateway`` scope.
        max_body_bytes: largest request body accepted, bytes.
        max_concurrent: most requests in flight at once.
        max_concurrent_per_key: most requests in flight at once with keys of one name (None: no
            bound but ``max_concurrent``; only with keys).
        source: where the configuration came from (a file name, or ``--upstream``), for messages.
    """

    routes: Mapping[str, RouteSpec]
    any_model: RouteSpec | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    max_concurrent_per_key: int | None = None
    source: str = "config"

    def __post_init__(self) -> None:
        if not self.routes and self.any_model is None:
            raise ConfigError(f"{self.source}: no model is configured")
        if self.max_concurrent_per_key is not None and self.max_concurrent_per_key < 1:
            raise ConfigError(
                f"{self.source}: max_concurrent_per_key must be 1 or more, got {self.max_concurrent_per_key}"
            )

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every key the gateway holds (upstream and gateway keys): never to be logged or sent."""
        found = {u.api_key for spec in self.specs for u in spec.upstreams if u.api_key}
        found.update(self.keys)
        return tuple(sorted(found, key=len, reverse=True))

    @property
    def specs(self) -> tuple[RouteSpec, ...]:
        """Every route spec, the any-model one last."""
        extra = (self.any_model,) if self.any_model is not None else ()
        return (*self.routes.values(), *extra)


def key_path(loc: Sequence[Any]) -> str:
    """A pydantic error location as a TOML-ish key path: ``models.gpt-fast.upstreams[1].base_url``
    (a key with a dot, a space or a quote is written quoted, ``models."gpt-4.1"``)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
            continue
        name = str(part)
        if not name or any(c in name for c in '. "[]='):
            name = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
        text += f".{name}" if text else name
    return text


def parse_keys(entries: Sequence[str], where: str) -> dict[str, str]:
    """``NAME=KEY`` entries -> {key: name}.

    Args:
        entries: the pairs (from the file's ``keys`` or ``HEDGEROW_GATEWAY_KEYS`` split on commas).
        where: what to name in an error (``gateway.toml: keys`` or ``HEDGEROW_GATEWAY_KEYS``).

    Raises:
        ConfigError: an entry without ``=``, an empty or repeated name, a name other than up to 64
            letters, digits and ``_.-``, a key shorter than 16 characters or with whitespace (the
            key itself is never in the message).
    """
    keys: dict[str, str] = {}
    names: set[str] = set()
    for index, entry in enumerate(entries):
        name, sep, key = entry.partition("=")
        name = name.strip()
        label = f"{where}[{index}]"
        if not sep or not name:
            raise ConfigError(f"{label}: expected NAME=KEY")
        if not KEY_NAME.fullmatch(name):
            raise ConfigError(
                f"{label}: the name {name!r} must be up to 64 letters, digits and _.- (a letter or digit first)"
            )
        if len(key) < MIN_KEY_CHARS or key != key.strip() or any(c.isspace() for c in key):
            raise ConfigError(f"{label}: the key of {name!r} must be {MIN_KEY_CHARS} or more characters without spaces")
        if name in names:
            raise ConfigError(f"{label}: the name {name!r} is given twice")
        names.add(name)
        keys[key] = name
    return keys


def keys_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The gateway keys of ``HEDGEROW_GATEWAY_KEYS`` (comma-separated ``NAME=KEY``), {} when unset.

    Raises:
        ConfigError: as ``parse_keys``, naming the variable.
    """
    text = environ.get(KEYS_ENV, "").strip()
    if not text:
        return {}
    return parse_keys([part.strip() for part in text.split(",") if part.strip()], KEYS_ENV)


def build_policy(where: str, values: Mapping[str, Any], base: HedgePolicy | None = None) -> HedgePolicy:
    """A ``HedgePolicy`` from the settings given (the others from ``base``, else the defaults).

    Raises:
        ConfigError: naming ``where`` and the field (``models.x.budget: must be a fraction ...``).
    """
    given = {k: v for k, v in values.items() if v is not None}
    if given.get("budget") == 0:
        given["budget_burst"] = 0  # budget 0 turns hedging off, also its initial burst
    try:
        if base is None:
            return HedgePolicy(**given)
        from dataclasses import replace

        return replace(base, **given)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        field_name, sep, rest = message.partition(":")
        if sep and field_name.startswith("HedgePolicy."):
            raise ConfigError(f"{where}.{field_name.removeprefix('HedgePolicy.')}:{rest}") from None
        raise ConfigError(f"{where}: {message}") from None


def _resolve_model(source: str, public: str, model: _ModelIn, environ: Mapping[str, str]) -> RouteSpec:
    where = f"{source}: {key_path(['models', public])}"
    problem = model_name_error(public)
    if problem is not None:
        raise ConfigError(f"{where}: the model name {problem}")
    route = model.route if model.route is not None else public
    problem = route_name_error(route) or route_name_error(f"{route}.unary")
    if problem is not None:
        raise ConfigError(f"{where}.route: {problem}")
    upstreams: list[Upstream] = []
    for index, up in enumerate(model.upstreams):
        at = f"{where}.upstreams[{index}]"
        if up.name in {u.name for u in upstreams}:
            raise ConfigError(f"{at}.name: {up.name!r} is used by another upstream of this model")
        key: str | None = None
        if up.api_key_env is not None:
            key = environ.get(up.api_key_env)
            if not key:
                raise ConfigError(f"{at}.api_key_env: the environment variable {up.api_key_env} is not set")
        try:
            upstreams.append(Upstream(up.name, up.base_url, api_key=key, headers=up.headers or None, model=up.model))
        except ValueError as exc:
            field_name, _, rest = str(exc).partition(":")
            raise ConfigError(f"{at}.{field_name.removeprefix('Upstream.')}:{rest}") from None
    settings = model.model_dump(exclude={"route", "upstreams"})
    for name, value in settings.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}.{name}: must be a finite number, got {value!r}")
    return RouteSpec(public, route, tuple(upstreams), build_policy(where, settings))


def parse_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate a configuration file's text and resolve it.

    Args:
        text: the TOML text.
        source: the file's name, at the head of every error message.
        environ: where ``api_key_env`` and ``HEDGEROW_GATEWAY_KEYS`` are looked up (default
            ``os.environ``).

    Returns:
        The ``GatewayConfig``. Gateway keys from the file and from ``HEDGEROW_GATEWAY_KEYS`` are
        both accepted.

    Raises:
        ConfigError: the first problem, as ``source: key.path: what``.
    """
    env = os.environ if environ is None else environ
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        parsed = _FileIn.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = key_path(error["loc"]) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required"
        raise ConfigError(f"{source}: {path}: {message}") from None
    routes = {public: _resolve_model(source, public, model, env) for public, model in parsed.models.items()}
    keys = parse_keys(parsed.keys, f"{source}: keys")
    keys.update(keys_from_env(env))
    return GatewayConfig(
        routes=routes,
        keys=keys,
        max_body_bytes=parsed.max_body_bytes,
        max_concurrent=parsed.max_concurrent,
        max_concurrent_per_key=parsed.max_concurrent_per_key,
        source=source,
    )


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and resolve a configuration file (see the module docstring for its keys).

    Raises:
        ConfigError: the file cannot be read, or any problem in it (file and key path named).
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    return parse_config(text, name, environ)


def is_loopback(host: str) -> bool:
    """True when ``host`` (an interface to bind) is a loopback address or ``localhost``."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
