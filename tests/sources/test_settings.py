"""The ``sources`` config keys and the channel grants."""

from __future__ import annotations

import pytest

from bot.config import ConfigError, parse_settings

SECRET = "pw-never-in-an-error"


def test_sources_and_grants_are_read_with_their_defaults() -> None:
    settings = parse_settings(
        {
            "sources": {"warehouse": {"url": "postgresql://u:${PW}@db/shop", "description": "Shop"}},
            "channels": {"slack:C1": {"sources": ["warehouse"]}},
            "llm": {"base_url": "http://127.0.0.1:9/v1"},
        },
        env={"PW": SECRET},
    )
    source = settings.sources["warehouse"]
    assert source.url.get_secret_value() == f"postgresql://u:{SECRET}@db/shop"
    assert (source.statement_timeout_s, source.max_rows, source.max_concurrent) == (30, 100_000, 4)
    assert settings.policy_for("slack:C1").sources == ("warehouse",)
    assert settings.policy_for("slack:C2").sources == ()
    assert SECRET not in repr(settings) and SECRET not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"channels": {"slack:C1": {"sources": ["nope"]}}}, "channels.slack:C1.sources names 'nope'"),
        ({"sources": {"bad name": {"url": "sqlite:///x.db"}}}, "config: sources: source name 'bad name'"),
        ({"sources": {"w": {"url": f"not a url {SECRET}"}}}, "sources.w.url: must be an SQLAlchemy URL"),
        ({"sources": {"w": {"url": "sqlite:///x.db", "max_rows": 0}}}, "sources.w.max_rows"),
        ({"sources": {"w": {"url": "sqlite://"}}}, "sources.w.url: an SQLite source needs a file"),
        ({"sources": {"w": {"url": "sqlite:///x.db", "password": SECRET}}}, "sources.w.password: unknown key"),
    ],
)
def test_a_bad_source_stops_start_up_with_one_line(raw: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError) as failed:
        parse_settings({**raw, "llm": {"base_url": "http://127.0.0.1:9/v1"}}, env={})
    assert names in str(failed.value) and SECRET not in str(failed.value)
