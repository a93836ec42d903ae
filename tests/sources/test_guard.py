"""The parser's guard: one read query passes, anything else is refused before it is sent."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from bot.sources.guard import QueryRefused, check_query
from bot.sources.scrub import scrub, secrets_of

READS = [
    "SELECT * FROM orders",
    "select customer, sum(amount) from orders group by 1 order by 2 desc limit 5;",
    "WITH t AS (SELECT 1 AS x) SELECT x FROM t",
    "SELECT 1 UNION ALL SELECT 2",
    "(SELECT 1)",
    "SELECT 'a; DELETE FROM orders' AS text",
    "SELECT 1 -- ; DELETE FROM orders",
]
REFUSED = {
    "DELETE FROM orders": "DELETE",
    "delete from orders where id = 1": "DELETE",
    "UPDATE orders SET amount = 0": "UPDATE",
    "INSERT INTO orders VALUES (9)": "INSERT",
    "SELECT 1; DELETE FROM orders": "2 statements",
    "SELECT 1; SELECT 2": "2 statements",
    "WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d": "DELETE",
    "SELECT * INTO copy FROM orders": "INTO",
    "SELECT * FROM orders FOR UPDATE": "FOR UPDATE",
    "DROP TABLE orders": "DROP",
    "TRUNCATE orders": "TRUNCATE",
    "CREATE TABLE x (a int)": "CREATE",
    "COPY orders TO STDOUT": "COPY",
    "SET statement_timeout = 0": "SET",
    "BEGIN": "",
    "VACUUM": "VACUUM",
    "": "empty",
    "  -- only a comment": "empty",
    "SELECT FROM WHERE (": "",
}


@pytest.mark.parametrize("query", READS)
@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_reads_pass(query: str, dialect: str) -> None:
    check_query(query, dialect)


@pytest.mark.parametrize("query", list(REFUSED))
def test_everything_else_is_refused_with_a_reason(query: str) -> None:
    with pytest.raises(QueryRefused) as refused:
        check_query(query, "postgres")
    assert REFUSED[query] in str(refused.value)


def test_sqlite_pragma_and_attach_are_refused() -> None:
    for query in ["PRAGMA writable_schema = 1", "ATTACH DATABASE 'x.db' AS x"]:
        with pytest.raises(QueryRefused):
            check_query(query, "sqlite")


def test_scrub_hides_the_url_and_the_password() -> None:
    url = make_url("postgresql://reader:s3cret-pass@db.internal:5432/shop")
    text = 'connect to "postgresql://reader:s3cret-pass@db.internal:5432/shop" failed: password s3cret-pass; ' \
           "reader:s3cret-pass@db.internal password=s3cret-pass"
    cleaned = scrub(text, secrets_of(url))
    assert "s3cret-pass" not in cleaned and "postgresql://" not in cleaned and "db.internal:5432" not in cleaned
