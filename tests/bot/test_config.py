"""Config loading: interpolation, validation, one-line errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, load_settings, parse_settings

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_loads_with_an_empty_environment() -> None:
    settings = load_settings(REPO / "config.yaml", env={"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"})
    assert settings.llm.base_url == "http://127.0.0.1:11434/v1"
    assert not settings.slack.enabled and not settings.discord.enabled
    assert settings.kernels.preload == ("pandas", "numpy", "matplotlib")


def test_env_interpolation_with_defaults_and_types() -> None:
    settings = parse_settings(
        {
            "llm": {"api_key": "${KEY}", "model": "${MODEL:-gpt-x}", "max_rounds": "${ROUNDS:-3}"},
            "kernels": {"max_kernels": "${MAXK}"},
        },
        env={"KEY": "sk-test", "MAXK": "7"},
    )
    assert settings.llm.api_key.get_secret_value() == "sk-test"
    assert settings.llm.model == "gpt-x"
    assert settings.llm.max_rounds == 3
    assert settings.kernels.max_kernels == 7


def test_secrets_are_not_printed() -> None:
    settings = parse_settings(
        {"llm": {"api_key": "sk-secret-value"}, "slack": {"bot_token": "xoxb-secret", "app_token": "xapp-1"}}, env={}
    )
    assert "sk-secret-value" not in repr(settings)
    assert "xoxb-secret" not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("raw", "env", "expected"),
    [
        (
            {"llm": {"api_key": "${OPENAI_API_KEY}"}},
            {},
            "config: llm.api_key: environment variable OPENAI_API_KEY is not set",
        ),
        ({"kernels": {"max_kernels": 0}}, {}, "config: kernels.max_kernels:"),
        ({"kernels": {"sandbox": "docker"}}, {}, "config: kernels.sandbox:"),
        ({"kernels": {"memory_mb": "${MEM}"}}, {"MEM": "lots"}, "(from environment variable MEM)"),
        ({"llm": {"modle": "x"}}, {}, "config: llm.modle: unknown key"),
        (
            {"llm": {"base_url": "https://api.openai.com/v1", "api_key": ""}},
            {},
            "config: llm.api_key: required for api.openai.com",
        ),
        ({"slack": {"bot_token": "xoxb-1"}}, {}, "config: slack.app_token:"),
        ({"channels": {"C123": {"model": "m"}}}, {}, "config: channels: channel key 'C123'"),
        ({"channels": {"slack:C1": {"data_dir": "/nonexistent/dir"}}}, {}, "config: channels.slack:C1.data_dir:"),
    ],
)
def test_bad_values_name_the_key(raw: dict, env: dict, expected: str) -> None:
    raw = {"llm": {"base_url": "http://127.0.0.1:1/v1"}, **raw} if "llm" not in raw else raw
    with pytest.raises(ConfigError) as caught:
        parse_settings(raw, env=env)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("llm: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)


def test_storage_url_path_and_the_shipped_default() -> None:
    shipped = load_settings(REPO / "config.yaml", env={"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"})
    assert shipped.storage.resolved_url == "sqlite:///data/threadbook.db"
    assert shipped.storage.sqlite_path == Path("data/threadbook.db")
    assert shipped.ops.shutdown_grace_s == 25
    old_style = parse_settings({"llm": {"api_key": "k"}, "storage": {"path": "/srv/tb.db"}}, env={})
    assert old_style.storage.resolved_url == "sqlite:////srv/tb.db"
    pg = parse_settings(
        {"llm": {"api_key": "k"}, "storage": {"url": "${DB}"}}, env={"DB": "postgresql://u:pw-4711@db/tb"}
    )
    assert pg.storage.sqlite_path is None and "pw-4711" not in repr(pg) and "pw-4711" not in str(pg.storage)


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ({"url": "sqlite:///a.db", "path": "b.db"}, "config: storage: set url or path, not both"),
        ({"url": "mysql://u@h/db"}, "config: storage: url must start with sqlite:/// or postgresql://"),
        ({"replica_timeout_s": 0}, "config: storage.replica_timeout_s: Input should be greater than or equal to 1"),
    ],
)
def test_bad_storage_settings_name_the_key(storage: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"llm": {"api_key": "k"}, "storage": storage}, env={})
    assert str(caught.value) == expected
