"""A source whose SQLAlchemy dialect or driver is not installed stops start-up with one line
naming the source and what to install or fix, instead of failing every turn that uses it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bot.config import ConfigError, parse_settings
from bot.sources.engine import SourceUnavailable
from bot.sources.registry import Sources
from bot.sources.settings import SourceSettings

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pw-never-in-an-error"
LLM = {"base_url": "http://127.0.0.1:9/v1"}


def test_the_drivers_these_tests_count_on_are_not_installed() -> None:
    for module in ("MySQLdb", "pymysql", "pyodbc"):
        with pytest.raises(ImportError):
            __import__(module)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            f"mysql://u:{SECRET}@db/shop",
            "the mysql driver 'mysqldb' is not installed (no module 'MySQLdb'): pip install mysqlclient",
        ),
        (f"mysql+pymysql://u:{SECRET}@db/shop", "pip install PyMySQL"),
        (f"mssql+pyodbc://u:{SECRET}@db/shop", "pip install pyodbc"),
        (f"duckdb:///{SECRET}.db", "SQLAlchemy has no dialect 'duckdb': fix the URL's scheme"),
        (f"postgresql+nosuchdriver://u:{SECRET}@db/shop", None),  # asyncpg serves PostgreSQL, whatever the URL names
        ("sqlite:///shop.db", None),
    ],
)
def test_reading_the_config_loads_each_sources_driver(url: str, says: str | None) -> None:
    raw = {"sources": {"shop": {"url": url}}, "channels": {"slack:C1": {"sources": ["shop"]}}, "llm": LLM}
    if says is None:
        assert parse_settings(raw, env={}).sources["shop"].url.get_secret_value() == url
        return
    with pytest.raises(ConfigError) as failed:
        parse_settings(raw, env={})
    line = str(failed.value)
    assert line.startswith("config: sources.shop.url: ") and says in line, line
    assert "\n" not in line and SECRET not in line


def test_the_sources_are_made_when_the_bot_starts_not_in_a_turn(tmp_path: Path) -> None:
    good = SourceSettings.model_validate({"url": f"sqlite:///{tmp_path / 'shop.db'}"})
    missing = SourceSettings.model_validate({"url": f"mysql://u:{SECRET}@db/shop"})
    with pytest.raises(SourceUnavailable, match=r"^sources\.warehouse\.url: .*pip install mysqlclient") as failed:
        Sources({"shop": good, "warehouse": missing})
    assert SECRET not in str(failed.value)
    assert Sources({"shop": good}).get("shop").dialect == "sqlite"  # made, not connected: the file need not exist


def test_the_bot_exits_2_with_one_line_naming_the_source(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    sources = {"shop": {"url": "mysql://reader:${SHOP_PW}@db/shop"}}
    config.write_text(yaml.safe_dump({"llm": LLM, "sources": sources}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "bot", "run", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "SHOP_PW": SECRET},
    )
    assert done.returncode == 2, done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("config: sources.shop.url: the mysql driver"), said
    assert "pip install mysqlclient" in said[0] and SECRET not in done.stderr
