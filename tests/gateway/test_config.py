"""The gateway's configuration file: a good file resolves into routes; each kind of mistake is one
``ConfigError`` naming the file, the key path and the problem, and never a key's value."""

from __future__ import annotations

from pathlib import Path

import pytest

from hedgerow.gateway import ConfigError, is_loopback, load_config, parse_config

GOOD = """
keys = ["team-a=gw-aaaaaaaaaaaaaaaaaaaa"]
max_body_bytes = 65536
max_concurrent_per_key = 4

[models."gpt-fast"]
route = "chat-fast"
hedge_after_s = 1
budget = 0.2
stall_timeout_s = 30

[[models."gpt-fast".upstreams]]
name = "east"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "EAST_KEY"
model = "east-model"
headers = { "OpenAI-Organization" = "org-1" }

[[models."gpt-fast".upstreams]]
name = "west"
base_url = "http://127.0.0.1:10/v1"
"""


def test_a_good_file_resolves(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(GOOD)
    config = load_config(
        path, {"EAST_KEY": "sk-east-0123456789", "HEDGEROW_GATEWAY_KEYS": "ops=gw-bbbbbbbbbbbbbbbbbbbb"}
    )
    spec = config.routes["gpt-fast"]
    assert spec.route == "chat-fast"
    assert [u.name for u in spec.upstreams] == ["east", "west"]
    east = spec.upstreams[0]
    assert (east.api_key, east.model, dict(east.headers or {})) == (
        "sk-east-0123456789",
        "east-model",
        {"OpenAI-Organization": "org-1"},
    )
    assert spec.upstreams[1].api_key is None and spec.upstreams[1].model is None
    assert (spec.policy.hedge_after_s, spec.policy.budget, spec.policy.stall_timeout_s) == (1.0, 0.2, 30.0)
    assert config.keys == {"gw-aaaaaaaaaaaaaaaaaaaa": "team-a", "gw-bbbbbbbbbbbbbbbbbbbb": "ops"}
    assert config.max_body_bytes == 65536
    assert (config.max_concurrent, config.max_concurrent_per_key) == (256, 4)
    assert "sk-east-0123456789" in config.secrets


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ('base_url = "http://127.0.0.1:10/v1"', 'base_url = "ftp://x"'),
            "gateway.toml: models.gpt-fast.upstreams[1].base_url: must be an http(s) URL, got 'ftp://x'",
        ),
        (("budget = 0.2", "budget = 2"), "gateway.toml: models.gpt-fast.budget: must be a fraction in [0, 1], got 2"),
        (("budget = 0.2", "budgt = 0.2"), "gateway.toml: models.gpt-fast.budgt: unknown key"),
        (('name = "west"', 'name = "east"'), "gateway.toml: models.gpt-fast.upstreams[1].name: 'east' is used"),
        (("hedge_after_s = 1", 'hedge_after_s = "1"'), "gateway.toml: models.gpt-fast.hedge_after_s: "),
        (('route = "chat-fast"', 'route = "x/history"'), "gateway.toml: models.gpt-fast.route: "),
        (
            ("max_body_bytes = 65536", "max_body_bytes = 65536\nmodels.other.upstreams = []"),
            "gateway.toml: models.other.upstreams: List should have at least 1 item",
        ),
        (('keys = ["team-a=gw-aaaaaaaaaaaaaaaaaaaa"]', 'keys = ["team-a=short"]'), "gateway.toml: keys[0]: the key of"),
        (
            ('keys = ["team-a=gw-aaaaaaaaaaaaaaaaaaaa"]', 'keys = ["team a=gw-aaaaaaaaaaaaaaaaaaaa"]'),
            "gateway.toml: keys[0]: the name 'team a' must be up to 64 letters, digits and _.-",
        ),
        (
            ("max_concurrent_per_key = 4", "max_concurrent_per_key = 0"),
            "gateway.toml: max_concurrent_per_key: Input should be greater than or equal to 1",
        ),
        (('[models."gpt-fast"]', '[models."gpt fast"'), "gateway.toml: not valid TOML: "),
    ],
)
def test_each_mistake_names_the_file_and_key_path(edit: tuple[str, str], expected: str) -> None:
    text = GOOD.replace(*edit, 1)
    with pytest.raises(ConfigError) as raised:
        parse_config(text, "gateway.toml", {"EAST_KEY": "sk-east-0123456789"})
    assert str(raised.value).startswith(expected), str(raised.value)


def test_a_missing_environment_variable_is_named_and_no_key_is_printed() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(GOOD, "gateway.toml", {})
    assert str(raised.value) == (
        "gateway.toml: models.gpt-fast.upstreams[0].api_key_env: the environment variable EAST_KEY is not set"
    )
    bad_keys = {"EAST_KEY": "sk-east-0123456789", "HEDGEROW_GATEWAY_KEYS": "ops=tiny-secret"}
    with pytest.raises(ConfigError) as raised:
        parse_config(GOOD, "gateway.toml", bad_keys)
    assert "tiny-secret" not in str(raised.value)
    assert str(raised.value).startswith("HEDGEROW_GATEWAY_KEYS[0]: the key of 'ops'")


def test_no_models_and_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^g\.toml: models: required$"):
        parse_config("", "g.toml", {})
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read"):
        load_config(tmp_path / "nope.toml")


def test_dotted_model_names_are_quoted_in_paths() -> None:
    text = GOOD.replace('"gpt-fast"', '"gpt-4.1"').replace("budget = 0.2", "budget = -1")
    with pytest.raises(ConfigError, match=r'^gateway\.toml: models\."gpt-4\.1"\.budget: '):
        parse_config(text, "gateway.toml", {"EAST_KEY": "k"})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
