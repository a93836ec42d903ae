"""One read query, or refused before anything is sent to the database.

The query is parsed with sqlglot in the source's dialect; what passes is exactly one
statement whose root is a ``SELECT`` (a ``WITH … SELECT``, a ``UNION``/``INTERSECT``/
``EXCEPT`` of them, or one in parentheses) holding no data-changing, locking or session
part anywhere (a ``DELETE … RETURNING`` in a ``WITH``, ``SELECT … INTO``, ``FOR UPDATE``),
and calling only functions on the allow-list of :mod:`bot.sources.functions` (a ``SELECT`` can
write through a function: ``lo_from_bytea``, ``dblink_exec``). What the parser cannot read is
refused too. This is the first of three walls: the database session is read-only as well
(with ``statement_timeout``), and the drivers used send one statement only (PostgreSQL's
extended protocol, ``sqlite3``'s ``execute``).
"""

from __future__ import annotations

import logging
import re

import sqlglot
from sqlglot import expressions as exp
from sqlglot.errors import SqlglotError

from bot.sources.functions import refusal

#: SQLAlchemy dialect name → sqlglot dialect (others are parsed as generic SQL).
_DIALECTS = {
    "postgresql": "postgres",
    "sqlite": "sqlite",
    "mysql": "mysql",
    "mariadb": "mysql",
    "mssql": "tsql",
    "oracle": "oracle",
    "duckdb": "duckdb",
    "snowflake": "snowflake",
    "bigquery": "bigquery",
    "redshift": "redshift",
    "trino": "trino",
    "clickhouse": "clickhouse",
}
# sqlglot's "falling back to Command" warnings are ours to act on (set once, not per query).
logging.getLogger("sqlglot").setLevel(logging.ERROR)

_READ_ROOTS = (exp.Select, exp.SetOperation, exp.Subquery)
#: Anywhere in the tree, any of these makes the query more than a read.
_FORBIDDEN = (
    exp.DML,  # INSERT, UPDATE, DELETE, MERGE, COPY (also inside a WITH)
    exp.Into,
    exp.Lock,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.TruncateTable,
    exp.Command,
    exp.Pragma,
    exp.Set,
    exp.Transaction,
    exp.Commit,
    exp.Rollback,
    exp.Grant,
    exp.Use,
    exp.Attach,
    exp.Detach,
    exp.LoadData,
)


class QueryRefused(Exception):
    """The query is not a single read; the message says why, for the model."""


def sqlglot_dialect(sqlalchemy_dialect: str) -> str:
    """The sqlglot dialect for an SQLAlchemy dialect name (``""``: generic SQL)."""
    return _DIALECTS.get(sqlalchemy_dialect, "")


def check_query(query: str, dialect: str) -> None:
    """Raise :class:`QueryRefused` unless ``query`` is one read-only query in ``dialect`` (sqlglot's name).

    Blocking (parsing a long query takes a while): call it from a worker thread."""
    if not query.strip():
        raise QueryRefused("the query is empty")
    try:
        statements = [s for s in sqlglot.parse(query, read=dialect or None) if s is not None]
    except SqlglotError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise QueryRefused(f"it could not be parsed as one SQL query ({first[:300]})") from None
    if not statements:
        raise QueryRefused("the query is empty")
    if len(statements) > 1:
        raise QueryRefused(f"it holds {len(statements)} statements; send one SELECT at a time")
    statement = statements[0]
    if not isinstance(statement, _READ_ROOTS) or (
        isinstance(statement, exp.Subquery) and not isinstance(statement.unnest(), _READ_ROOTS)
    ):
        raise QueryRefused(f"it is {_kind(statement)}, not a SELECT; only reads are run")
    found = statement.find(*_FORBIDDEN)
    if found is not None:
        raise QueryRefused(f"it contains {_kind(found)}; only reads are run")
    calls = refusal(statement, dialect)
    if calls is not None:
        raise QueryRefused(calls)
    if dialect == "duckdb" and (path := _file_table(statement)) is not None:
        raise QueryRefused(f"it reads {path!r} as a table, which DuckDB takes from a file; only tables are read")


#: A table name DuckDB reads as a file (a replacement scan): a path, a URL, a glob, a data file's name.
_FILE_LIKE = re.compile(
    r"[/\\:*?]|\.(csv|tsv|txt|parquet|json|jsonl|ndjson|xlsx?|gz|zst|bz2|lz4|xz|arrow|avro|db)$", re.IGNORECASE
)


def _file_table(statement: exp.Expr) -> str | None:
    """The first table whose name DuckDB would read as a file, if any. DuckDB joins a qualified
    name's parts with dots before it looks for a file (``FROM sales.csv`` reads ``sales.csv``),
    so each part and the joined name are looked at."""
    for table in statement.find_all(exp.Table):
        names = [part.name if isinstance(part, exp.Identifier | exp.Literal) else "" for part in table.parts]
        for name in [*names, ".".join(names)]:
            if _FILE_LIKE.search(name):
                return name
    return None


def _kind(node: exp.Expr) -> str:
    """``DELETE``, ``SELECT … INTO``, ``FOR UPDATE``: what a node is, in SQL words."""
    if isinstance(node, exp.Into):
        return "SELECT … INTO (it creates a table)"
    if isinstance(node, exp.Lock):
        return "a locking clause (FOR UPDATE/SHARE)"
    if isinstance(node, exp.Command):
        return f"a {str(node.this).upper() or 'command'}"
    return "a " + node.key.upper().replace("TABLE", " TABLE").strip()
