"""What a PostgreSQL column costs the bot once asyncpg has decoded it, and the codecs that keep it low.

The byte bounds of :mod:`bot.sources.budget` count a result as it arrives on the wire; decoded,
a value may take far more room. Measured as the bot's resident memory through the whole
``sql`` call (decoding, Arrow, Parquet; ``tests/sources/test_wide_rows.py``, a fresh process each):

- asyncpg decodes some types into objects of their own: an ``inet`` with a netmask is 12
  bytes on the wire and an ``ipaddress`` interface of ~325 bytes in Python (10 rows of a
  330,000-element ``inet[]``: +169 MiB; 3,000 rows of 1,500 ``inet`` columns: +175 MiB).
  Those (:data:`TEXT_DECODED`: network addresses, geometric types, bit strings, uuids, …)
  are decoded from their text form instead (:func:`decode_as_text`): one string each, as the
  Parquet file holds them anyway;
- a row of 4 MB of plain values (:func:`expanded` false: text, bytea, json, numbers, bool,
  dates and times, and the types above) raises the bot's memory by ~31 MiB, but 4 MB of an
  array of small values by up to 116 MiB (``text[]`` of one-character strings; ``bytea[]``
  105, ``numeric[]`` 100, ``inet[]`` as text 104): each element is an object of its own.
  So a result with any other column (arrays, composite values, ranges, multiranges,
  ``numeric``, ``interval``, built-in types not listed) is fetched with the row and fetch
  caps divided by :data:`EXPANSION`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

#: How many times the room of a plain value a wire byte of another column may take decoded
#: (measured: 116 MiB for a 4 MB ``text[]`` row against 31 MiB for a 4 MB ``text`` one).
EXPANSION = 4

#: Built-in types decoded from their text form (a ``str``), not into objects of their own.
TEXT_DECODED = (
    "inet",
    "cidr",
    "macaddr",
    "macaddr8",
    "point",
    "line",
    "lseg",
    "box",
    "path",
    "polygon",
    "circle",
    "bit",
    "varbit",
    "tid",
    "uuid",
    "pg_lsn",
    "txid_snapshot",
    "pg_snapshot",
)

#: Built-in scalar types whose values take about their wire size decoded (plus an object each).
_FLAT = frozenset(
    {
        "text",
        "varchar",
        "bpchar",
        "char",
        "name",
        "bytea",
        "json",
        "jsonb",
        "jsonpath",
        "xml",
        "int2",
        "int4",
        "int8",
        "oid",
        "xid",
        "xid8",
        "cid",
        "float4",
        "float8",
        "money",
        "bool",
        "date",
        "time",
        "timetz",
        "timestamp",
        "timestamptz",
        "tsvector",
        "tsquery",
        "regclass",
        "regtype",
        "regproc",
        "regprocedure",
        "regoper",
        "regoperator",
        "regnamespace",
        "regrole",
        "regconfig",
        "regdictionary",
        "regcollation",
        "unknown",
        "void",
        *TEXT_DECODED,
    }
)
#: PostgreSQL's first object id for types made after initdb (enums, extensions' types).
_FIRST_USER_OID = 16384


class ColumnType(Protocol):
    """asyncpg's ``Type`` of a result column (``statement.get_attributes()[i].type``)."""

    oid: int
    name: str
    kind: str


async def decode_as_text(conn: Any) -> None:
    """(The pool's ``init``) have ``conn`` decode :data:`TEXT_DECODED` types from text, arrays of them too."""
    for name in TEXT_DECODED:
        try:
            await conn.set_type_codec(name, schema="pg_catalog", encoder=str, decoder=str, format="text")
        except ValueError:  # "unknown type": an older server without it (pg_snapshot came in 13)
            continue


def expanded(column: ColumnType) -> bool:
    """Whether a column's values may take up to :data:`EXPANSION` times a plain value's room decoded.

    Plain: the built-in scalars listed here, and scalar types made after initdb (enums,
    extensions' types such as ``citext`` or PostGIS's), which asyncpg decodes from text.
    Anything else is not: arrays (a domain over one too: PostgreSQL names its base type),
    composite values and ``record``, ranges and multiranges, ``numeric`` and ``interval``,
    and built-in types not listed."""
    if column.kind != "scalar":
        return True
    return column.oid < _FIRST_USER_OID and column.name not in _FLAT


def expansion(columns: Iterable[ColumnType]) -> int:
    """The factor the row and fetch caps of a result with ``columns`` are divided by (1 or :data:`EXPANSION`)."""
    return EXPANSION if any(expanded(column) for column in columns) else 1
