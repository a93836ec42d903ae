"""Real databases for the data-source tests: an SQLite file and a PostgreSQL database (the
session's server, bench/postgres.py) with a password-carrying reader role."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from bot.sources.settings import SourceSettings

#: The password the tests hunt for everywhere it must not be.
PASSWORD = "Pw-7f3c9e1b2a-hunt-me"

ORDERS_SQL = [
    "CREATE TABLE orders (id integer PRIMARY KEY, customer text, amount numeric(10,2), placed date, paid boolean)",
    "INSERT INTO orders VALUES (1, 'ada', 12.50, '2024-01-05', true), (2, 'bob', 7.25, '2024-01-06', false), "
    "(3, 'ada', 30.00, '2024-02-01', true)",
]


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    """An SQLite file holding the ``orders`` table (3 rows)."""
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        for statement in ORDERS_SQL:
            conn.execute(statement.replace("numeric(10,2)", "real").replace("true", "1").replace("false", "0"))
    return path


@pytest.fixture
def pg_reader_url(pg_url: str) -> str:
    """A PostgreSQL database holding ``orders``, reached as a role with :data:`PASSWORD` that
    may write (so that only the bot's read-only session stops a write)."""

    async def prepare() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            for statement in ORDERS_SQL:
                await conn.execute(statement)
            await conn.execute(
                f"DO $$ BEGIN CREATE ROLE reader LOGIN PASSWORD '{PASSWORD}'; "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
            await conn.execute("GRANT ALL ON orders TO reader")
        finally:
            await conn.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # also from inside a running event loop
        pool.submit(asyncio.run, prepare()).result()
    url = make_url(pg_url).set(username="reader", password=PASSWORD)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def source_settings() -> Callable[..., SourceSettings]:
    """``SourceSettings`` for a URL, with overrides."""

    def make(url: str, **values: object) -> SourceSettings:
        return SourceSettings.model_validate({"url": url, **values})

    return make


async def count_rows(pg_url: str) -> int:
    """Rows in ``orders`` of the PostgreSQL database (as its owner)."""
    conn = await asyncpg.connect(pg_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM orders"))
    finally:
        await conn.close()
