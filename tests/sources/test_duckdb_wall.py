"""A DuckDB source connects with external access off and its configuration locked, whatever its
URL says: DuckDB's own wall behind the guard's refusal of tables named like files.

duckdb and duckdb_engine are not installed here: a stand-in SQLAlchemy dialect named ``duckdb``
(SQLite underneath) takes ``connect_args`` and the URL's query exactly as duckdb_engine's
``Dialect.create_connect_args``/``connect`` do (the URL's keys override ``config``) and records
the ``config`` that would reach ``duckdb.connect``."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import URL

from bot.sources.engine import DUCKDB_CONFIG, SyncSource, open_source
from bot.sources.settings import SourceSettings

#: The ``config`` each connection of the stand-in was given, in order.
CONNECTED: list[dict[str, Any]] = []


class StandInDuckDB(SQLiteDialect_pysqlite):
    """duckdb_engine's handling of ``config`` (``duckdb_engine/__init__.py``), over SQLite."""

    name = "duckdb"
    driver = "standin"

    def create_connect_args(self, url: URL) -> Any:
        options: dict[str, Any] = url.translate_connect_args(database="database")
        options["url_config"] = dict(url.query)
        return (), options

    def connect(self, *cargs: Any, **cparams: Any) -> Any:
        config = dict(cparams.get("config", {}))
        config.update(cparams.pop("url_config", {}))
        CONNECTED.append(config)
        return sqlite3.connect(cparams["database"], check_same_thread=False)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.impls, "duckdb.standin", lambda: StandInDuckDB)
    CONNECTED.clear()


async def test_a_duckdb_source_connects_with_external_access_off(
    standin: None, tmp_path: Path, source_settings: Callable[..., SourceSettings]
) -> None:
    path = tmp_path / "shop.duckdb"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id integer)")
    # An operator's URL asking for the opposite does not undo it.
    url = f"duckdb+standin:///{path}?enable_external_access=true&lock_configuration=false&threads=2"
    source = open_source("lake", source_settings(url))
    try:
        assert isinstance(source, SyncSource) and source.dialect == "duckdb"
        assert [t.table for t in await source.tables()] == ["orders"]
    finally:
        await source.close()
    assert CONNECTED and all(
        config == {"enable_external_access": False, "lock_configuration": True, "threads": "2"} for config in CONNECTED
    ), CONNECTED
    assert DUCKDB_CONFIG == {"enable_external_access": False, "lock_configuration": True}
